"""sgkit's diploid genedrop (``simulate_genedrop``, ``ops/genomics/pedigree.py``), a block of variants
at a time.

``genedrop_diploid``: calls (variants, samples, 2) of any integer type, ``parent`` (samples, 2)
(negative: an unknown parent), ``order`` (samples), the samples with every parent before its
children (``topological_argsort`` of the op), and ``seeds`` (variants) uint32 -> (variants,
samples, 2) of the calls' type: the founders' calls kept, and each other sample's alleles drawn, in
``order``, one from each parent's two, its first parent's draw first. A variant's draws come from
Numba's generator seeded with the variant's seed (``np.random.seed`` then ``np.random.randint(2)``
in a Numba loop, as sgkit's), so the same seeds give sgkit's genotypes. A sample with one known
parent raises ``ValueError('Pedigree contains half-founders')`` (for a block of at least one
variant), as sgkit's loop.

On the CPU, sgkit's Numba loop (:func:`_genedrop_diploid_loop`). On the GPU, a CUDA C kernel
(``cuda/pedigree.cu``, shipped compiled for int8 to int64 calls), a thread a variant, that
reproduces Numba's generator (its Mersenne Twister, seeded and drawn as Numba does) and so gives
the loop's calls bit for bit: no Numba is imported, where importing it took about 0.5 s of a
process's first run and compiling the loop seconds on a machine's first.
"""

from __future__ import annotations

import numpy as np

from . import launch

HALF_FOUNDERS = "Pedigree contains half-founders"


def _genedrop_diploid_loop(genotypes, parent, order, seeds, out):
    """sgkit's loop (``genedrop_diploid``), with the samples' ``order`` given. Compiled by
    :func:`launch.cpu_jit`: ``np.random`` here is Numba's generator, seeded a variant at a time."""
    n_sample = parent.shape[0]
    for v in range(len(genotypes)):
        np.random.seed(seeds[v])
        for i in range(n_sample):
            t = order[i]
            unknown_parent = 0
            for j in range(2):
                p = parent[t, j]
                if p < 0:
                    unknown_parent += 1
                else:
                    idx = np.random.randint(2)
                    out[v, t, j] = out[v, p, idx]
            if unknown_parent == 1:
                raise ValueError('Pedigree contains half-founders')
            elif unknown_parent == 2:
                out[v, t, 0] = genotypes[v, t, 0]
                out[v, t, 1] = genotypes[v, t, 1]


@launch.once
def _cpu_loop():
    return launch.cpu_jit(_genedrop_diploid_loop)


def _check(genotypes, parent, order, seeds) -> None:
    """sgkit's checks of its loop (the parents', then the ploidy), and the shapes the kernels take."""
    if parent.ndim != 2 or parent.shape[1] != 2:
        raise ValueError('The parents dimension must be length 2')
    if genotypes.ndim != 3 or genotypes.shape[2] != 2:
        raise ValueError('Genotypes are not diploid')
    if genotypes.shape[1] != parent.shape[0] or order.shape != (parent.shape[0],):
        raise ValueError(f"genotypes of {genotypes.shape[1]} samples, a pedigree of {parent.shape[0]} and an "
                         f"order of {order.shape}")
    if seeds.shape != (genotypes.shape[0],):
        raise ValueError(f"seeds of shape {seeds.shape} for {genotypes.shape[0]} variants")


def genedrop_diploid_cpu(genotypes, parent, order, seeds):
    """The genedrop of a NumPy block (the module's docstring), by sgkit's Numba loop."""
    genotypes = np.ascontiguousarray(genotypes)
    parent = np.ascontiguousarray(parent, dtype=np.int64)
    order = np.ascontiguousarray(order, dtype=np.int64)
    seeds = np.ascontiguousarray(seeds, dtype=np.uint32)
    _check(genotypes, parent, order, seeds)
    out = np.empty(genotypes.shape, genotypes.dtype)
    if out.size:
        _cpu_loop()(genotypes, parent, order, seeds, out)
    return out


def genedrop_threads(variants: int) -> int:
    """Threads a block of the GPU kernel: a warp's multiple that spreads ``variants`` over every
    multiprocessor (each thread's walk is long and serial), at most :data:`launch.THREADS`."""
    warps = -(-variants // (32 * launch.sm_count()))
    return max(32, min(launch.THREADS, 32 * warps))


def _on_device(x, dtype):
    """``x`` (NumPy or CuPy) as a C-contiguous CuPy array of ``dtype``: NumPy's converted on the
    host and copied, CuPy's of that type and contiguous taken as they are (no CuPy kernel to
    compile)."""
    import cupy

    from .copies import contiguous

    if isinstance(x, cupy.ndarray):
        return contiguous(x.astype(dtype, copy=False))
    return cupy.asarray(np.ascontiguousarray(x, dtype=dtype))


def genedrop_diploid_gpu(genotypes, parent, order, seeds):
    """:func:`genedrop_diploid_cpu` on a CuPy block of calls (``parent``, ``order`` and ``seeds``
    NumPy or CuPy), by the CUDA C kernel ``pipeline_genedrop_diploid``, a thread a variant; the
    result on the device. The half-founders' flag is read back (a synchronisation)."""
    import cupy

    from .copies import contiguous

    genotypes = contiguous(genotypes)
    _check(genotypes, parent, order, seeds)
    out = cupy.empty(genotypes.shape, genotypes.dtype)
    variants, samples = genotypes.shape[:2]
    if not out.size:
        return out
    flag = cupy.zeros(1, np.int32)
    kernel = launch.raw_kernel("pedigree.cu", "pipeline_genedrop_diploid", (), call_t=launch.c_type(genotypes.dtype))
    threads = genedrop_threads(variants)
    kernel((launch.blocks(variants, threads),), (threads,),
           (genotypes, out, _on_device(parent, np.int64), _on_device(order, np.int64), _on_device(seeds, np.uint32),
            np.int64(variants), np.int64(samples), flag))
    if int(flag.get()[0]):
        raise ValueError(HALF_FOUNDERS)
    return out


__all__ = ["genedrop_diploid_cpu", "genedrop_diploid_gpu", "genedrop_threads"]
