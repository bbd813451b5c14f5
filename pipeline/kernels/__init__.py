"""Kernels: small functions of one chunk, one module per family, and the one way to reach them.

Every kernel is looked up by name and backend with :func:`get`, as sgkit picks
``f"{name}_{device}"``: the function ``{name}_cpu`` or ``{name}_gpu`` of the family's module in
``FAMILIES`` (or plain ``{name}``, written against the array module of its input, for both).
The CPU and GPU versions of a kernel are separate functions: none looks at the type of its block
to choose a path. Modules are imported on first use, so listing ops imports no kernel code, and
nothing here imports CuPy or ``numba.cuda`` at module level.

``FAMILIES`` is the table of contents: kernel name -> module of :mod:`pipeline.kernels`.

How kernels are written (the idioms that remain, and why):

- CPU, array formulas (NumPy): where NumPy's vectorized reductions and expressions are already
  fast and need no compilation (CF decoding, coarsening, quantiles, trends), and for the layouts
  the loops below do not take. Some are written against the array module of their input (``xp_of``) and serve as the
  GPU's fallback for layouts its kernels do not take, or as the twins the tests check GPU
  kernels against.
- CPU, per-point loops compiled by Numba (``launch.cpu_jit``, ``launch.cpu_loop``): where a
  formula would make many passes or cannot be vectorized (moments, weighted sums and standardize,
  whose formulas' temporaries cost page faults that stopped 16 threads from scaling; rolling
  means, the group kernels), and as the twins of the CUDA
  C kernels, each thread's loop step for step, so that CPU and GPU agree bit for bit.
- GPU, CUDA C in ``cuda/*.cu``, compiled by CuPy's ``RawKernel`` (``launch.raw_kernel``): the hot
  kernels, where control over loads in flight, shared memory and the order of additions reaches
  the memory bandwidth; ``${name}`` placeholders carry the element types and compile-time
  constants. The simplest (one C expression per element) share two streaming templates
  (``launch.Spec``). The instantiations that runs meet ship compiled (:mod:`.prebuilt`, built by
  :mod:`.build`).
- GPU, Numba CUDA (``launch.numba_cuda``, ``launch.launch_numba``): the per-point loops shared
  with the CPU where they remain the GPU kernel (``group_runs``, the trend kernels); they run in
  Numba's CUDA simulator in the tests.
- GPU, CuPy's own ``ElementwiseKernel`` and ``ReductionKernel`` (one C expression), and CuPy
  array formulas: for the general layouts the kernels above do not cover (broadcast or strided
  blocks, several axes). Each compiles a kernel per operation and dtype on a machine's first run
  (0.1-0.4 s each, CUB reductions 1.7 s), so small results (per-variant counts, thin matrices)
  are finished on the host by the ops and by the reductions instead (``docs/genomics.md``,
  ``pipeline.reduce.aggregation.HOST_FINISH_BYTES``), and dask's joins and copies of CuPy blocks
  go by the copy engine or by a copy kernel of pipeline's (:mod:`.copies`).

The machinery (block sizes, grids, moving an axis to a (steps, points) layout, loading and
compiling ``.cu`` files, Numba on the CPU and on the GPU) lives in :mod:`pipeline.kernels.launch`.
The kernels the current ones replaced are in ``benchmarks/kernels_previous.py``, for comparison.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator

from ..errors import KernelNotFound

FAMILIES: dict[str, str] = {
    "cf_decode": "elementwise",
    "standardize": "elementwise",
    "moments": "moments",
    "moments_merge": "moments",
    "moments_merge_parts": "moments",
    "mean_std": "moments",
    "weighted_sums": "weighted",
    "rolling_mean": "rolling",
    "group_sum": "groups",
    "group_spells": "groups",
    "group_runs": "groups",
    "subtract_groups": "groups",
    "coarsen_mean": "coarsen",
    "polyfit": "trend",
    "polyval_subtract": "trend",
    "detrend_block": "trend",
    "quantile": "fields",
    "saturation_vapor_pressure": "fields",
    "cohort_allele_count": "popgen",
    "cohort_sum": "popgen",
    "diversity_terms": "popgen",
    "divergence_terms": "popgen",
    "segregating_sites": "popgen",
    "window_sum": "popgen",
    "fst": "popgen",
    "tajimas_d": "popgen",
    "hash_prefix": "popgen",
    "take": "copies",
    "ld_r2": "ld",
    "maximal_independent_set": "ld",
    "linreg_block": "gwas",
    "linreg_p_value": "gwas",
    "pc_relate_values": "relatedness",
    "call_allele_counts": "genotypes",
    "call_genotype_index": "genotypes",
    "hard_calls": "genotypes",
    "genotype_allele_frequencies": "genotypes",
    "variant_call_counts": "genotypes",
    "sample_call_counts": "genotypes",
    "variant_genotype_counts": "genotypes",
    "hwe_exact": "genotypes",
    "genedrop_diploid": "pedigree",
    # genomics: PCA and pairwise distances
    "alternate_allele_count": "alternate",
    "patterson_moments": "linalg",
    "patterson_standardize": "linalg",
    "patterson_gram": "linalg",
    "sum_parts": "linalg",
    "fill_missing": "linalg",
    "top_eigenpairs": "linalg",
    "distance_sums": "linalg",
    "distance_from_sums": "linalg",
}

BACKENDS = ("cpu", "gpu")

# The families whose GPU kernels are Numba CUDA kernels (``launch.cuda_kernel``): resolving one of
# them for the GPU starts ``numba.cuda``'s import in the background (launch.prepare_numba_cuda).
# The genotype counts are CUDA C for int8 diploid biallelic calls and for every per-call count;
# their generic per-variant and per-sample kernels import numba.cuda at their first launch.
NUMBA_CUDA_FAMILIES = frozenset({"groups", "trend"})


@functools.cache
def _resolve(name: str, backend: str) -> Callable:
    if backend not in BACKENDS:
        raise KernelNotFound(f"no backend {backend!r} (backends: {', '.join(BACKENDS)})")
    try:
        module = importlib.import_module(f"{__name__}.{FAMILIES[name]}")
    except KeyError:
        raise KernelNotFound(f"no kernel {name!r}; kernels: {', '.join(sorted(FAMILIES))}") from None
    fn = getattr(module, f"{name}_{backend}", None) or getattr(module, name, None)
    if fn is None:
        raise KernelNotFound(f"kernel {name!r} has no {backend} implementation in {module.__name__}")
    return Kernel(name, backend, fn)


def get(name: str, backend: str) -> Callable:
    """The kernel ``name`` for ``backend`` ("cpu" or "gpu"), to run: an op building its graph asks
    for it, and a Numba CUDA kernel's module starts loading now (:data:`NUMBA_CUDA_FAMILIES`)."""
    kernel = _resolve(name, backend)
    if backend == "gpu":
        from .copies import prepare_cupy

        prepare_cupy()  # dask's joins and gathers of CuPy blocks by pipeline's copies
        if FAMILIES[name] in NUMBA_CUDA_FAMILIES:
            from .launch import prepare_numba_cuda

            prepare_numba_cuda()
    return kernel


