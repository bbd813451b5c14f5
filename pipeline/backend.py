"""The one place that chooses NumPy or CuPy.

Nothing else in the package imports CuPy at module level, so ``import pipeline`` works on a
machine without CUDA. Kernels take their array module from their input (:func:`xp_of`); Dask
arrays carry their backend in ``_meta``; :func:`to_numpy` is the one exit to host memory.
"""

from __future__ import annotations

import functools
import os
from typing import Literal

import numpy as np

from . import config, state
from .errors import BackendError, InputError

Backend = Literal["cpu", "gpu"]
BACKENDS = ("auto", "cpu", "gpu")


def cache_dir() -> str:
    """``pipeline.cache-dir``, or the user's cache folder (``$XDG_CACHE_HOME/pipeline``,
    ``~/.cache/pipeline``)."""
    configured = config.get("cache-dir")
    if configured:
        return os.path.expanduser(str(configured))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pipeline")


def cache_env() -> str:
    """Set ``NUMBA_CACHE_DIR`` and ``CUPY_CACHE_DIR`` to folders of :func:`cache_dir` where they
    are not set; returns that folder. Called before pipeline imports CuPy (:func:`_cupy`):
    CuPy 14 reads ``CUPY_CACHE_DIR`` once, when it makes its disk cache, so a setting made after
    its first compilation was not seen and its kernels went to ``~/.cupy/kernel_cache``."""
    root = cache_dir()
    for var, sub in (("NUMBA_CACHE_DIR", "numba"), ("CUPY_CACHE_DIR", "cupy")):
        if not os.environ.get(var):
            os.environ[var] = os.path.join(root, sub)
    return root


@functools.cache
def _cupy():
    cache_env()  # before CuPy is imported: where it keeps the kernels it compiles
    os.environ.update(config.cuda_env())  # and before any CUDA context: the GPU's work queues
    try:
        import cupy
    except Exception:  # ImportError, or a CUDA library that fails to load
        return None
    return cupy


@functools.cache
def gpu_count() -> int:
    """Number of CUDA devices CuPy can use (0 without CuPy or without a GPU)."""
    cp = _cupy()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def gpu_available() -> bool:
    return gpu_count() > 0


def resolve(backend: str | None = None) -> Backend:
    """Turn ``"auto" | "cpu" | "gpu" | None`` into ``"cpu"`` or ``"gpu"``.

    ``None`` reads the ``pipeline.backend`` setting (``DASK_PIPELINE__BACKEND``). ``"auto"``
    takes the GPU when one is visible. Asking for ``"gpu"`` where none is visible raises.
    """
    if backend is None:
        backend = config.get("backend", "auto")
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "gpu" if gpu_available() else "cpu"
    if backend == "gpu" and not gpu_available():
        raise BackendError(
            "backend 'gpu' was requested but no CUDA GPU is visible to CuPy "
            "(install the 'gpu' extra and check CUDA_VISIBLE_DEVICES)"
        )
    return backend


def module(backend: Backend):
    """The array module of a backend: ``numpy`` or ``cupy``."""
    if backend == "gpu":
        cp = _cupy()
        if cp is None:
            raise BackendError("CuPy is not installed: install the 'gpu' extra")
        return cp
    return np


def is_cupy(x) -> bool:
    cp = _cupy()
    return cp is not None and isinstance(x, cp.ndarray)


def xp_of(x):
    """The array module of an array (NumPy or CuPy), for kernels that work on both."""
    return _cupy() if is_cupy(x) else np


def c_aligned(x, dtype=None):
    """``x`` (NumPy or CuPy) as a C-ordered array of ``dtype`` (default its own) aligned to it,
    copied only where it is not one already. NumPy's products and sums round otherwise on other
    layouts, and a block's layout depends on where its task ran: one that crossed between workers
    comes in another order than a view made in place, and may lie at any byte
    (:mod:`pipeline.exec.serialize`). A CuPy array is always aligned."""
    if is_cupy(x):
        return _cupy().ascontiguousarray(x, dtype=dtype)
    return np.require(np.asarray(x), dtype=dtype, requirements=["C", "A"])


def linalg_raises(xp):
    """A context in which ``xp``'s linear algebra raises ``numpy.linalg.LinAlgError`` where a
    factorization fails (a singular matrix's zero pivot), as NumPy's does. CuPy's checks nothing by
    default (``cupyx.errstate(linalg="ignore")``): the inverse of a singular matrix came back as
    NaN, with no error."""
    if xp is np:
        import contextlib

        return contextlib.nullcontext()
    import cupyx

    return cupyx.errstate(linalg="raise")


def backend_of(x) -> Backend:
    """Backend of a NumPy/CuPy array, a Dask array (from ``_meta``) or an xarray object."""
    import xarray as xr

    if isinstance(x, (xr.DataArray, xr.Variable)):
        x = x.data  # (only xarray's .data: a NumPy or CuPy array's .data is its raw buffer)
    meta = getattr(x, "_meta", x)
    return "gpu" if is_cupy(meta) else "cpu"


