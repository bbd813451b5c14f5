"""How kernels are compiled and launched: the machinery every family shares.

- block sizes and grids: :data:`THREADS`, :func:`blocks`, :func:`sm_count`;
- the 2-D layout most kernels see: the kernel's axis first, all other axes flattened into grid
  points (:func:`to_2d`, :func:`from_2d`, :func:`reduced_from_2d`);
- CUDA C: the sources are ``.cu`` files in ``cuda/`` beside this module, with ``${name}``
  placeholders (:class:`string.Template`) for the element types and the compile-time constants;
  :func:`cuda_source` fills them in, :func:`raw_kernel` loads the result's binary built ahead of
  time (:mod:`.prebuilt`) or compiles it once with CuPy;
- streaming kernels (:class:`Spec`, :func:`stream`): one C expression per element, in two
  templates (``streaming_flat.cu``, ``streaming_column.cu``) that keep four loads in flight per
  thread;
- BLAS on the host: one thread while Dask's threads compute (:func:`one_blas_thread`; a worker's
  whole life, :func:`one_blas_thread_from_now`), every core for a step that runs alone
  (:func:`blas_on_every_core`);
- Numba: :func:`cpu_jit` compiles a loop for the CPU (``numba.njit(nogil=True)``, so Dask's
  threads run it in parallel), :func:`cpu_loop` a top-level one, cached on disk; :func:`numba_cuda` imports ``numba.cuda``,
  :func:`cuda_kernel` makes a Numba CUDA kernel, cached on disk, and :func:`launch_numba`
  launches one on CuPy's current stream.

Every kernel is compiled on its first call, never at import, and once per machine: Numba's CPU
and CUDA kernels are cached on disk, as CuPy caches compiled CUDA C, all under
``pipeline.cache-dir`` (:func:`use_cache_dir`, ``backend.cache_dir``) unless ``NUMBA_CACHE_DIR`` or ``CUPY_CACHE_DIR``
say otherwise. The CUDA C modules that flows use with their usual types are compiled ahead of time
and shipped (:mod:`.prebuilt`): those load on a machine's first run without compiling.
:func:`compile_seconds` counts the time spent compiling, for run reports.

Nothing here imports CuPy or Numba at module level.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import string
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import config

log = logging.getLogger(__name__)

THREADS = 256  # threads per block of the one-thread-per-point kernels and of the streaming kernels

CUDA_DIR = Path(__file__).resolve().parent / "cuda"

# The C types of the element types the CUDA C kernels are compiled for.
C_TYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int32): "int",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint64): "unsigned long long",
}


def c_type(dtype) -> str:
    return C_TYPES[np.dtype(dtype)]


def blocks(n: int, threads: int = THREADS) -> int:
    """Blocks of ``threads`` that cover ``n`` items (at least one)."""
    return max(1, -(-n // threads))


MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y


def row_grid(cols: int, rows: int) -> tuple[int, int]:
    """The grid of the kernels that walk rows along y (a loop past :data:`MAX_GRID_Y`) and each
    row's ``cols`` items along x (a loop past 1024 blocks of :data:`THREADS`)."""
    return (max(1, min(blocks(cols), 1024)), max(1, min(rows, MAX_GRID_Y)))


def once(factory):
    """``functools.cache`` whose first call per arguments runs once however many threads ask at
    the same time. Dask's threads ask for a CPU kernel together at the start of a run; with a bare
    cache each built its own Numba dispatcher and compiled it again (a compilation holds the GIL,
    so they queue): the first run of the rolling mean on 16 threads took 21.3 s, the next 2.4 s.
    CUDA kernels alike: on a fresh GPU machine, threads compiled the weighted sums three times at
    once, 12.6 s of compilation where one took 1.8 s."""
    cached = functools.cache(factory)
    lock = threading.Lock()

    @functools.wraps(factory)
    def get(*args, **kwargs):
        with lock:
            return cached(*args, **kwargs)

    get.cache_clear = cached.cache_clear
    return get


