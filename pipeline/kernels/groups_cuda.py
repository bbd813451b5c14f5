"""CUDA kernels of :mod:`pipeline.kernels.groups` (imported on first GPU use; ``cuda`` must be a
global of this module for Numba's CUDA simulator)."""

from ._numba_cuda import cuda

from .groups import _group_runs_column, make_group_spells_column, make_group_sum_column

_sum_column = make_group_sum_column(cuda.jit(device=True))
_spells_column = make_group_spells_column(cuda.jit(device=True))
_runs_column = cuda.jit(device=True)(_group_runs_column)


@cuda.jit
def group_sum(x, labels, threshold, mode, sums, counts):
    p = cuda.grid(1)
    if p < x.shape[1]:
        _sum_column(x, labels, threshold, mode, sums, counts, p)


@cuda.jit
def group_spells(x, labels, threshold, best, lead, tail, tail_group):
    p = cuda.grid(1)
    if p < x.shape[1]:
        _spells_column(x, labels, threshold, best, lead, tail, tail_group, p)


@cuda.jit
def group_runs(x, labels, threshold, length, prefix, current, longest):
    p = cuda.grid(1)
    if p < x.shape[1]:
        _runs_column(x, labels, threshold, length, prefix, current, longest, p)