def to_numpy(x):
    """The one exit to host memory: a NumPy array from NumPy, CuPy, Dask or xarray data.

    xarray objects come back as the same xarray objects holding NumPy data.
    """
    import xarray as xr

    if isinstance(x, xr.DataArray):
        return x.copy(data=to_numpy(x.data))
    if isinstance(x, xr.Dataset):
        return x.map(to_numpy, keep_attrs=True)
    (out,) = to_numpy_all(x)
    return out


def to_numpy_all(*xs) -> list:
    """:func:`to_numpy` of several NumPy, CuPy or Dask arrays, their graphs computed together: a
    pass over the data that they share (the genotypes, for a filter's call rate and allele
    frequency) is made once, not once for each."""
    lazy = [i for i, x in enumerate(xs) if hasattr(x, "__dask_graph__")]
    out = list(xs)
    for i, v in zip(lazy, _compute(*(_host_blocks(xs[i]) for i in lazy))):
        out[i] = v
    return [_host_block(x) if is_cupy(x) else np.asarray(x) for x in out]


def _host_blocks(x):
    """A Dask array whose CuPy blocks are copied to the host in the graph: dask's result of a lone
    CuPy block was its copy by CuPy's copy kernel, which a fresh machine compiled for each dtype."""
    if not is_cupy(getattr(x, "_meta", None)):
        return x
    return x.map_blocks(_host_block, dtype=x.dtype, meta=np.empty((0,) * x.ndim, dtype=x.dtype))


# How :func:`to_numpy` computes Dask graphs: :mod:`pipeline.exec.compute` sets its ``compute``
# here when it is imported (every flow, op module and ``pipeline.genomics`` imports it): the memory
# plan's threads, or the current cluster with its placement. This layer is below it, so it does not
# import it. Until then, dask's own scheduler.
_planned_compute = None


def set_compute(compute) -> None:
    """The function (``compute(list of collections) -> list of results``) that :func:`to_numpy`
    computes Dask graphs with; set by :mod:`pipeline.exec.compute`."""
    global _planned_compute
    _planned_compute = compute


def _compute(*xs) -> tuple:
    """The arrays computed together, by ``pipeline.compute`` once it is set (see ``set_compute``).
    Not dask's scheduler, which runs a thread a core, each holding its blocks: a filter's
    statistics over 50 GB of genotypes (20 blocks of 2.5 GB) read every block at once on the 32
    threads of the 2-GPU machine, and the run ran out of device memory.

    Until it is set, dask's own choice, made here: where distributed is not imported there is no
    client, and dask chooses the collections' own scheduler, but it imports distributed to look
    for a client first (0.33 s of a process's first ``to_numpy`` on the GPU machine)."""
    import sys

    import dask

    if not xs:
        return ()
    if _planned_compute is not None:
        return tuple(_planned_compute(list(xs)))
    if "distributed" in sys.modules or dask.config.get("scheduler", None) is not None:
        return dask.compute(*xs)
    return dask.compute(*xs, scheduler=xs[0].__dask_scheduler__)


def _host_block(b):
    """A CuPy array in host memory (a strided one made contiguous on the device first, by CuPy)."""
    if not is_cupy(b):
        return b
    return b.get() if b.flags.c_contiguous or b.flags.f_contiguous else _cupy().ascontiguousarray(b).get()


def meta(backend: Backend, dtype, ndim: int):
    """An empty array of the backend, for Dask's ``meta=``."""
    return module(backend).empty((0,) * ndim, dtype=dtype)


def to_backend(arr, backend: Backend):
    """Dask (or eager) array -> Dask array whose chunks live on ``backend``.

    An array that an earlier call moved away from ``backend`` comes back as the array it was
    (:func:`_moved_from`): the same values, without a copy each way. A GWAS's statistics are made
    on the host and handed to the user on the dosage's device, and a flow's sink takes them back to
    the host: 117 small blocks that each went to the device and back, 1.6 s of the tasks' time
    on two GPUs, most of it after the last genotype read."""
    import dask.array as da

    if not isinstance(arr, da.Array):
        arr = da.from_array(arr, chunks=-1)
    if backend_of(arr) == backend:
        return arr
    source = _moved_from(arr)
    if source is not None and backend_of(source) == backend:
        return source
    if backend == "gpu":
        cp = module("gpu")
        out = arr.map_blocks(cp.asarray, dtype=arr.dtype, meta=meta("gpu", arr.dtype, arr.ndim))
    else:
        out = arr.map_blocks(to_numpy, dtype=arr.dtype, meta=meta("cpu", arr.dtype, arr.ndim))
    _remember_move(out, arr)
    return out