@functools.cache
def sm_count() -> int:
    """Multiprocessors of the current GPU."""
    import cupy

    return cupy.cuda.Device().attributes["MultiProcessorCount"]


# --- the 2-D layout: (steps along the kernel's axis, grid points) -----------------------------------


def to_2d(block, axis: int, xp):
    """``block`` with ``axis`` moved first and the other axes flattened, C-contiguous, and the shape
    of the moved block (for :func:`from_2d` and :func:`reduced_from_2d`)."""
    moved = xp.moveaxis(block, axis, 0)
    return xp.ascontiguousarray(moved).reshape(moved.shape[0], -1), moved.shape


def from_2d(out2d, moved_shape, axis: int, xp):
    """A (steps, points) result back in the block's layout."""
    return xp.moveaxis(out2d.reshape(moved_shape), 0, axis)


def reduced_from_2d(values, moved_shape, axis: int, xp):
    """One value per point, in the block's layout with ``axis`` kept at length 1."""
    return xp.expand_dims(values.reshape(moved_shape[1:]), axis)


# --- where compiled kernels are kept, and the time spent compiling -------------------------------

_compiling = threading.local()
_compile_total = [0.0]
_compile_lock = threading.Lock()


@once  # its listener registered once, however many threads ask first
def use_cache_dir() -> str:
    """Point Numba's and CuPy's kernel caches into ``backend.cache_dir()`` (``numba``, ``cupy``), where
    ``NUMBA_CACHE_DIR`` and ``CUPY_CACHE_DIR`` are not set; returns the folder. Numba reads its
    setting at import (dask.array may import it first), so its config is set too.

    Numba's error messages are left uncoloured unless ``NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING``
    says otherwise: typing a kernel raises and catches many errors while it tries overloads, and
    colouring each message (colorama wrapping the terminal's streams anew) took 0.49 s of the 3.9 s
    that the four counting kernels took to compile on the GPU machine."""
    from ..backend import cache_env

    root = cache_env()
    os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")  # read at Numba's import
    import numba
    from numba.core import event

    if not numba.config.CACHE_DIR:
        numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
    class Compiles(event.Listener):
        """Numba's compile events (a load from its cache included), counted by :class:`compiling`.
        (numba-cuda sends none for kernels: :func:`cuda_kernel` counts those.)"""

        def on_start(self, ev):
            compiling().__enter__()

        def on_end(self, ev):
            compiling().__exit__(None, None, None)

    event.register("numba:compile", Compiles())
    return root


class compiling:
    """Counts the seconds inside it towards :func:`compile_seconds` (nested uses count once)."""

    def __enter__(self):
        depth = getattr(_compiling, "depth", 0)
        _compiling.depth = depth + 1
        if depth == 0:
            _compiling.start = time.perf_counter()

    def __exit__(self, *exc):
        _compiling.depth -= 1
        if _compiling.depth == 0:
            with _compile_lock:
                _compile_total[0] += time.perf_counter() - _compiling.start


def compile_seconds() -> float:
    """Seconds this process has spent compiling kernels (or loading them from the caches)."""
    with _compile_lock:
        return _compile_total[0]


@once
def share_cupy_compiles() -> bool:
    """Make each of CuPy's compilations run once however many threads ask for it at the same time,
    and count it in :func:`compile_seconds`; False where this CuPy has no such entry point.

    CuPy compiles its own kernels (a ufunc for given dtypes, a reduction, a copy) on their first
    call in a process, from its disk cache or by NVRTC, with no lock: Dask's threads reaching the
    same operation together each compiled it. Measured on the H200 machine with empty caches, the
    climate anomaly's first run compiled 30 kernels where 16 differed: 7.1 s of compilation, 3.1 s
    of the run; one compilation alone took 0.10-0.14 s, four of the same at once 0.36-0.44 s each.
    Here a thread that asks for a compilation under way waits for it, then loads the kernel from
    CuPy's cache. Wraps ``cupy.cuda.compiler._compile_with_cache_cuda``, the one function through
    which CuPy (13 and 14) compiles CUDA code. Installed where GPU work begins: a source opened on
    the GPU, a computation on threads once CuPy is imported, pipeline's own CuPy kernels."""
    try:
        from cupy.cuda import compiler
    except ImportError:
        return False
    if not config.patched("cupy-compile-once"):
        return False
    return share_compiles(compiler, "_compile_with_cache_cuda")


