"""Memory: what a computation will hold, checked against the configured budget before it starts,
and what it did hold, for the report.

The plan is deliberately simple, and errs high. It counts, against ``pipeline.<backend>.memory-limit``:

- on the CPU, the process itself: what it holds when the plan is made (the interpreter, NumPy,
  xarray, dask, zarr, Numba: about 160 MB) and what the first tasks add once (Numba's compiled
  kernels, zarr's codecs and I/O threads): the limit is one on the process's resident set;
- what stays alive across tasks: the input, where it is not out of core (two-pass ops keep it
  between their passes), and the arrays that a layer declares it keeps whole (``held_bytes``: a
  rechunk that gathers a whole axis, as quantiles do, holds every block of its input);
- for each of the scheduler's threads, the few blocks it holds at a time (its input block, its
  output, one temporary), the temporaries of its kernels (the CPU's array formulas work through a
  block slab by slab: a few slabs, as the kernels declare, :func:`work_bytes`), and the partials
  of a reduction's merge: its inputs, what it lays side by side, its output (:func:`graph_trees`);
- once for each graph, the partials that wait in a reduction's tree for their siblings: up to
  one merge's inputs less one at each level (:func:`graph_trees`); and the pieces of blocks that
  wait to be joined where dask takes groups of steps (:func:`graph_gathers`).

An input larger than half of the budget is never held whole, because two-pass ops hold it in
pinned host memory or read it again (:func:`pipeline.exec.spill.second_pass`). A plan over budget
is an error that names the setting to change, raised before any task runs, rather than an
out-of-memory failure an hour in.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

import dask.array as da

from .. import backend as B
from .. import config, state
from ..errors import InputError
from ..reduce.declare import declared
from ..reduce.overlap import HALO_BLOCKS

# a thread holds about three blocks at a time: its input, its output and one temporary (for a
# reading task, the block's compressed bytes). Measured under a 4 GB GPU limit (18.2 GB in blocks
# of 303 MB): monthly means ran with three threads (device pool peak 3.33 GiB) and the
# standardized anomaly with five (3.39 GiB)
BLOCKS_PER_THREAD = 3
# Under a device budget, blocks are not cut below this to keep every configured thread: each block
# costs a task, its kernels' launches and its copies whatever its size. On an H200, 6.06 GB of Zarr
# v2 Blosc (one step a chunk) under a 1.5 GB budget ran its second pass (copies back from host
# memory, the anomaly, the weighted mean) over 163 blocks of 37 MB on 8 threads in 0.70 s, and
# over 20 blocks of 303 MB on one thread (Zarr v3) in 0.24 s.
MIN_GPU_BLOCK = 128 * 2**20
# a thread merging partials holds two of them besides its blocks (its result and one input), where
# a reduction declares no more (:func:`graph_trees`)
PARTIALS_PER_THREAD = 2
# on the CPU, what a process adds to its resident set once the computation starts, besides its
# blocks: Numba's compiled kernels, zarr's codecs and I/O threads, dask's thread pool (the
# shipped flows on 5 MB blocks, two threads, peaked 160 to 290 MB over the resident set at
# planning, their blocks and temporaries included: tests/test_memory_rss.py)
RUNTIME_BYTES = 128 * 2**20


@dataclass(frozen=True)
class Plan:
    backend: str
    threads: int
    block_bytes: int  # the largest block of the input or the result
    input_bytes: int
    budget_bytes: int
    out_of_core: bool
    partial_bytes: int = 0  # the largest partial a block's task makes (the merges: ``merges``)
    blocks_per_thread: int = BLOCKS_PER_THREAD
    merges: tuple = ()  # the reductions' merges: (bytes one holds, how many), largest first
    work_bytes: int = 0  # kernels' temporaries a thread (work_bytes)
    baseline_bytes: int = 0  # the process before its first block (CPU: resident set and RUNTIME_BYTES)
    held_bytes: int = 0  # arrays kept whole while the computation runs, and partials waiting in trees
    tree_bytes: int = 0  # of held_bytes: the partials waiting in a reduction's tree
    gather_bytes: int = 0  # of held_bytes: the pieces waiting in dask's takes

    @property
    def thread_bytes(self) -> int:
        """Bytes one thread may hold."""
        return per_thread_bytes(self.block_bytes, self.partial_bytes, self.blocks_per_thread, self.work_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.baseline_bytes + self.held_bytes + threads_bytes(self.threads, self.thread_bytes, self.merges)

    def as_dict(self) -> dict:
        return {**asdict(self), "thread_bytes": self.thread_bytes, "peak_bytes": self.peak_bytes}


def block_target(backend: str) -> int:
    """Bytes that blocks of whole stored chunks aim for on ``backend`` (0: one stored chunk a
    block): ``pipeline.gpu.block-size`` on the GPU, less where ``pipeline.gpu.threads`` threads of
    such blocks would not fit the device budget; ``pipeline.cpu.block-size`` on the CPU."""
    size, hold, threads = block_limits(backend)
    return min(size, hold // threads) if hold else size


def block_limits(backend: str) -> tuple[int, int, int]:
    """(size, hold, threads): the largest block of whole stored chunks on ``backend`` (0: one
    stored chunk a block), the bytes the blocks of all the threads together may take, and the
    threads (0, 0 on the CPU: no cap but ``pipeline.cpu.block-size``).

    An array of fewer blocks than threads is held by as many threads as it has blocks, so its
    blocks may grow past ``hold / threads`` up to ``size``
    (:func:`pipeline.sources.blocks_along_first`)."""
    from dask.utils import parse_bytes

    if backend != "gpu":
        size = config.get("cpu.block-size", None)
        return (parse_bytes(size) if size else 0), 0, 0
    size = config.get("gpu.block-size", None)
    if not size:
        return 0, 0, 0
    threads = max(1, int(config.get("gpu.threads", 8)))
    # before any op is known: as many blocks a thread as the ops that hold the most
    hold = int(B.memory_budget("gpu") // (BLOCKS_PER_THREAD + HALO_BLOCKS))
    # under a small budget, fewer threads of blocks of MIN_GPU_BLOCK rather than more of smaller ones
    threads = max(1, min(threads, hold // MIN_GPU_BLOCK))
    return parse_bytes(size), hold, threads


def min_blocks(backend: str) -> int:
    """Blocks along the first dimension that grouping stored chunks must leave on ``backend``: on
    the CPU two a thread, so that grouping small chunks never idles a core (on the GPU, blocks as
    large as the target decode fastest)."""
    if backend == "gpu":
        return 0
    import dask
    from dask.system import CPU_COUNT

    return 2 * int(dask.config.get("num_workers", None) or CPU_COUNT)


def largest_block(*arrays: da.Array) -> int:
    sizes = [math.prod(max(c) if c else 1 for c in a.chunks) * a.dtype.itemsize for a in arrays if isinstance(a, da.Array)]
    return max(sizes, default=0)


def layer_bytes(layer, per_value: int | None = None) -> int | None:
    """Bytes of the largest block of an array's layer (``per_value`` bytes a value, else its
    dtype's), from the annotations dask keeps on it."""
    ann = getattr(layer, "collection_annotations", None) or {}
    try:
        return math.prod(ann.get("chunksize")) * (per_value or np.dtype(ann.get("dtype")).itemsize)
    except TypeError:  # a layer that is not an array's
        return None


