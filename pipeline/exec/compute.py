"""Computing a graph: on the current distributed client, or on dask's threads in this process,
with the memory plan's number of threads; a failed or interrupted computation returns only once
no task of it still runs.
"""

from __future__ import annotations

import contextlib
import sys
import warnings

import xarray as xr

from .. import backend as B
from .. import config
from ..deferred import module as _deferred

da = _deferred("dask.array")  # imported when the first graph is built


def _arrays_of(obj):
    """The arrays of ``obj``: a DataArray, a Dataset, an array, or a list, tuple or dict of them
    (what ``dask.compute`` accepts)."""
    if isinstance(obj, xr.DataArray):
        yield obj.data
    elif isinstance(obj, xr.Dataset):
        yield from (v.data for v in obj.variables.values())
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from _arrays_of(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _arrays_of(item)
    else:
        yield obj


def _graph_sizes(obj) -> tuple[str, int, int, int, int, tuple] | None:
    """The backend of ``obj``'s arrays, their graphs' largest block and largest reduction
    partial, the blocks a thread may hold, the bytes kept whole and the reductions' merges
    (:mod:`pipeline.exec.memory`), or None without arrays."""
    from . import memory

    arrays = [a for a in _arrays_of(obj) if isinstance(a, da.Array)]
    if not arrays:
        return None
    backend = memory.graph_backend(*arrays)
    return (
        backend, memory.graph_block_bytes(*arrays), memory.graph_partial_bytes(*arrays),
        memory.graph_blocks_per_thread(*arrays), memory.graph_held(backend, *arrays),
        memory.graph_merges(*arrays),
    )


def compute_threads(obj) -> int | None:
    """Threads for computing ``obj`` in this process, from :func:`pipeline.exec.memory.threads_for`:
    ``pipeline.gpu.threads`` when its data is on the GPU (a few threads keep a GPU busy, and chunk
    files are read by pipeline's own I/O pool), dask's default otherwise; fewer where that many
    threads, each holding a few blocks, would exceed the backend's memory limit."""
    from . import memory

    sizes = _graph_sizes(obj)
    return None if sizes is None else memory.threads_for(*sizes)


def _room_to_read_ahead(obj, fits: dict, nthreads: dict) -> bool:
    """Whether each worker can hold what it may read ahead once its slab is placed on it.

    Placing slabs pins each worker's reads, and the scheduler queues no pinned task: a worker
    reads ahead of its threads, up to twice the blocks that the same threads hold in one process
    (benchmarks/live_blocks.py), or at most its whole slab. Where neither fits a worker's budget
    (``fits``: threads that fit and budget, from :func:`pipeline.exec.memory.check_workers`), the
    scheduler places the blocks instead, and its queuing bounds the reads a worker holds
    (worker-saturation)."""
    from . import memory

    if not fits:
        return True
    slab = memory.graph_array_bytes(*(a for a in _arrays_of(obj) if isinstance(a, da.Array))) / max(len(nthreads), 1)
    return all(nthreads.get(w, 0) <= fit // 2 or slab <= budget / 2 for w, (fit, budget) in fits.items())


def active_client():
    """The distributed client computations go to (``distributed.default_client()``), or None.
    Without distributed imported there is no client: importing it only to find none cost a local
    run 0.3-0.75 s of its first computation."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


@contextlib.contextmanager
def distributed_not_imported():
    """Within it, dask does not import distributed only to look for distributed's tasks in a graph
    that cannot hold any, where distributed is not imported yet.

    ``dask.delayed`` of a collection (as ``xarray.Dataset.to_zarr(compute=False)`` makes, to close
    its store after the writes) builds its graph through ``ProhibitReuse``, which imports
    ``distributed.shuffle._core`` to find its ``P2PBarrierTask``s, and imports all of distributed
    with it: 0.65-1.0 s of a one-shot ``pipeline run`` on the GPU machine. Such a task exists only
    once distributed is imported; until then dask's own fallback (the module missing) is exact, so
    the module is marked missing (``None`` in ``sys.modules``) for the duration and unmarked after.
    """
    name = "distributed.shuffle._core"
    if "distributed" in sys.modules or not config.patched("distributed-shuffle-import"):
        yield
        return
    sys.modules[name] = None
    try:
        yield
    finally:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def skip_client_lookup() -> None:
    """Let dask choose its scheduler without importing distributed where distributed is not
    imported yet: the arrays pipeline opens compute as dask would compute them, without that cost.

    With no scheduler set, dask's ``get_scheduler`` imports distributed (``from distributed import
    get_client``) to look for a default client, and a scheduler named by a string (``"threads"``)
    imports it to check for one: 0.13 s of a user's first ``.values`` on the 2-core machine (and
    distributed's import took 0.65-1.0 s on the GPU machine). A client exists only once
    distributed is imported; until then the lookup's answer is known (none), and this answers as
    dask does after it: the named scheduler, or the collections' own (dask's threads for arrays).
    With distributed imported (a client made, a cluster attached), dask's own function decides.
    Installed once, by :func:`pipeline.open_dataset` and the import of :mod:`pipeline.genomics`;
    the setting ``pipeline.patches`` governs it (``dask-client-lookup``), where it is installed and
    as it is called."""
    if not config.patched("dask-client-lookup"):
        return
    import dask
    import dask.base

    _skip_rechunk_client_lookup()
    original = dask.base.get_scheduler
    if hasattr(original, "__pipeline_original__"):
        return
    try:
        import inspect

        if tuple(inspect.signature(original).parameters) != ("get", "scheduler", "collections", "cls"):
            return  # not the function this was written against
    except (TypeError, ValueError):
        return

    def get_scheduler(get=None, scheduler=None, collections=None, cls=None):
        if get is None and "distributed" not in sys.modules and config.patched("dask-client-lookup"):
            chosen = scheduler if scheduler is not None else dask.config.get("scheduler", None)
            if isinstance(chosen, str) and chosen.lower() in dask.base.named_schedulers:
                return dask.base.named_schedulers[chosen.lower()]
            if chosen is None and dask.config.get("get", None) is None:
                if cls is not None:
                    return cls.__dask_scheduler__
                found = [c for c in collections or () if c is not None]
                if not found:
                    return None
                if all(c.__dask_scheduler__ == found[0].__dask_scheduler__ for c in found):
                    return found[0].__dask_scheduler__
        return original(get=get, scheduler=scheduler, collections=collections, cls=cls)  # dask decides (or raises)

    get_scheduler.__doc__ = original.__doc__
    get_scheduler.__pipeline_original__ = original
    dask.base.get_scheduler = get_scheduler


def _skip_rechunk_client_lookup() -> None:
    """The same for dask's rechunk, which chooses its method (``tasks`` or distributed's ``p2p``)
    by importing distributed to look for a client: 0.16 s of a GWAS flow's 2.5 s process on 2 cores.
    Where distributed is not imported the answer is ``tasks``. Made once ``dask.array`` is imported
    (:func:`pipeline.open_dataset` imports it; importing :mod:`pipeline.genomics` does not)."""
    import dask

    rechunk = sys.modules.get("dask.array.rechunk")
    original = getattr(rechunk, "_choose_rechunk_method", None)
    if original is None or hasattr(original, "__pipeline_original__"):
        return
    try:
        import inspect

        if tuple(inspect.signature(original).parameters) != ("old_chunks", "new_chunks", "threshold"):
            return  # not the function this was written against
    except (TypeError, ValueError):
        return

    def choose_rechunk_method(old_chunks, new_chunks, threshold=None):
        if ("distributed" not in sys.modules and dask.config.get("array.rechunk.method", None) is None
                and config.patched("dask-client-lookup")):
            return "tasks"
        return original(old_chunks, new_chunks, threshold)

    choose_rechunk_method.__pipeline_original__ = original
    rechunk._choose_rechunk_method = choose_rechunk_method


def compute(obj, progress: bool = False, threads: int | None = None, blocks: dict | None = None):
    """:func:`_compute`, its seconds added to ``state.computed`` (:func:`seconds_computed`)."""
    import time

    from .. import state

    t = time.perf_counter()
    try:
        return _compute(obj, progress, threads, blocks)
    finally:
        with state.computed.lock:
            state.computed.seconds += time.perf_counter() - t


def seconds_computed() -> float:
    """The seconds this process has spent in :func:`compute` (computations on other threads at
    the same time add up)."""
    from .. import state

    with state.computed.lock:
        return state.computed.seconds


def _compute(obj, progress: bool = False, threads: int | None = None, blocks: dict | None = None):
    """Compute on the current distributed client if there is one, else on dask's threads
    (``threads`` of them; by default ``pipeline.gpu.threads`` for data on the GPU, else dask's
    ``num_workers`` or one per core). ``blocks``: the sizes of the blocks as the graph was built
    (:func:`pipeline.exec.order.block_bytes`), for a graph that was optimized before it came here.
    BLAS runs on one thread meanwhile, as on a cluster's workers
    (:func:`pipeline.kernels.launch.one_blas_thread`): dask's threads, and the workers of a
    cluster in this process (``processes=False``), share this process's BLAS.

    When the computation fails or is interrupted, this returns only once no task of it is still
    running, so that the caller can remove what the tasks wrote without a late write
    re-creating it.
    """
    import dask

    from ..kernels import launch

    client = active_client()
    if client is not None:
        with launch.one_blas_thread():  # for the workers of a cluster in this process
            return _compute_on_cluster(client, obj, progress)
    if dask.config.get("scheduler", None) not in (None, "threads", "threading"):
        return dask.compute(obj)[0]  # a scheduler the user chose: leave it alone
    import functools
    from concurrent.futures import ThreadPoolExecutor

    from dask.system import CPU_COUNT
    from dask.threaded import get as threaded_get

    if "cupy" in sys.modules:  # CuPy's own kernels compiled once however many of the threads ask
        from ..kernels.copies import prepare_cupy

        prepare_cupy()
    if threads is None:
        threads = compute_threads(obj)
    pool = ThreadPoolExecutor(threads or dask.config.get("num_workers", None) or CPU_COUNT)
    try:
        bar = contextlib.nullcontext()
        if progress:
            from dask.diagnostics import ProgressBar

            bar = ProgressBar(out=sys.stderr)
        with bar, _threads_config(pool), _reading_ahead(), launch.one_blas_thread():
            # the scheduler as a function: named by a string, dask imports distributed to look
            # for a client first (0.3 s of a first run)
            return _compute_here(obj, functools.partial(threaded_get, pool=pool), blocks)
    finally:
        # dask's own pool would leave running tasks behind after an error; this one is joined
        pool.shutdown(wait=True, cancel_futures=True)


B.set_compute(compute)  # pipeline.to_numpy computes through it (pipeline.backend can not import this layer)


@contextlib.contextmanager
def _threads_config(pool):
    """dask's config names the threaded scheduler and a running computation's ``pool`` while this
    one runs (what a task's own dask computations run on), shared with the computations running
    at once on other threads. dask's config is one dictionary for the process, and a
    ``dask.config.set`` restores what it found when it ends: two computations on two threads,
    the first ending first, left the scheduler and the first one's pool, shut down, in it, and
    every dask computation after them failed ("cannot schedule new futures after shutdown").
    Here the first sets both, the others only the pool, which goes back to one still running as
    each ends, and the last restores what the first found."""
    import dask

    from .. import state

    with state.threads.lock:
        if not state.threads.pools:
            state.threads.setting = dask.config.set(pool=pool, scheduler="threads")
        else:
            dask.config.set(pool=pool)  # undone by the first one's setting, as it ends
        state.threads.pools.append(pool)
    try:
        yield
    finally:
        with state.threads.lock:
            state.threads.pools.remove(pool)
            if state.threads.pools:
                dask.config.set(pool=state.threads.pools[-1])
            else:
                setting, state.threads.setting = state.threads.setting, None
                setting.__exit__(None, None, None)


def _reading_ahead():
    """On the GPU, sources of one-frame chunks larger than half of the device budget are decoded
    on the host ahead of their tasks while the computation runs (:mod:`pipeline.gpu.ahead`)."""
    if "cupy" not in sys.modules:
        return contextlib.nullcontext()
    from ..gpu import ahead

    return ahead.reading_ahead()


def _compute_here(obj, schedule, blocks: dict | None = None):
    """``dask.compute(obj, scheduler=schedule)[0]``, each Dask array's blocks assembled by
    :func:`_finalize_array`: the graph optimized as ``dask.compute`` would, its output blocks
    computed, and every other collection finished by its own finalizer. The small reads that
    dask's order leaves to the end start among the large ones (:mod:`pipeline.exec.order`)."""
    from dask.base import collections_to_expr, unpack_collections
    from dask.callbacks import Callback

    from .order import block_bytes, start_state

    collections, repack = unpack_collections(obj)
    if not collections:
        return obj
    try:  # as built: optimizing fuses layers; a hint on the order, never a reason to fail
        sizes = block_bytes(collections) if blocks is None else blocks
    except Exception:
        sizes = {}
    expr = collections_to_expr(list(collections), optimize_graph=True).optimize()
    # handed to this computation alone, with the callbacks active here (a progress bar): entering
    # a Callback adds it to dask's global set, which a computation on another thread would see
    callbacks = [*Callback.active, Callback(start_state=start_state(sizes))._callback]
    blocks = schedule(expr, [c.__dask_keys__() for c in collections], callbacks=callbacks)
    return repack([_postcompute(c, b) for c, b in zip(collections, blocks)])[0]


def _postcompute(collection, blocks):
    import dask.array as da

    post, args = collection.__dask_postcompute__()
    if isinstance(collection, da.Array) and post is da.core.finalize and not args:
        return _finalize_array(blocks)
    return post(blocks, *args)


def _finalize_array(blocks):
    """dask's ``finalize`` of an array's blocks (joined, or the one block copied, so that the
    result shares no buffer with the graph), the copy of a lone CuPy block by the copy engine:
    CuPy's copy is a kernel that a fresh machine compiled for each dtype (0.1-0.2 s each, two or
    three for the statistics of a genomics run)."""
    import dask.array as da

    one = blocks
    while isinstance(one, (tuple, list)) and len(one) == 1:
        one = one[0]
    if isinstance(one, (tuple, list)) or "cupy" not in sys.modules or not B.is_cupy(one):
        return da.core.finalize(blocks)
    from ..kernels.copies import copy_of

    return copy_of(one)


def _compute_on_cluster(client, obj, progress: bool):
    """``obj`` computed on ``client``'s cluster: the memory plan checked with each worker's own
    budget and threads, blocks placed in slabs (:mod:`pipeline.exec.locality`), the result's
    blocks gathered here."""
    from . import memory

    from . import serialize

    serialize.register_aligned()  # NumPy results come back aligned (pipeline.exec.serialize)
    if "cupy" in sys.modules:  # CuPy results come back without importing Numba
        serialize.register()
    nthreads = client.nthreads()  # one round trip: the workers now, for every step below
    # a worker plugin stays with the cluster, for the workers that join later too: once a client
    _plugin_on(client, (client.id, client.scheduler.address), serialize.AlignedArrays())
    sizes = _graph_sizes(obj)
    fits = memory.check_workers(client, *sizes, nthreads=nthreads) if sizes is not None else {}
    placed = False
    if config.get("cluster.locality", True) and _room_to_read_ahead(obj, fits, nthreads) and _release_pins_on(client, nthreads):
        # each worker reads, maps and reduces a contiguous slab of blocks, in both passes of a
        # two-pass op, so that only partials and statistics cross workers (pipeline.exec.locality)
        from .locality import place

        obj, placed = place(obj, nthreads)
    futures, finish = _submit(client, obj, optimize=not placed)  # place() optimized it already
    try:
        if progress:
            from distributed import progress as show_progress

            show_progress(futures)
        return finish(client.gather(futures))
    except BaseException:
        client.cancel(futures)
        _wait_idle(client, _tokens(obj))
        raise


def _release_pins_on(client, nthreads: dict) -> bool:
    """Whether the scheduler holds :class:`pipeline.exec.locality.ReleasePins` (which unpins the
    blocks of a worker that leaves)."""
    from .locality import ReleasePins
    from .memory import cluster_key

    return _plugin_on(client, cluster_key(client, nthreads), ReleasePins(), "blocks are left to the scheduler to place")


def _plugin_on(client, key: tuple, plugin, otherwise: str = "") -> bool:
    """Whether the cluster holds ``plugin`` (a scheduler or worker plugin of distributed's, with a
    ``name``), registering it once per ``key`` (such as :func:`pipeline.exec.memory.cluster_key`):
    registering costs a round trip to the scheduler. Where it fails (e.g. a scheduler or worker
    that cannot import pipeline), a warning ends with ``otherwise``, what the run does without it."""
    from .. import state

    key = (key, plugin.name)
    with state.cluster.lock:
        if key in state.cluster.plugins:
            return True
    try:
        client.register_plugin(plugin)
    except Exception as e:
        warnings.warn(f"{otherwise or plugin.name + ' not registered'}: {type(e).__name__}: {e}", stacklevel=4)
        return False
    with state.cluster.lock:
        state.cluster.plugins.add(key)
    return True


def _submit(client, obj, optimize: bool):
    """Submit the graphs of ``obj`` (what ``client.compute`` takes) and return the futures of their
    output blocks and the function that makes the result of them here.

    ``client.compute`` would add a task that assembles each result on a worker: one more round of
    scheduling after the last block, and the blocks of other workers moved to that one before the
    result comes here. The blocks are gathered here instead, straight from the workers that hold
    them, and assembled by the collection's own finalizer (the same function that task runs).
    Unless ``optimize`` is False (a graph that :func:`pipeline.exec.locality.place` optimized), the
    graph is optimized here as ``client.compute`` would, then without its tasks that do next to
    nothing (:func:`pipeline.exec.locality.lean`)."""
    from dask.base import collections_to_expr, unpack_collections

    from .locality import is_frame, lean
    from .optimize import optimized

    collections, repack = unpack_collections(obj)
    if not collections:
        return [], lambda _: obj
    if optimize and not any(is_frame(c) for c in collections):  # dask's frames optimize below, as expressions
        collections = lean(optimized(collections))
    expr = collections_to_expr(list(collections), optimize_graph=False).optimize()
    futures = client.get(expr, [c.__dask_keys__() for c in collections], sync=False)

    def finish(blocks):
        return repack([post(b, *args) for b, (post, args) in zip(blocks, (c.__dask_postcompute__() for c in collections))])[0]

    return futures, finish


def _tokens(obj) -> set[str]:
    """The tokens (the hex part of key names) of the graphs of ``obj``: a task whose key holds one
    of them, fused with others or not, is a task of this computation."""
    import re

    from dask.base import unpack_collections
    from dask.core import flatten

    collections, _ = unpack_collections(obj)
    names = set()
    for c in collections:
        names.update(getattr(c.__dask_graph__(), "layers", {}) or ())
        names.update(str(k[0] if isinstance(k, tuple) else k) for k in flatten(c.__dask_keys__()))
    return {t for n in names for t in re.findall(r"[0-9a-f]{32}", n)} or names


def _running_keys(dask_worker) -> list[str]:
    """On a worker: the keys of the tasks its threads run, cancelled ones included (a cancelled
    task that already started runs to its end)."""
    return [str(ts.key) for ts in dask_worker.state.all_running_tasks]


def _wait_idle(client, tokens: set[str], timeout: float = 120.0) -> None:
    """Wait until no worker runs a task of this computation (``tokens``, see :func:`_tokens`):
    after a cancel, tasks that started still run to their end, and their writes with them. The
    scheduler forgets cancelled tasks at once, so each worker is asked what its threads run."""
    import time

    deadline = time.monotonic() + timeout
    quiet = 0
    running: list[str] = []
    while time.monotonic() < deadline:
        try:
            answers = client.run(_running_keys, on_error="return")
        except Exception:
            return  # the cluster is gone: nothing of ours runs on it
        running = [k for keys in answers.values() if isinstance(keys, list) for k in keys if any(t in k for t in tokens)]
        quiet = 0 if running else quiet + 1
        if quiet >= 2:  # twice in a row: no task was about to start between two answers
            return
        time.sleep(0.1)
    warnings.warn(f"after {timeout:.0f} s, {len(running)} task(s) of the cancelled computation still run on the workers", stacklevel=3)