def share_compiles(module, name: str) -> bool:
    """Wrap ``module.name``, a compiling function, so that calls with equal arguments run one at a
    time (calls with other arguments go on beside them), each counted by :class:`compiling`."""
    compile_ = getattr(module, name, None)
    if compile_ is None:
        return False
    if getattr(compile_, "shared_by_pipeline", False):
        return True
    locks: dict[int, threading.Lock] = {}
    guard = threading.Lock()

    @functools.wraps(compile_)
    def compile_once(*args, **kwargs):
        try:
            key = hash((args, tuple(sorted(kwargs.items()))))
        except TypeError:  # an argument that does not hash: compiled as CuPy would
            return compile_(*args, **kwargs)
        with guard:
            lock = locks.setdefault(key, threading.Lock())
        with lock, compiling():
            if not log.isEnabledFor(logging.DEBUG):
                return compile_(*args, **kwargs)
            start = time.perf_counter()
            out = compile_(*args, **kwargs)
            log.debug("CuPy kernel %s: %.3f s (compiled or loaded from the disk cache), for %s",
                      _kernel_names(args[0] if args else kwargs.get("source", "")), time.perf_counter() - start,
                      _caller())
            return out

    compile_once.shared_by_pipeline = True
    setattr(module, name, compile_once)
    return True


def _caller() -> str:
    """The innermost line of pipeline's own code on this thread's stack, outside this module, or
    else the innermost outside CuPy (for the compile log: which operation asked for a kernel)."""
    import traceback

    other = []
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/pipeline/" in path and not path.endswith(("kernels/launch.py", "deferred.py")):
            return f"{path.rsplit('/pipeline/', 1)[1]}:{frame.lineno} ({frame.name})"
        if len(other) < 3 and "/cupy" not in path and "functools" not in path:
            other.append(f"{'/'.join(path.split('/')[-3:])}:{frame.lineno} ({frame.name})")
    return " < ".join(other) or "?"


def _kernel_names(source) -> str:
    """The kernels a CUDA source defines (for the compile log)."""
    import re

    names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)", str(source))
    return ",".join(names[:4]) + (f",+{len(names) - 4}" if len(names) > 4 else "") or "?"


# --- CUDA C: .cu files, filled in and compiled by CuPy ----------------------------------------------


@functools.cache
def _template(filename: str) -> string.Template:
    return string.Template((CUDA_DIR / filename).read_text())


def cuda_source(filename: str, /, **params) -> str:
    """The source of ``cuda/<filename>`` with its ``${name}`` placeholders filled in (what CuPy
    compiles; the tests compile it with nvcc too)."""
    return _template(filename).substitute({k: str(v) for k, v in params.items()})


# --fmad=false: no fused multiply-add, so a * b + c rounds twice as NumPy does, and the kernels
# agree bit for bit with their CPU twins (the kernels are memory-bound: FMA buys no speed).
# CuPy appends -ftz=true to every compilation after these options (cupy/cuda/compiler.py), so
# float32 subnormals are flushed to zero on the GPU where NumPy keeps them (a known difference:
# a CF add_offset of 1.7e-40 on zeros gives 0 on the GPU).
FMAD = ("--fmad=false",)
FMAD_CXX17 = ("--fmad=false", "-std=c++17")


@once
def raw_kernel(filename: str, kernel: str, options: tuple[str, ...], /, **params):
    """The kernel named ``kernel`` in ``cuda/<filename>`` filled in with ``params``: from the
    binary shipped for it (:mod:`.prebuilt`), or compiled by CuPy with ``options`` (once per
    combination; CuPy keeps the binary in its disk cache)."""
    from . import prebuilt

    return _compiled(cuda_source(filename, **params), kernel, options, prebuilt.module_entry(filename, options, params))