def _layers(arrays):
    """(layer, declaration) of every layer in the graphs of ``arrays``. A layer that declares
    nothing (dask's own reductions too) counts as an array of its own, at its blocks' size: for a
    reduction's first step, that of its input's blocks, which errs high."""
    for a in arrays:
        for layer in getattr(a.__dask_graph__(), "layers", {}).values():
            yield layer, declared(layer)


def _array_layers(arrays):
    """The layers of the graphs of ``arrays`` that hold arrays of their own: not views, nor
    reductions' partials."""
    for layer, d in _layers(arrays):
        if not (d.get("view") or "partial_bytes" in d):
            yield layer, d


def graph_backend(*arrays: da.Array) -> str:
    """"gpu" where any array in the graphs of ``arrays`` holds CuPy blocks (its intermediates too:
    statistics computed on the device and copied to the host as the last step are planned against
    the device's budget), else "cpu"."""
    if any(B.backend_of(a) == "gpu" for a in arrays):
        return "gpu"
    for layer, _ in _layers(arrays):
        ann = getattr(layer, "collection_annotations", None) or {}
        if str(ann.get("chunk_type", "")).startswith("cupy"):
            return "gpu"
    return "cpu"


def graph_block_bytes(*arrays: da.Array) -> int:
    """The largest block of any array in the graphs of ``arrays``: their inputs and intermediates
    too, as dask records them on each layer, not only the (often tiny) results."""
    sizes = (d["block_bytes"] if "block_bytes" in d else layer_bytes(layer) or 0 for layer, d in _array_layers(arrays))
    return max([largest_block(*arrays), *sizes])


def graph_array_bytes(*arrays: da.Array) -> int:
    """The largest whole array in the graphs of ``arrays`` (typically their input)."""
    sizes = [a.nbytes for a in arrays]
    for layer, _ in _array_layers(arrays):
        ann = getattr(layer, "collection_annotations", None) or {}
        try:
            sizes.append(math.prod(ann["shape"]) * np.dtype(ann["dtype"]).itemsize)
        except (KeyError, TypeError):  # a layer that is not an array's
            pass
    return int(max(sizes, default=0))