def work_slabs(backend: str) -> float:
    """The most temporaries any kernel of ``backend`` holds at once, in slabs of its input
    (:mod:`pipeline.kernels.slabs`), as the kernels declare it (``@temporaries``): what the
    memory plan counts for each thread besides its blocks. The CPU's array formulas work slab by
    slab; the Numba loops hold none; on the GPU a thread's blocks were measured with its kernels'
    temporaries in them (0)."""
    return max((getattr(_resolve(name, backend).fn, "work_slabs", 0) for name in FAMILIES if has(name, backend)), default=0)


def has(name: str, backend: str) -> bool:
    """Whether ``name`` has a kernel for ``backend``."""
    try:
        _resolve(name, backend)
    except KernelNotFound:
        return False
    return True


# --- which kernels ran: for the test that each op runs the kernels it declares ---------------------

_calls: list[Counter] = []  # open recordings; kernels run on Dask's threads, so not a context variable
_calls_lock = threading.Lock()


class Kernel:
    """A kernel as :func:`get` hands it out: the function, counted while :func:`recording` is open.
    (A module-level class, so that tasks holding it pickle by reference.)"""

    def __init__(self, name: str, backend: str, fn: Callable):
        self.name, self.backend, self.fn = name, backend, fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        if _calls:
            with _calls_lock:
                for c in _calls:
                    c[(self.name, self.backend)] += 1
        return self.fn(*args, **kwargs)

    def __dask_tokenize__(self):
        return ("pipeline-kernel", self.name, self.backend, self.fn.__module__, self.fn.__qualname__)

    def __reduce__(self):
        return (get, (self.name, self.backend))

    def __repr__(self) -> str:
        return f"<kernel {self.name} ({self.backend}): {self.fn.__module__}.{self.fn.__qualname__}>"


@contextmanager
def recording() -> Iterator[Counter]:
    """Count the calls of every kernel reached through :func:`get` within the block, by
    ``(name, backend)``, on any thread."""
    calls: Counter = Counter()
    with _calls_lock:
        _calls.append(calls)
    try:
        yield calls
    finally:
        with _calls_lock:
            _calls.remove(calls)