def _compiled(source: str, kernel: str, options: tuple[str, ...], entry: dict):
    """``kernel`` of ``source``: loaded from the binary built ahead of time for it
    (:mod:`.prebuilt`), or else compiled by CuPy (NVRTC, or CuPy's disk cache). Now, not at its
    first launch: counted in :func:`compile_seconds`."""
    import cupy

    from ..backend import cache_env
    from . import prebuilt

    # CuPy's disk cache only: use_cache_dir imports Numba for its setting, which held up a first
    # run's threads 0.3 s at their first CUDA C kernel where nothing else needs Numba
    cache_env()
    share_cupy_compiles()
    prebuilt.record(entry)
    with compiling():
        path = prebuilt.binary(source, options)
        if path is not None:
            try:
                return cupy.RawModule(path=str(path)).get_function(kernel)  # loads the module
            except cupy.cuda.driver.CUDADriverError as e:  # not built for this GPU, or an older driver
                prebuilt.refused(path, e)
        compiled = cupy.RawKernel(source, kernel, options=options)
        compiled.compile()
    return compiled


# --- streaming kernels: one C expression per element, four loads in flight --------------------------
#
# CuPy's ``ElementwiseKernel`` gives each thread one element at a time. On an H200 that keeps
# about 1 MB of loads in flight, and by Little's law (bandwidth = bytes in flight / latency) it
# runs at 1.2-1.7 TB/s, 30-40% of the 4.1 TB/s copy bandwidth (benchmarks/ops_bandwidth.py; the
# same holds for ``cupy.fuse``). These kernels unroll their loops four times, loading four
# independent elements before using any, which is enough to reach the copy bandwidth. Two shapes:
#
# - ``flat``: ``out[i] = f(x[i])`` over all elements (grid-stride loop);
# - ``column``: a (rows, cols) array, one thread per column and per tile of rows, so per-column
#   values (a mean, a standard deviation) are read once into registers and rows of a table are
#   picked by row (``values[labels[t] * cols + p]``).

TILE_ROWS = 64  # rows per thread in column kernels: enough columns x tiles to fill the GPU


@dataclass(frozen=True)
class Spec:
    """A streaming kernel: its shape (``flat`` or ``column``), name, extra parameters as
    (C type, name) pairs, its expression, and for column kernels what each thread reads first."""

    kind: str
    name: str
    params: tuple[tuple[str, str], ...]
    body: str
    prelude: str = ""

    def source(self, in_dtype, out_dtype) -> str:
        """The CUDA source for these element types (the tests compile it with nvcc too)."""
        decl = "".join(f", {ctype} {pname}" for ctype, pname in self.params)
        common = dict(in_t=c_type(in_dtype), out_t=c_type(out_dtype), name=self.name, decl=decl, body=self.body)
        if self.kind == "flat":
            call = "".join(f", {pname}" for _, pname in self.params)
            return cuda_source("streaming_flat.cu", **common, call=call)
        return cuda_source("streaming_column.cu", **common, prelude=self.prelude)


@once
def _streaming_kernel(spec: Spec, in_dtype, out_dtype):
    from . import prebuilt

    return _compiled(spec.source(in_dtype, out_dtype), spec.name, FMAD_CXX17, prebuilt.stream_entry(spec, in_dtype, out_dtype))