def graph_blocks_per_thread(*arrays: da.Array) -> int:
    """Blocks a thread may hold at once in the graphs of ``arrays``: BLOCKS_PER_THREAD, and the
    most ``extra_blocks`` that a layer declares (HALO_BLOCKS where a moving-window op cuts halos),
    or that the chunk function of one of dask's own reductions makes (:func:`graph_trees`), and
    GATHER_BLOCKS where the graph takes (:func:`graph_gathers`)."""
    declared_ = (d.get("extra_blocks", 0) for _, d in _layers(arrays))
    gathers = GATHER_BLOCKS if graph_gathers(*arrays).chunks else 0
    return BLOCKS_PER_THREAD + gathers + max([*declared_, *(t.extra_blocks for t in graph_trees(*arrays))], default=0)


class Tree(NamedTuple):
    """A reduction's tree in a graph, as the plan counts it."""

    partial_bytes: int  # the largest partial a block's task makes
    merges: tuple  # (bytes a merge holds: its inputs, what it lays side by side, its output; merges) a level
    waiting_bytes: int  # partials that may wait for their siblings at once: a merge's inputs less one, each level
    extra_blocks: int = 0  # blocks' worth of temporaries a thread holds besides its blocks as it makes a partial
    kind: str = ""  # the reduction: its chunk step's name, without its token
    level_waits: tuple = ()  # of a merge's inputs, the bytes that waited for it (all but one), a level


# dask's own reductions (``dask.array.reduction``: xarray's mean, std, max, ... on dask arrays) make
# layers "<combine>-partial-<token>" for each level but the last, "<aggregate>-aggregate-<token>",
# after one of the chunk function's; pipeline's reductions are built by the same function
_PARTIAL = re.compile(r"-partial-[0-9a-f]{32}$")
_AGGREGATE = re.compile(r"-aggregate-[0-9a-f]{32}$")
_TOKEN = re.compile(r"-[0-9a-f]{32}$")
# bytes a value of the partials of dask's own reductions that are not the result's dtype, by the
# chunk function's name: var and std carry a count, a total and the sum of squared deviations,
# mean a count and a total, the arg- reductions a value and its index; each merge lays its inputs
# side by side and computes formulas of that size (copies: its inputs, their copy and the
# temporaries); and the float64 copies of its block that the chunk function makes (var and std:
# the deviations from the block's mean, their squares, and on CuPy the squares with NaN replaced,
# where nansum failed for want of 274 MB on one H200 under a 1.5 GB budget; mean: the block in
# float64)
_DASK_PARTIALS = (("moment", 24, 3, 3), ("mean", 16, 3, 1), ("arg", 16, 2, 0))


