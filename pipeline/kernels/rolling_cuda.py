"""The CUDA kernel of :mod:`pipeline.kernels.rolling`, in a module of its own so that importing
the package never imports ``numba.cuda`` (this module is imported on first GPU use), and so that
Numba's CUDA simulator finds ``cuda`` among the kernel's globals."""

from ._numba_cuda import cuda

from .rolling import make_rolling_column

_column = make_rolling_column(cuda.jit(device=True))


@cuda.jit
def rolling_mean_2d(x, out, before, after, min_periods):
    """One thread per grid point; a warp reads 32 neighbouring points of one time step, so every
    load is coalesced."""
    p = cuda.grid(1)
    if p < x.shape[1]:
        _column(x, out, before, after, min_periods, p)