def stream(spec: Spec, x, out, *args):
    """Launch ``spec`` over C-contiguous ``x`` into ``out``: flat kernels over all elements,
    column kernels over a 2-D (rows, cols) array. ``args`` follow ``spec.params``."""
    kernel = _streaming_kernel(spec, np.dtype(x.dtype), np.dtype(out.dtype))
    if spec.kind == "flat":
        n = x.size
        grid = max(1, min((n + THREADS * 4 - 1) // (THREADS * 4), sm_count() * 32))
        kernel((grid,), (THREADS,), (x, out, np.int64(n), *args))
    else:
        rows, cols = x.shape
        grid = (max(1, (cols + THREADS - 1) // THREADS), max(1, (rows + TILE_ROWS - 1) // TILE_ROWS))
        kernel(grid, (THREADS,), (x, out, np.int64(rows), np.int64(cols), np.int64(TILE_ROWS), *args))
    return out


# --- BLAS on the host: one thread while Dask's threads compute ------------------------------------

# NumPy's matrix products run in a BLAS library (OpenBLAS, MKL, BLIS) with a pool of threads of
# its own, one per core unless told. Dask's threads already run one block each: left alone,
# every block's product would start a thread per core (cores squared in all), and a product's sums
# would be split by the pool, which cuts them where its thread count says. So while pipeline
# computes, BLAS runs on one thread, as on distributed's workers, whose nanny sets
# OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS to 1: the same bits with a cluster and
# without. On 2 cores, the CPU backend's GWAS of 400,000 variants x 2,000 samples took 7.8 s with
# OpenBLAS's default of two threads, and 4.8 s on one; its statistics differed from a cluster's run
# in their last bits.
#
# The limits are threadpoolctl's (what scikit-learn and joblib use), on the libraries loaded when
# they are set. Since 3.7, threadpoolctl lets only one thread (the first to set a limit) change
# OpenBLAS's pool, which is the process's: here limits are set from whichever thread computes, one
# at a time under a lock, each change taking and giving back that control.
_blas = threading.Lock()
_blas_users: list = []  # the limit set, once per computation running


def _blas_limit(limits: int | None = None, *, restore=None):
    """Under ``_blas``: BLAS's pools limited to ``limits`` threads (the limiter returned), or
    ``restore``'s limits set back."""
    from threadpoolctl import threadpool_limits

    try:
        from threadpoolctl import OpenBLASController

        release = functools.partial(OpenBLASController.clear_controlling_thread, force=True)
    except (ImportError, AttributeError):  # before 3.7: any thread sets the limits
        release = lambda: None  # noqa: E731
    release()
    try:
        if restore is not None:
            return restore.restore_original_limits()
        return threadpool_limits(limits=limits, user_api="blas")
    finally:
        release()


@contextlib.contextmanager
def one_blas_thread():
    """Within it, BLAS runs on one thread (the comment above); computations on several threads
    share the limit, which the last one to end takes back."""
    with _blas:
        _blas_users.append(_blas_users[0] if _blas_users else _blas_limit(1))
    try:
        yield
    finally:
        with _blas:
            limit = _blas_users.pop()
            if not _blas_users:
                _blas_limit(restore=limit)


def one_blas_thread_from_now() -> None:
    """BLAS on one thread for the rest of this process's life (a cluster's worker): nothing to
    give back, so nothing left to do as the interpreter exits."""
    with _blas:
        _blas_limit(1)


@contextlib.contextmanager
def blas_on_every_core():
    """Within it, BLAS runs on a thread per core of this process (its CPU affinity): for a step
    that runs alone, once every block before it is done, such as the eigendecomposition of an
    exact PCA's Gram matrix (LAPACK's syevd: 10 s on one thread for 4,000 samples on 2 cores, 6 s on
    both). Tasks that run beside it (none in pipeline's flows) would see the wider pool too."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with _blas:
        limit = _blas_limit(cores)
    try:
        yield
    finally:
        with _blas:
            _blas_limit(restore=limit)


# --- Numba: loops compiled for the CPU, and for the GPU ---------------------------------------------


def cpu_jit(fn):
    """``fn`` compiled for the CPU by Numba on its first call, releasing the GIL (Dask runs blocks
    on threads), and kept in Numba's disk cache: a later process loads it instead of compiling."""
    import numba

    use_cache_dir()
    dispatcher = numba.njit(nogil=True)(_named_by_closure(fn))
    dispatcher._cache = _cpu_cache()(fn)  # what cache=True sets, with a key stable across processes
    return dispatcher


def _named_by_closure(fn):
    """``fn``, its ``__qualname__`` ending in a digest of what its closure holds, where it has one.

    Numba names a compiled function's symbol after its qualified name and a number that counts the
    functions a process has compiled, and resolves a call between functions in one process by that
    symbol. Two specializations of one factory's functions (the detrending loop of degree 2 and of
    3), compiled in two processes, can get the same numbers: a process that loads both from the
    disk cache then sends the second one's calls to the first one's inner function, without a word
    (seen in the GPU tests: a detrending twin gave NaN; reproduced by ``tests/test_kernel_cache.py``).
    With the closure's digest in the name, two symbols of one name are the same code."""
    if fn.__closure__:
        import hashlib

        cells = _constants(fn) + b"".join(_stable(c.cell_contents) for c in fn.__closure__)
        fn.__qualname__ = f"{fn.__qualname__}_{hashlib.sha256(cells).hexdigest()[:16]}"
    return fn


def _constants(fn) -> bytes:
    """The numbers among the globals ``fn`` names (compile-time constants to Numba)."""
    names = fn.__code__.co_names
    return repr([(n, fn.__globals__[n]) for n in names
                 if isinstance(fn.__globals__.get(n), (int, float, np.generic))]).encode()


def _stable(value) -> bytes:
    """``value``, a closure's cell, as bytes that are the same in every process: a compiled
    function by its name, code, constants and closure; anything else pickled as Numba pickles it."""
    py_func = getattr(value, "py_func", None)
    if py_func is None:
        from numba.core.serialize import dumps

        return dumps(value)
    cells = tuple(_stable(c.cell_contents) for c in py_func.__closure__ or ())
    return py_func.__qualname__.encode() + py_func.__code__.co_code + _constants(py_func) + b"".join(cells)


def _closure_cache(base, *version):
    """``base``, Numba's cache of a function (``FunctionCache`` for the CPU, ``CUDACache`` for
    the GPU), keyed by the function's code and closure as ``cache=True`` keys it, except that a
    compiled function in the closure (the per-point loop or device function that a kernel calls)
    counts by its own code, closure and constants: Numba would pickle it with an identity new in
    every process, so a kernel defined in a factory would never be found in the cache by a later
    process. The key also holds the numbers among the globals each function names (compile-time
    constants to Numba, perhaps of another module than the kernel's, whose file alone Numba
    checks) and pipeline's version; ``version`` joins it (numba-cuda adds its version)."""
    import hashlib

    from .._version import __version__

    class ClosureCache(base):
        def __init__(self, py_func):
            super().__init__(py_func)
            old = self._cache_file
            if all(hasattr(old, a) for a in ("_data_name_pattern", "_load_index", "_save_index", "_load_data",
                                             "_save_data")):  # Numba's IndexDataCacheFile, as _keyed_files knows it
                files = object.__new__(_keyed_files(type(old)))
                files.__dict__.update(old.__dict__)
                self._cache_file = files

        def _index_key(self, sig, codegen):
            fn = self._py_func
            cells = _constants(fn) + b"".join(_stable(c.cell_contents) for c in fn.__closure__ or ())
            digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
            key = (sig, codegen.magic_tuple(), __version__, *version, (digest(fn.__code__.co_code), digest(cells)))
            launch_config = getattr(self, "_launch_config_key", None)  # as numba-cuda's CUDACache adds it
            return key if launch_config is None else key + (("launch_config", launch_config),)

    return ClosureCache


@functools.cache
def _keyed_files(base):
    """``base``, Numba's index and data files of a function's cache (``IndexDataCacheFile``), with
    each entry's data file named by its key's digest.

    Numba names a new entry's file by the first number its index does not use. Two processes that
    compile two entries of one function at once (two specializations of a kernel factory's
    function, on two workers with one cache folder) both read the index without the other's entry,
    take the same number and write the same file: the index then sends one key to the other's
    machine code, and a later process loads a wrong kernel without a word (seen once in the GPU
    tests, twelve processes on one cache: a detrending twin of another degree). Numbered by key,
    a file only ever holds that key's code; a race can only lose an index entry (compiled again
    later). The data is written before the index names it, and an index entry whose file is not
    the key's own (one Numba numbered) is a miss."""

    class KeyedFiles(base):
        def _keyed_name(self, key) -> str:
            import hashlib

            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
            return self._data_name_pattern.replace("{number:d}", digest)

        def save(self, key, data):
            name = self._keyed_name(key)
            self._save_data(name, data)
            overloads = self._load_index()
            if overloads.get(key) != name:
                overloads[key] = name
                self._save_index(overloads)

        def load(self, key):
            if self._load_index().get(key) != self._keyed_name(key):
                return None
            try:
                return self._load_data(self._keyed_name(key))
            except OSError:  # removed while the index named it
                return None

    KeyedFiles.__name__ = KeyedFiles.__qualname__ = f"Keyed{base.__name__}"
    return KeyedFiles


@functools.cache
def _cpu_cache():
    from numba.core.caching import FunctionCache

    return _closure_cache(FunctionCache)


@functools.cache
def _cuda_cache():
    from numba.cuda.dispatcher import CUDACache

    try:
        import numba_cuda  # the numba-cuda package (Numba's built-in CUDA target before it)

        version = (numba_cuda.__version__,)
    except ImportError:
        version = ()

    class KernelCache(_closure_cache(CUDACache, *version)):
        def load_overload(self, sig, target_context):
            """The kernel, loaded onto the GPU before the dispatcher lists it. numba-cuda loads a
            compiled kernel so, but one from the disk cache at its first launch, which other
            threads reach as soon as it is listed: two loads of one image, and numba-cuda 0.30
            failed with "key already in dictionary: <CUlibrary ...>"."""
            kernel = super().load_overload(sig, target_context)
            if kernel is not None:
                kernel.bind()
            return kernel

    return KernelCache


@once
def cpu_loop(fn):
    """``fn``, a loop defined at a module's top level, compiled for the CPU by Numba once per
    process: releasing the GIL, with NumPy's float semantics (a division by zero gives inf or NaN,
    as the array formulas and the GPU do, rather than raising), and cached on disk, so that a new
    process loads it instead of compiling it again: where ``pipeline.cache-dir`` says
    (:func:`use_cache_dir`, before Numba picks the cache's folder), not beside the package's source,
    in a distributed worker's process too. Its cache is :func:`cpu_jit`'s (``_keyed_files``: two
    processes compiling it for two dtypes at once never share a file)."""
    import numba

    use_cache_dir()
    dispatcher = numba.njit(nogil=True, error_model="numpy")(fn)
    dispatcher._cache = _cpu_cache()(fn)  # what cache=True sets, with keyed files
    return dispatcher


def numba_cuda():
    """``numba.cuda``. A module that defines ``@cuda.jit`` kernels keeps it in a module global
    named ``cuda``: Numba's CUDA simulator swaps the globals of a kernel that are this module."""
    # numba-cuda 0.30 registers an overload for np.row_stack when it first compiles a kernel; NumPy
    # 2.5 removed that alias (deprecated since 2.0), and the compile then fails with AttributeError.
    # Restoring the alias, which NumPy defined as vstack, lets those versions work together.
    if not hasattr(np, "row_stack") and config.patched("numpy-row-stack"):
        np.row_stack = np.vstack
    return _numba_cuda()


@once  # one thread imports it; the others wait (a background import may be under way: prepare_numba_cuda)
def _numba_cuda():
    use_cache_dir()  # before numba-cuda reads NUMBA_CACHE_DIR, at its import
    import numba
    from numba import cuda

    if not numba.config.ENABLE_CUDASIM:
        try:  # numba-cuda keeps its own copy of Numba's config
            from numba.cuda.core import config
        except ImportError:
            return cuda
        if not config.CACHE_DIR:
            config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
    return cuda


def prepare_numba_cuda() -> None:
    """Import ``numba.cuda`` and load its typing and lowering registries on a thread of their own,
    now, once per process, where Numba CUDA kernels will run (not under the CUDA simulator).

    Called when a graph that runs them is built: its first blocks are read and decoded meanwhile,
    mostly outside the GIL. Done at the first launch instead, it held up every Dask thread: in a
    second process on the GPU machine (kernels in the disk cache), the counting statistics' first
    run on 10 GB took 1.8 s, of which 0.9 s importing ``numba.cuda`` and 0.35 s loading its
    registries, with the blocks already on the device."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return
    _start_preparing()


@once
def _start_preparing() -> None:
    # not a daemon: the process's exit waits for it. A daemon thread still importing when the
    # interpreter finalizes is frozen where it stands, holding what it holds: on the H200, a
    # short genomics process that had printed its result then hung in its exit.
    threading.Thread(target=_prepare, name="pipeline-numba-cuda", daemon=False).start()


def _prepare() -> None:
    try:
        numba_cuda()
        from numba.cuda.descriptor import cuda_target

        with _compiler_lock():  # as numba-cuda refreshes them, before it loads a kernel
            cuda_target.target_context.refresh()
    except Exception:  # the kernel's own first launch reports what is wrong
        log.debug("preparing numba.cuda failed", exc_info=True)


def _compiler_lock():
    try:
        from numba.cuda.core.compiler_lock import global_compiler_lock
    except ImportError:
        from numba.core.compiler_lock import global_compiler_lock
    return global_compiler_lock


def cuda_kernel(fn):
    """``fn`` as a Numba CUDA kernel (``cuda.jit``), compiled on its first launch and kept in
    Numba's disk cache, so that a later process on the machine loads it instead of compiling it.

    The kernels are closures over their compile-time constants (ploidy, alleles, a tile's shape:
    the sizes of ``cuda.local.array`` and ``cuda.shared.array``), built by factories, and
    ``cache=True`` would key them by an identity new in every process (:func:`_closure_cache`).
    Each compilation takes 0.3-1 s and holds Numba's compiler lock, which the other threads
    wait on: compiled in every process, they were most of a first run (docs/genomics.md)."""
    import numba

    kernel = numba_cuda().jit(fn)
    if not numba.config.ENABLE_CUDASIM:
        kernel._cache = _cuda_cache()(fn)
        kernel.compile = _counted(kernel.compile)
    return kernel


def _counted(compile_):
    """``compile_`` (a CUDA kernel's ``compile``, which loads from the disk cache or compiles)
    counted by :class:`compiling`, once it holds Numba's compiler lock: numba-cuda sends no
    compile events for kernels. (Threads waiting on the lock are not counted.)"""
    global_compiler_lock = _compiler_lock()
    name = compile_.__self__.py_func.__qualname__

    @functools.wraps(compile_)
    def compile(sig):
        with global_compiler_lock, compiling():
            start = time.perf_counter()
            try:
                return compile_(sig)
            finally:
                log.debug("CUDA kernel %s: %.3f s (compiled or loaded from the disk cache)", name,
                          time.perf_counter() - start, extra={"kernel": name})

    return compile


def launch_numba(kernel, npts: int, *args, threads: int | tuple[int, ...] = THREADS, grid: tuple[int, ...] | None = None):
    """Launch the Numba CUDA ``kernel`` over ``npts`` points, ``threads`` to a block (or on
    ``grid`` blocks of ``threads``, a shape each, where the kernel's threads are not one a point).

    CuPy arguments: on CuPy's current stream, so the kernel is ordered with CuPy's work on it
    without the host waiting. By default numba-cuda would synchronise the host with the stream each
    CuPy argument names, and launch on the legacy default stream, which serialises every Dask
    thread behind the GPU. Anything else (NumPy under the simulator) is launched as it is.
    """
    cuda = numba_cuda()
    if grid is None:
        grid = blocks(npts, threads)
    if any(hasattr(a, "__cuda_array_interface__") for a in args) and hasattr(cuda, "external_stream"):
        import cupy

        stream = cuda.external_stream(cupy.cuda.get_current_stream().ptr)
        args = [cuda.as_cuda_array(a, sync=False) if hasattr(a, "__cuda_array_interface__") else a for a in args]
        kernel[grid, threads, stream](*args)
    else:
        kernel[grid, threads](*args)
