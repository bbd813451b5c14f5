"""CUDA kernel of :mod:`pipeline.kernels.moments` (imported on first GPU use)."""

from ._numba_cuda import cuda
from .moments import make_moments_column

_column = make_moments_column(cuda.jit(device=True))


@cuda.jit
def moments(x, n, mean, m2):
    """One thread per grid point; a warp reads 32 neighbouring points of one step (coalesced)."""
    p = cuda.grid(1)
    if p < x.shape[1]:
        _column(x, n, mean, m2, p)