def _remember_move(out, source) -> None:
    """Note that the Dask array ``out`` is ``source`` moved, for as long as ``out`` lives. Its name
    is a token of the move and of ``source``'s name: any array of that name holds its values."""
    import weakref

    with state.moved.lock:
        state.moved.sources[out.name] = source
    weakref.finalize(out, _forget_move, out.name, source)


def _forget_move(name: str, source) -> None:
    with state.moved.lock:
        if state.moved.sources.get(name) is source:
            del state.moved.sources[name]


def _moved_from(arr):
    """The Dask array that ``arr`` is a move of (:func:`to_backend`), with the same blocks, else
    None."""
    with state.moved.lock:
        source = state.moved.sources.get(arr.name)
    if source is None or source.chunks != arr.chunks or source.dtype != arr.dtype:
        return None
    return source


def check_same_backend(*arrays) -> Backend:
    """Fail loudly when host and device arrays are mixed in one computation."""
    backends = {backend_of(a) for a in arrays if a is not None and not np.isscalar(a)}
    if len(backends) > 1:
        raise BackendError("host (NumPy) and device (CuPy) arrays were mixed in one operation")
    return backends.pop() if backends else "cpu"


def _bytes_or_fraction(value, total: int, key: str | None = None) -> int:
    """``value`` in bytes: a size ("16GB", a number above 1) or a fraction of ``total`` (from
    0 to 1); None: ``total``. Anything else is an InputError naming the setting ``pipeline.<key>``."""
    try:
        return config.share(value, total)
    except ValueError as e:
        raise InputError(f"pipeline.{key}: {e}" if key else str(e)) from None


def device_memory_limit() -> int:
    """Bytes of device memory pipeline may hold on the current GPU (``pipeline.gpu.memory-limit``:
    bytes such as "16GB", or a fraction of the GPU's memory)."""
    total = module("gpu").cuda.Device().mem_info[1]
    return _bytes_or_fraction(config.get("gpu.memory-limit", None), total, "gpu.memory-limit")


def use_device_memory_limit() -> None:
    """Cap CuPy's memory pool on the current GPU at ``pipeline.gpu.memory-limit``, and count the
    most it holds (:func:`device_memory_peak`). The cap is set again whenever the setting differs
    from the one it was set from: a limit set for one computation (``dask.config.set`` around it)
    is lifted for the next."""
    setting = config.get("gpu.memory-limit", None)
    device = module("gpu").cuda.runtime.getDevice()
    if state.device.limits.get(device, ()) != setting:
        _set_device_memory_limit(setting, device)


def _set_device_memory_limit(setting, device: int) -> None:
    cp = module("gpu")
    pool = cp.get_default_memory_pool()
    pool.set_limit(size=device_memory_limit())
    if cp.cuda.get_allocator() == pool.malloc:  # not where another allocator (RMM's) is in use
        cp.cuda.set_allocator(_counting_malloc(pool))
    state.device.limits[device] = setting


def _counting_malloc(pool):
    """``pool.malloc`` that records the most bytes the pool has held (in use and cached for reuse),
    which is what the GPU gives this process, and the most in use at once, which is what the memory
    plan counts (the pool returns what it caches when the limit is reached); CuPy keeps no such
    peaks itself. Both are read as the pool's counters, which cost no more than a load."""

    def malloc(size: int):
        mem = pool.malloc(size)
        held, used = pool.total_bytes(), pool.used_bytes()
        if held > state.device.pool_peak:  # threads racing here can under-count a peak by one block
            state.device.pool_peak = held
        if used > state.device.used_peak:
            state.device.used_peak = used
        return mem

    return malloc



def device_memory_peak(reset: bool = False, used: bool = False) -> int:
    """The most bytes CuPy's pool has held on the GPU (in use and cached; ``used``: in use at once)
    since the last reset, as seen by pipeline's allocator (0 before :func:`use_device_memory_limit`
    installed it). A reset clears both."""
    peak = state.device.used_peak if used else state.device.pool_peak
    if reset:
        state.device.pool_peak = state.device.used_peak = 0
    return peak


def memory_budget(backend: Backend) -> int:
    """Bytes a computation on ``backend`` may keep in memory: the device memory limit on the
    GPU, ``pipeline.cpu.memory-limit`` of the host's memory on the CPU."""
    if backend == "gpu":
        return device_memory_limit()
    import psutil

    return _bytes_or_fraction(config.get("cpu.memory-limit", None), psutil.virtual_memory().total, "cpu.memory-limit")


def out_of_core(nbytes: int, backend: Backend) -> bool:
    """Whether an array of ``nbytes`` runs out of core on ``backend``: larger than half of its
    memory budget, so that it is never held whole (two-pass ops do not keep it between their
    passes, and on the GPU its blocks may be decoded on the host ahead of their tasks)."""
    return nbytes > memory_budget(backend) / 2
