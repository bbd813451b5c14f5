"""PC-Relate's per-call values (``ops/genomics/relatedness.py``, sgkit's ``pc_relate``).

``pc_relate_values``: a block of diploid calls (variants, samples, 2), their mask and the
orthonormal basis ``q`` (samples, components + 1) of the intercept and the samples' PCs ->
(variants, samples, 2) float64, each call's centred dosage and standard deviation: the dosages,
missing ones imputed with the variant's mean; the individual allele frequencies ``mu``, their
projection on the basis, over two; 0 for both values where ``mu`` is within ``maf`` of 0 or 1 or
the call is masked. Array formulas on the CPU; on the GPU two CUDA C kernels (``cuda/relatedness.cu``,
shipped compiled for int8 calls) around cuBLAS's products, where the formulas compiled a dozen
CuPy kernels on a fresh machine (2-3 s each while other threads compiled theirs). The sums of a
variant's dosages are of integers, exact in any order, so both give the same values.
"""

from __future__ import annotations

import numpy as np

from . import launch

F8 = np.float64
IMPUTE_THREADS = 256  # IMPUTE_THREADS in the kernel


def pc_relate_values_cpu(g, mask, q, *, maf: float):
    """The values of a (variants, samples, 2) block on NumPy (the module's docstring)."""
    missing = mask.any(axis=-1)
    dosage = np.where(missing, -1, g.sum(axis=-1, dtype=np.int64)).astype(F8)
    present = ~missing
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(present, dosage, 0.0).sum(axis=1) / present.sum(axis=1)
    imputed = np.where(present, dosage, mean[:, None])
    mu = ((imputed @ q) @ q.T) / 2
    out = (mu <= maf) | (mu >= 1.0 - maf) | missing
    stddev = np.sqrt(np.where(out, 0.0, mu * (1.0 - mu)))
    centered = np.where(out, 0.0, dosage / 2 - mu)
    return np.stack([centered, stddev], axis=-1)


def _kernel(name: str, call_dtype):
    return launch.raw_kernel("relatedness.cu", name, launch.FMAD, call_t=launch.c_type(call_dtype))


def pc_relate_values_gpu(g, mask, q, *, maf: float):
    """:func:`pc_relate_values_cpu` on CuPy blocks, by the CUDA C kernels and cuBLAS."""
    import cupy

    if g.shape[-1] != 2:
        raise ValueError(f"PC-Relate's values are of diploid calls, not ploidy {g.shape[-1]}")
    g = cupy.ascontiguousarray(g)
    mask = cupy.ascontiguousarray(mask)
    v, s = g.shape[:2]
    out = cupy.empty((v, s, 2), F8)
    if not out.size:
        return out
    imputed = cupy.empty((v, s), F8)
    _kernel("pipeline_pc_relate_imputed", g.dtype)((min(v, launch.sm_count() * 16),), (IMPUTE_THREADS,),
                                                   (g, mask, imputed, np.int64(v), np.int64(s)))
    q = cupy.asarray(q, dtype=F8)
    mu2 = cupy.ascontiguousarray((imputed @ q) @ q.T)
    grid = min(launch.blocks(v * s), launch.sm_count() * 32)
    _kernel("pipeline_pc_relate_values", g.dtype)((grid,), (launch.THREADS,),
                                                  (g, mask, mu2, out, np.int64(v * s), np.float64(maf)))
    return out
