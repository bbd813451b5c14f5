"""The CUDA kernel of :mod:`pipeline.kernels.rolling`, in a module of its own so that importing
the package never imports ``numba.cuda`` (this module is imported on first GPU use), and so that
Numba's CUDA simulator finds ``cuda`` among the kernel's globals."""

from ._numba_cuda import cuda

from .rolling import _rolling_mean_column_loop

_column = cuda.jit(device=True)(_rolling_mean_column_loop)


@cuda.jit
def rolling_mean_2d(x, out, before, after, min_periods):
    """One thread per grid point; a warp reads 32 neighbouring points of one time step, so every
    load is coalesced."""
    p = cuda.grid(1)
    if p < x.shape[1]:
        _column(x, out, before, after, min_periods, p)
