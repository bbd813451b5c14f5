"""Alternate allele counts of genotype calls, in one pass over the genotypes.

``alternate_allele_count``: for each call of a ``(variants, samples, ploidy)`` block of integer
genotypes, the number of its alleles that are alternate (``1 <= a < n_alleles``), or -1 where any
of its alleles is missing (negative: -1 for a missing allele, -2 for fill), as int16. This is
sgkit's ``count_call_alternate_alleles`` (the allele counts of ``count_call_alleles`` summed over
the alternate alleles, cast to int16, and -1 where ``call_genotype_mask`` has any allele of the
call masked), computed from the genotypes alone: VCF Zarr's and sgkit's ``call_genotype_mask``
is ``call_genotype < 0``, so the int8 genotypes are read once and the mask not at all.

The CPU kernel is a Numba loop over the calls of the per-call step (:func:`make_call_count`);
the GPU kernel is CUDA C (``pipeline_alternate_counts`` in ``cuda/calls.cu``, launched by
:func:`pipeline.kernels.genotypes.per_call_gpu`), the same comparisons, with no ``numba.cuda`` to
import. Both give the same integers (the GPU tests compare them).

The GPU kernel is memory-bound: 2 bytes read and 2 written per diploid call. Each thread takes
``CALL_UNROLL`` calls a grid's width apart (so a warp's loads of one step are contiguous), loads all
of their alleles before it writes any count, so that it has several independent loads in flight
rather than one (see :mod:`pipeline.kernels.launch`, streaming kernels), and the ploidy is a
compile-time constant, so the loop over a call's alleles is unrolled.
"""

from __future__ import annotations

import numpy as np

from . import launch

NO_ALLELE_LIMIT = np.iinfo(np.int64).max  # n_alleles when a dataset has no alleles dimension


def make_call_count(jit, ploidy: int):
    """The per-call step compiled by ``jit`` (``launch.cpu_jit``):
    ``count(g, n_alleles, i)`` for the call ``g[i, :]`` of a (calls, ploidy) array."""

    @jit
    def count(g, n_alleles, i):
        n = 0
        missing = False
        for k in range(ploidy):  # a constant: unrolled
            a = g[i, k]
            missing = missing or a < 0
            n += 1 if (a >= 1 and a < n_alleles) else 0
        return -1 if missing else n

    return count


@launch.once
def _cpu_loop(ploidy: int):
    count = make_call_count(launch.cpu_jit, ploidy)

    @launch.cpu_jit
    def calls(g, n_alleles, out):
        for i in range(g.shape[0]):
            out[i] = count(g, n_alleles, i)

    return calls


def _calls(g):
    """A (variants, samples, ploidy) block as C-contiguous (calls, ploidy)."""
    v, s, p = g.shape
    return g.reshape(v * s, p) if g.flags.c_contiguous else g.copy().reshape(v * s, p)


def _n_alleles(n_alleles) -> np.int64:
    return np.int64(NO_ALLELE_LIMIT if n_alleles is None else n_alleles)


def alternate_allele_count_cpu(g, n_alleles: int | None = None):
    """int16 (variants, samples): alternate alleles of each call of ``g`` (variants, samples,
    ploidy), -1 where an allele is missing. ``n_alleles``: the alleles dimension's length (alleles
    from it on are not counted, as sgkit's allele counts have no place for them); None counts
    every allele above 0."""
    v, s, p = g.shape
    out = np.empty(v * s, dtype=np.int16)
    if out.size:
        _cpu_loop(int(p))(_calls(g), _n_alleles(n_alleles), out)
    return out.reshape(v, s)


def alternate_allele_count_gpu(g, n_alleles: int | None = None):
    """:func:`alternate_allele_count_cpu` on a CuPy block, by the CUDA C kernel, on CuPy's current
    stream."""
    import cupy

    from .genotypes import per_call_gpu

    v, s, p = g.shape
    out = cupy.empty((v, s), dtype=np.int16)
    per_call_gpu("pipeline_alternate_counts", cupy.ascontiguousarray(g), out, _n_alleles(n_alleles))
    return out