def _tree(graph, last: str, declared_: dict) -> Tree | None:
    """The tree whose last step is the layer ``last`` of ``graph`` (a HighLevelGraph)."""
    steps = [last]
    while True:
        deps = [d for d in graph.dependencies.get(steps[-1], ()) if d in graph.layers]
        before = [d for d in deps if _PARTIAL.search(str(d))]
        if len(before) != 1:
            break
        steps.append(before[0])
    deps = [d for d in graph.dependencies.get(steps[-1], ()) if d in graph.layers]
    if len(deps) != 1:
        return None
    chunk = deps[0]
    counts = [len(graph.layers[n]) for n in (chunk, *reversed(steps))]
    fan_ins = [-(-a // max(b, 1)) for a, b in zip(counts[:-1], counts[1:])]
    waiting = min(len(steps) * (max(fan_ins) - 1), counts[0])
    kind = _TOKEN.sub("", str(chunk))

    def levels(copies: int, size: int) -> tuple:
        return tuple(((copies * k + 1) * size, n) for k, n in zip(fan_ins, counts[1:]))

    def waits(size: int) -> tuple:
        return tuple((k - 1) * size for k in fan_ins)

    if "partial_bytes" in declared_:  # pipeline's: a merge lays its inputs side by side, unless it says not
        size = int(declared_["partial_bytes"])
        merges = tuple(map(tuple, declared_.get("merges", levels(int(declared_.get("merge_copies", 2)), size))))
        return Tree(int(declared_.get("leaf_bytes", size)), merges, int(declared_.get("waiting_bytes", waiting * size)), 0, kind,
                    tuple(declared_.get("level_waits", waits(size))))
    layer = graph.layers[steps[-1]]
    ann = getattr(layer, "collection_annotations", None) or {}
    try:
        values, itemsize = math.prod(ann["chunksize"]), np.dtype(ann["dtype"]).itemsize
    except (KeyError, TypeError):
        return None
    per_value, copies, block_copies = next((rest for key, *rest in _DASK_PARTIALS if key in chunk), (max(itemsize, 8), 2, 0))
    size = values * per_value
    block_itemsize = np.dtype((getattr(graph.layers[chunk], "collection_annotations", None) or {}).get("dtype") or np.float32).itemsize
    return Tree(size, levels(copies, size), waiting * size, -(-block_copies * 8 // block_itemsize), kind, waits(size))


def graph_trees(*arrays: da.Array) -> list[Tree]:
    """The reductions' trees in the graphs of ``arrays``: pipeline's, as their builders declare
    them (:mod:`pipeline.reduce.declare`), and dask's own (xarray's reductions of dask arrays),
    sized from their layers.

    A tree merges ``k`` partials at a time, level by level. Measured on a 0.25-degree grid in
    blocks of 3 steps (122 blocks, 2 threads, dask's ``split_every`` of 4: four levels), the most
    partials alive at once were 14 of the moments' (the merging threads' inputs, and 3 or fewer
    waiting at each level); with the 4 seasons' standard deviations and the yearly maximum over
    the same blocks, 14 of the seasons' together and 7 of the maximum's. The trees of one
    reduction over parts of the data (the seasons) progress one after another with the data, and
    different reductions of the same blocks together: the plan counts the waiting partials of the
    largest tree of each reduction, once (:func:`graph_tree_bytes`), and the merges that threads
    may run at once (:func:`graph_merges`)."""
    trees = {}
    for a in arrays:
        graph = a.__dask_graph__()
        layers = getattr(graph, "layers", None)
        if layers is None:
            continue
        for name, layer in layers.items():
            if name in trees or not _AGGREGATE.search(str(name)):
                continue
            tree = _tree(graph, name, declared(layer))
            if tree is not None:
                trees[name] = tree
    return list(trees.values())


def graph_partial_bytes(*arrays: da.Array) -> int:
    """The largest partial that a block's task makes in the reductions of the graphs of
    ``arrays``, as they declare it (a group mean's: its block's groups; its merges are
    :func:`graph_merges`), or as dask's own reductions make it (:func:`graph_trees`)."""
    declared_ = (d.get("leaf_bytes", d.get("partial_bytes", 0)) for _, d in _layers(arrays))
    return max([*declared_, *(t.partial_bytes for t in graph_trees(*arrays))], default=0)


def graph_merges(*arrays: da.Array) -> tuple:
    """The merges of the reduction trees in the graphs of ``arrays``: ((bytes one holds, how many
    hold that), ...), largest first (:func:`graph_trees`). The few large merges at the top of a
    tree (a climatology's last, of every month's rows) are not every thread's.

    The partials that wait in the largest tree of each reduction are held (:func:`graph_tree_bytes`):
    when that tree's merge of a level runs, its inputs but one are those that waited, so one merge
    a level of that tree adds only the rest. (On one H200, monthly means over 6.06 GB under a 2 GB
    budget, one thread: the pool's use peaked at 1.12 GB, where the waiting partials and a whole
    top merge made a plan of 1.73 GB.)"""
    trees = graph_trees(*arrays)
    counted: dict = {}
    for t in trees:
        if t.waiting_bytes > getattr(counted.get(t.kind), "waiting_bytes", -1):
            counted[t.kind] = t
    count: dict = {}
    for t in trees:
        waits = t.level_waits if counted.get(t.kind) is t else ()
        held = t.waiting_bytes  # credit no more than the tree's waiting partials that are held
        for level, (size, n) in enumerate(t.merges):
            entries = [(size, n)]
            credit = min(waits[level], held) if level < len(waits) else 0
            if credit > 0:
                held -= credit
                entries = [(max(size - credit, 0), 1), (size, n - 1)]
            for size_, n_ in entries:
                if n_ > 0:
                    count[int(size_)] = count.get(int(size_), 0) + int(n_)
    return tuple(sorted(count.items(), reverse=True))


def threads_bytes(threads: int, thread_bytes: int, merges: tuple = ()) -> int:
    """The most that ``threads`` threads hold at once, each running a block's task
    (``thread_bytes``, :func:`per_thread_bytes`) or one of ``merges`` (largest first): a thread runs
    one task at a time, so the most is each thread's block task, but for the largest merges that
    outweigh it, one a thread. (On one H200 under a 1.5 GB budget, the standardized anomaly's 3
    threads of 141 MB blocks, whose merges take 9 partials of 25 MB, peaked at 0.99 GB of device
    memory: the two summed for each thread would have allowed one.)"""
    total = threads * thread_bytes
    for size, n in merges:
        if size <= thread_bytes or threads <= 0:
            break
        take = min(n, threads)
        total += take * (size - thread_bytes)
        threads -= take
    return total


def graph_tree_bytes(*arrays: da.Array) -> int:
    """Bytes of the partials that wait for their siblings in the reduction trees of the graphs of
    ``arrays``: the largest tree of each reduction (:func:`graph_trees`)."""
    largest: dict = {}
    for t in graph_trees(*arrays):
        largest[t.kind] = max(largest.get(t.kind, 0), t.waiting_bytes)
    return sum(largest.values())


# dask's take along an axis by a list of indices (``x.isel(time=[...])``: xarray's groupby without
# flox takes each group so) cuts each input block into pieces, one for each output block it feeds
# (tasks "shuffle-split-<token>"), and joins an output block's pieces once they are all made
_SPLIT = "shuffle-split-"
# blocks a thread holds besides its own where a graph takes (a gather's pieces, :func:`graph_gathers`)
GATHER_BLOCKS = 1


class Gathers(NamedTuple):
    """dask's takes in a graph, as the plan counts them (:func:`graph_gathers`)."""

    chunks: tuple  # the largest output block of each take, in bytes
    shared_bytes: int  # of the input blocks cut for several takes: their pieces but the largest


def graph_gathers(*arrays: da.Array) -> Gathers:
    """The takes (dask's ``take``, ``_shuffle``) in the graphs of ``arrays``.

    A piece waits for the other pieces of its output block. Measured live (the results dask's
    threaded scheduler keeps, by key) for xarray's ``groupby("time.season").std()`` without flox,
    four takes over days in blocks of about 36: on one thread, the pieces alive at once grew with
    the years of data (37, 49 and 102 MB of a 1-degree grid for 2, 4 and 8 years), because an
    input block that straddles two seasons is cut for both, and the piece of the season taken
    later waits; on one H200, 4 years of a 0.25-degree grid in blocks of 158 MB held 0.75-1.06 GB
    of pieces, where the plan counted none. The plan counts, held while the graph runs, the pieces
    of such shared blocks but the largest of each, and an output block of every take but one (the
    pieces of the blocks being joined); and a block a thread (GATHER_BLOCKS). Against the live
    peaks of 1 to 16 years, blocks of 9 to 158 MB and 1 to 16 threads, that count was 1.3 to 2.8
    times the most that was held."""
    chunks, pieces, seen = [], {}, set()
    for a in arrays:
        graph = a.__dask_graph__()
        layers = getattr(graph, "layers", None) or {}
        for name, layer in layers.items():
            mapping = getattr(layer, "mapping", None)
            if name in seen or not isinstance(mapping, dict):
                continue
            seen.add(name)
            splits = [(k, t) for k, t in mapping.items() if isinstance(k, tuple) and str(k[0]).startswith(_SPLIT)]
            if not splits:
                continue
            size = layer_bytes(layer)
            chunks.append(size or 0)
            itemsize = np.dtype((getattr(layer, "collection_annotations", None) or {}).get("dtype") or np.float64).itemsize
            for key, task in splits:
                src, n = _piece(graph, mapping, task, itemsize)
                if src is not None:
                    pieces[key] = (name, src, n if n is not None else size or 0)
    by_block: dict = {}
    for name, src, n in pieces.values():
        by_block.setdefault(src, []).append((name, n))
    shared = sum(sum(n for _, n in p) - max(n for _, n in p) for p in by_block.values() if len({m for m, _ in p}) > 1)
    return Gathers(tuple(sorted(chunks, reverse=True)), int(shared))


def _piece(graph, mapping: dict, task, itemsize: int) -> tuple:
    """(the input block's key, the piece's bytes or None) of a task that cuts a piece for a take:
    ``getitem(block, (1, (index, ...)))``, the index a list along the axis, slices elsewhere."""
    try:
        src = task.args[0].key
    except (AttributeError, IndexError, TypeError):  # dask's layout changed: not a piece the plan can place
        return None, None
    try:
        taker = mapping[task.args[1].key]
        index = (taker.value if hasattr(taker, "value") else taker)[1]
        ann = getattr(graph.layers.get(src[0]), "collection_annotations", None) or {}
        sizes = [c[i] for c, i in zip(ann["chunks"], src[1:])]
        return src, itemsize * math.prod(len(ix) if isinstance(ix, np.ndarray) else n for ix, n in zip(index, sizes))
    except (AttributeError, IndexError, KeyError, TypeError):  # sized as the whole output block
        return src, None


def graph_gather_bytes(*arrays: da.Array) -> int:
    """Bytes of the pieces that wait in the takes of the graphs of ``arrays`` (:func:`graph_gathers`)."""
    g = graph_gathers(*arrays)
    return g.shared_bytes + sum(g.chunks[1:]) if g.chunks else 0


def graph_held_bytes(*arrays: da.Array) -> int:
    """Bytes of the arrays that layers in the graphs of ``arrays`` declare they keep whole
    (``held_bytes``), each layer counted once."""
    held = {id(layer): d.get("held_bytes", 0) for layer, d in _layers(arrays)}
    return int(sum(held.values()))


def graph_held(backend: str, *arrays: da.Array) -> int:
    """Bytes kept whole while ``arrays`` are computed on ``backend``: the arrays their layers
    declare held, the partials waiting in their largest reduction tree (:func:`graph_tree_bytes`),
    the pieces waiting in their takes (:func:`graph_gather_bytes`), and their largest array (their
    input) where it is not out of core, as :func:`pipeline.exec.spill.second_pass` decides:
    two-pass ops keep it between their passes."""
    largest = graph_array_bytes(*arrays)
    in_core = 0 if B.out_of_core(largest, backend) else largest
    return graph_held_bytes(*arrays) + graph_tree_bytes(*arrays) + graph_gather_bytes(*arrays) + in_core


def process_baseline(backend: str, worker=None) -> int:
    """Bytes the process holds before its first block, on ``backend``: on the CPU its resident
    set now and RUNTIME_BYTES; on the GPU nothing of the device's budget.

    On a distributed worker, what the worker holds for the scheduler (its managed memory, which
    dask spills) is not baseline; a worker sharing its process with the client and other workers
    (``inproc://``, ``LocalCluster(processes=False)``) has no resident set of its own to count."""
    if backend == "gpu":
        return 0
    import psutil

    rss = int(psutil.Process().memory_info().rss)
    if worker is not None:
        if worker.address.startswith("inproc://"):
            return 0
        rss -= int(getattr(worker.state, "nbytes", 0) or 0)
    return max(rss, 0) + RUNTIME_BYTES


def work_bytes(backend: str, block_bytes: int) -> int:
    """Bytes of the kernels' temporaries that one thread holds at once, on ``backend``, with
    blocks of ``block_bytes``: the most slabs a kernel declares (:func:`pipeline.kernels.work_slabs`),
    each of :func:`pipeline.kernels.slabs.slab_bytes` (a few MB: the same for any block)."""
    from .. import kernels
    from ..kernels.slabs import slab_bytes

    return math.ceil(kernels.work_slabs(backend) * slab_bytes(block_bytes))


def per_thread_bytes(block_bytes: int, partial_bytes: int, blocks: int = BLOCKS_PER_THREAD, work: int = 0) -> int:
    """Bytes one thread may hold as it runs a block's task: ``blocks`` blocks, ``work`` bytes of
    its kernels' temporaries, and PARTIALS_PER_THREAD partials (the merges: :func:`threads_bytes`)."""
    return blocks * block_bytes + work + PARTIALS_PER_THREAD * partial_bytes


def threads_for(backend: str, block_bytes: int = 0, partial_bytes: int = 0, blocks: int = BLOCKS_PER_THREAD, held_bytes: int = 0,
                merges: tuple = ()) -> int:
    """Threads for a computation of ``block_bytes`` blocks (``blocks`` of them a thread, and its
    kernels' temporaries), ``partial_bytes`` partials and ``merges`` (:func:`graph_merges`),
    besides the process's baseline and ``held_bytes``: the configured number (``pipeline.gpu.threads``, or dask's ``num_workers`` /
    one per core), fewer when that many threads would hold more than the backend's memory
    budget, at least one."""
    import dask
    from dask.system import CPU_COUNT

    if backend == "gpu":
        threads = int(config.get("gpu.threads", 8))
    else:
        threads = int(dask.config.get("num_workers", None) or CPU_COUNT)
    fit = threads_that_fit(backend, block_bytes, partial_bytes, blocks, held_bytes, merges=merges, most=threads)
    return max(1, threads if fit is None else min(threads, fit))


def threads_that_fit(backend: str, block_bytes: int = 0, partial_bytes: int = 0, blocks: int = BLOCKS_PER_THREAD, held_bytes: int = 0,
                     worker=None, merges: tuple = (), most: int = 1024) -> int | None:
    """How many threads (up to ``most``), each holding ``blocks`` blocks of ``block_bytes``, its
    kernels' temporaries (:func:`work_bytes`) and PARTIALS_PER_THREAD partials of
    ``partial_bytes``, or running one of ``merges`` (:func:`threads_bytes`), fit this process's
    memory budget on ``backend`` once its baseline and ``held_bytes`` are counted (None: nothing
    to hold); ``worker``: the distributed worker it is evaluated on, if any."""
    per_thread = per_thread_bytes(block_bytes, partial_bytes, blocks, work_bytes(backend, block_bytes))
    if not per_thread:
        return None
    room = B.memory_budget(backend) - process_baseline(backend, worker) - held_bytes
    fit = 0
    while fit < most and threads_bytes(fit + 1, per_thread, merges) <= room:
        fit += 1
    return fit


def _fit_and_budget(backend: str, block_bytes: int, partial_bytes: int, blocks: int, held_bytes: int = 0,
                    merges: tuple = (), dask_worker=None) -> tuple[int | None, int]:
    """Run on each worker by ``client.run``, which passes the worker as ``dask_worker``."""
    fit = threads_that_fit(backend, block_bytes, partial_bytes, blocks, held_bytes, dask_worker, merges)
    return fit, int(B.memory_budget(backend))


def cluster_key(client, nthreads: dict) -> tuple:
    """What identifies a cluster's workers as this client sees them: the client, its scheduler and
    every worker's address and threads (a worker that joins or leaves, or is restarted under a new
    address, changes it)."""
    return client.id, client.scheduler.address, frozenset(nthreads.items())


# answers kept: one a cluster, flow shape and setting in use at once, in practice a few
ANSWERS_KEPT = 32


def worker_answers(client, nthreads: dict, *plan) -> dict:
    """Each worker's :func:`_fit_and_budget` for ``plan`` (backend, block, partial and held bytes,
    blocks a thread, merges), asked once per cluster (:func:`cluster_key`), plan and ``pipeline``
    settings: a second computation of the same shape does not pay ``client.run``'s round trip.
    An answer counts the worker's memory when it was asked (on the CPU, its resident set outside
    the data it holds for the scheduler, which moves little between computations)."""
    import dask
    from dask.base import tokenize

    key = (cluster_key(client, nthreads), plan, tokenize(dask.config.get("pipeline", {})))
    with state.cluster.lock:
        if key in state.cluster.answers:
            state.cluster.answers.move_to_end(key)
            return state.cluster.answers[key]
    answers = client.run(_fit_and_budget, *plan)
    with state.cluster.lock:
        state.cluster.answers[key] = answers
        while len(state.cluster.answers) > ANSWERS_KEPT:
            state.cluster.answers.popitem(last=False)
    return answers


def check_workers(client, backend: str, block_bytes: int, partial_bytes: int, blocks: int = BLOCKS_PER_THREAD, held_bytes: int = 0,
                  merges: tuple = (), nthreads: dict | None = None) -> dict[str, tuple[int, int]]:
    """On a distributed cluster the workers' threads are the cluster's, not the plan's: raise
    InputError, before anything runs, when a worker has more threads than its own budget holds
    (each worker evaluates :func:`threads_that_fit` with its own device and settings; the answers
    are kept, :func:`worker_answers`). ``nthreads``: the workers' threads, as ``client.nthreads()``
    answered. Returns, for each worker, the threads that fit and its budget in bytes (``{}`` when
    nothing was checked)."""
    from dask.utils import format_bytes

    if not block_bytes and not partial_bytes:
        return {}
    if nthreads is None:
        nthreads = client.nthreads()
    try:
        answers = worker_answers(client, nthreads, backend, block_bytes, partial_bytes, blocks, held_bytes, merges)
    except Exception as e:  # e.g. workers that cannot import pipeline: nothing to check with
        import warnings

        warnings.warn(f"the workers' memory budgets were not checked: {type(e).__name__}: {e}", stacklevel=3)
        return {}
    over = {w: (nthreads[w], n) for w, (n, _) in answers.items() if n is not None and w in nthreads and nthreads[w] > n}
    if not over:
        return {w: (n, budget) for w, (n, budget) in answers.items() if n is not None}
    worker, (threads, n) = sorted(over.items())[0]
    setting = "pipeline.gpu.memory-limit" if backend == "gpu" else "pipeline.cpu.memory-limit"
    raise InputError(
        f"{len(over)} of {len(nthreads)} workers (e.g. {worker}) run {threads} threads, but each thread may hold "
        f"{blocks} blocks of up to {format_bytes(block_bytes)}"
        + (f" and {PARTIALS_PER_THREAD} partials of up to {format_bytes(partial_bytes)}" if partial_bytes else "")
        + (f", or merge partials ({format_bytes(merges[0][0])} at most)" if merges else "")
        + f", and {setting} allows {format_bytes(answers[worker][1])} a worker, enough for {n}: start the workers with "
        f"at most {max(n, 1)} threads (--nthreads, or threads_per_worker in the cluster profile), raise the limit, "
        "or read smaller blocks (source.chunks; where the stored chunks are larger, `pipeline convert --chunks`)"
    )


def plan(source: da.Array, *results: da.Array, backend: str | None = None) -> Plan:
    backend = backend or B.backend_of(source)
    budget = B.memory_budget(backend)
    block = max(largest_block(source, *results), graph_block_bytes(*results))
    partial = graph_partial_bytes(*results)
    merges = graph_merges(*results)
    blocks = graph_blocks_per_thread(*results)
    held = graph_held(backend, source, *results)
    return Plan(
        backend=backend,
        threads=threads_for(backend, block, partial, blocks, held, merges),
        block_bytes=block,
        partial_bytes=partial,
        blocks_per_thread=blocks,
        merges=merges,
        tree_bytes=graph_tree_bytes(*results),
        gather_bytes=graph_gather_bytes(*results),
        work_bytes=work_bytes(backend, block),
        baseline_bytes=process_baseline(backend),
        held_bytes=held,
        input_bytes=int(source.nbytes),
        budget_bytes=int(budget),
        out_of_core=B.out_of_core(source.nbytes, backend),
    )


def explain(p: Plan) -> str:
    """The parts of the plan's peak, in words."""
    from dask.utils import format_bytes

    parts = []
    if p.baseline_bytes:
        parts.append(f"the process itself {format_bytes(p.baseline_bytes)} (interpreter, libraries, compiled kernels)")
    if p.held_bytes > p.tree_bytes + p.gather_bytes:
        whole = p.held_bytes - p.tree_bytes - p.gather_bytes
        parts.append(f"{format_bytes(whole)} of arrays kept whole (an input in core, a rechunk along a whole axis)")
    if p.tree_bytes:
        parts.append(f"{format_bytes(p.tree_bytes)} of a reduction's partials waiting for their siblings")
    if p.gather_bytes:
        parts.append(f"{format_bytes(p.gather_bytes)} of pieces of blocks waiting to be joined (a take of groups: xarray's groupby without flox)")
    thread = f"{p.blocks_per_thread} blocks of up to {format_bytes(p.block_bytes)}"
    if p.work_bytes:
        thread += f", {format_bytes(p.work_bytes)} of its kernels' temporaries"
    if p.partial_bytes:
        thread += f", {PARTIALS_PER_THREAD} partials of up to {format_bytes(p.partial_bytes)}"
    merging = ""
    if p.merges and threads_bytes(p.threads, p.thread_bytes, p.merges) > p.threads * p.thread_bytes:
        merging = f", or merging partials: {format_bytes(threads_bytes(p.threads, p.thread_bytes, p.merges))} in all"
    parts.append(f"{p.threads} threads x {format_bytes(p.thread_bytes)} ({thread}){merging}")
    return ", ".join(parts)


def check(p: Plan, where: str = "") -> None:
    """Raise InputError when the plan cannot fit its budget."""
    if p.peak_bytes <= p.budget_bytes:
        return
    from dask.utils import format_bytes

    setting = "pipeline.gpu.threads" if p.backend == "gpu" else "dask's num_workers"
    fixed = p.baseline_bytes + p.held_bytes
    advice = (
        "raise the limit" if fixed >= p.budget_bytes
        else f"raise the limit, lower {setting}, or read smaller blocks (source.chunks; where the stored chunks are larger, `pipeline convert --chunks`)"
    )
    raise InputError(
        f"{where}the plan needs about {format_bytes(p.peak_bytes)} of {p.backend.upper()} memory "
        f"({explain(p)})\n  but pipeline.{p.backend}.memory-limit allows {format_bytes(p.budget_bytes)}: {advice}"
    )


def usage(backend: str) -> dict:
    """What this process holds now: host peak RSS, and on the GPU the bytes of CuPy's pool (now, and
    at most since :func:`pipeline.backend.device_memory_peak` was last reset: held, and in use)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"host_peak_rss_bytes": int(peak if sys.platform == "darwin" else peak * 1024)}
    if backend == "gpu":
        cp = B.module("gpu")
        pool = cp.get_default_memory_pool()
        out["gpu_pool_bytes"] = int(pool.total_bytes())
        out["gpu_pool_peak_bytes"] = B.device_memory_peak()
        out["gpu_pool_used_peak_bytes"] = B.device_memory_peak(used=True)  # what the plan counts
        out["gpu_pool_limit_bytes"] = int(pool.get_limit())
        out["host_held_bytes"] = state.held.bytes  # copied to pinned memory between passes
        out["host_pinned_files_bytes"] = state.pinned.files_bytes  # chunk files pinned in the page cache
    return out


def _worker_usage(dask_worker) -> dict:
    """Run on each worker: bytes held, and bytes spilled so far (distributed's SpillBuffer; dask-cuda's
    device buffers report what they hold on the device and on the host)."""
    data = dask_worker.data
    manager = getattr(dask_worker, "memory_manager", dask_worker)
    out = {"memory_limit_bytes": getattr(manager, "memory_limit", None)}
    spilled = getattr(data, "spilled_total", None)
    if spilled is not None:
        out["spilled_to_disk_bytes"] = int(getattr(spilled, "disk", 0))
    for name in ("device_buffer", "host_buffer", "disk"):
        buf = getattr(data, name, None)
        total = getattr(buf, "total_weight", None) if buf is not None else None
        if total is not None:
            out[f"{name}_bytes"] = int(getattr(total, "memory", total) if not isinstance(total, int) else total)
    return out


def cluster_usage(client) -> dict:
    """Per worker of a distributed cluster: its limit and what it spilled (best effort: the fields a
    worker's storage exposes)."""
    try:
        return client.run(_worker_usage)
    except Exception as e:  # never fail a finished run over its report
        return {"error": f"{type(e).__name__}: {e}"}
