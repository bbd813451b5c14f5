"""Each worker of a cluster owns a contiguous slab of blocks along the first axis, for every pass.

Left to itself, the distributed scheduler hands the blocks of an input to the workers in the
order it runs them, so consecutive blocks land on different workers and every tree combine
gathers partials from several of them. The second pass of a two-pass op
(:func:`pipeline.exec.spill.second_pass`) reads each block again wherever a thread is free, since
those reads depend only on the small statistics; and a task that needs a block held elsewhere (a
second pass in core, a halo) pulls the whole block over. Measured on a CPU ``LocalCluster`` of 4
workers of 2 threads (``benchmarks/locality.py``, 60 blocks of 73 steps, in core), by the
scheduler alone: in the standardized anomaly 37 block partials, 12 higher partials and 2 blocks
crossed workers; in the monthly anomaly 35 + 12 group partials and 5 to 12 blocks a run; in the
rolling maximum 12 to 21 blocks a run. On GPUs each transfer goes device -> host -> TCP -> host
-> device; with 25 MB moment partials, 200 MB monthly partials and 300 MB blocks at full size,
workers spent 0.7 to 3.7 s receiving data, and 1, 2 and 4 GPUs took about the same time.

So before a graph goes to a cluster of two or more workers, :func:`place` optimizes it (fusing each
block's chain of tasks, as ``client.compute`` would) and pins its *block tasks* to the worker of
their slab: the tasks whose key is ``(name, i, ...)`` over as many blocks along the first axis as
an input of the graph has (reads, per-block maps and partials, the second pass's reads and maps,
writes). A block task goes where its blocks are when they are all on one worker (a halo taken
from a neighbour goes with that neighbour), else to the worker of its own block ``i``. The tasks
between blocks (tree combines, aggregates, statistics) stay free: the scheduler runs them where
most of their input is. Measured the same way, after, in core and reading twice alike: no block
crossed workers; per tree, 3 partials did (the last level's, one per worker but the one that
combines them), and the statistics (to each of 3 workers), the halos at the 3 slab boundaries and
the per-block results that make up the output (292 bytes each).

Slabs follow the workers' threads (a worker with twice the threads owns twice the blocks), and
dask's trees combine ``split_every`` consecutive blocks at a time, so inside a slab the combines
are local. A slab may grow by a tenth of its share (rounded down) to end where fewer combines
straddle two workers: 60 blocks on 4 workers become slabs of 16, 16, 16 and 12, the ends of
dask's groups of 16 (4 x 4), rather than 4 x 15, where each boundary splits a group of each level.

The pins are strict. With loose ones (``allow_other_workers=True``), work stealing handed the
queued reads of a busy worker to an idle one at the end of a pass, and in core such a block then
crossed back for its second pass (1 or 2 blocks in one run of 3 per flow, same cluster). So that
a worker that leaves (or is restarted, under a new address) does not hold its blocks back for
ever, :class:`ReleasePins` on the scheduler lets them run anywhere once it is gone.

Every other task of a placed graph may run on any of the workers, and says so: a restriction to
all of them (:data:`ANYWHERE`). Without one, the scheduler queues a task that it takes for a root
(distributed's ``worker-saturation``): a task that reads data, fused or not (dask marks it a data
producer), or one of a large group with few inputs. A queued task is sent to a worker only when
that worker runs fewer tasks than it has threads (times 1.1), and pinned tasks are never queued:
each worker is sent all of its ready blocks at once, so the queue waited for the end of the
reads. A regression's covariate terms (the traits read from the store, projected, in one fused
task that every regression task takes) ran 0.6 s after their input on two GPUs, after the last
genotype read, and the regression with them (on one worker nothing is placed, and nothing waits).
A restricted task is never queued; restricted to every worker, it goes where the scheduler would
send it.
"""

from __future__ import annotations

import functools
import itertools
import sys
from typing import Mapping

from distributed.diagnostics.plugin import SchedulerPlugin

from .slabs import slab_ends


def block_index(key) -> int | None:
    """The block index along the first axis of a ``(name, i, ...)`` key, else None."""
    if isinstance(key, tuple) and len(key) > 1 and isinstance(key[0], str) and isinstance(key[1], int):
        return key[1]
    return None


def straddling(n: int, is_block, order, deps) -> list[int]:
    """``out[b]``: how many tasks that are not block tasks (``is_block(key)``, over ``n`` blocks)
    take data from blocks on both sides of a boundary before block ``b`` (``0 <= b <= n``)."""
    span: dict = {}
    change = [0] * (n + 2)
    for key in order:
        if is_block(key):
            span[key] = (key[1], key[1])
            continue
        spans = [span[d] for d in deps[key] if d in span]
        if spans:
            lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
            span[key] = (lo, hi)
            change[lo + 1] += 1  # the boundaries lo + 1 .. hi split it
            change[hi + 1] -= 1
    return list(itertools.accumulate(change))[: n + 1]


def owners(graph: Mapping, nthreads: Mapping[str, int]) -> dict:
    """``{key: worker}`` for the block tasks of a low-level graph (see the module's docstring)."""
    from bisect import bisect_right

    from dask.core import get_dependencies, toposort

    deps = {key: get_dependencies(graph, key) for key in graph}
    blocks: dict[str, int] = {}  # blocks along the first axis, per name of an indexed key
    dependent: set[str] = set()  # names of tasks that take an indexed key
    for key in graph:
        if (i := block_index(key)) is not None:
            blocks[key[0]] = max(blocks.get(key[0], 0), i + 1)
            if any(block_index(d) is not None for d in deps[key]):
                dependent.add(key[0])
    # the inputs' grids; blocks already on the cluster (persisted) are no tasks of the graph, so
    # the tasks that take them are not inputs: that data stays where the scheduler put it
    sizes = {n for name, n in blocks.items() if name not in dependent and n > 1}
    if not sizes:
        return {}
    order = toposort(graph, dependencies=deps)
    workers = sorted(nthreads)
    threads = [max(int(nthreads[w]), 1) for w in workers]
    out = {}
    for n in sizes:  # one grid in practice: the time chunks of a store

        def is_block(key, n=n):
            return block_index(key) is not None and blocks[key[0]] == n

        ends = slab_ends(n, threads, straddling(n, is_block, order, deps))
        for key in filter(is_block, order):
            # where its blocks are, if they are on one worker (a block's own maps; a neighbour's
            # rows that a halo takes, fused with the read of that neighbour); else its own slab
            near = {out[d] for d in deps[key] if d in out}
            out[key] = near.pop() if len(near) == 1 else workers[bisect_right(ends, key[1])]
    return out


PIN = "pipeline-slab"  # annotation naming the worker a task is pinned to
ANYWHERE = "*"  # its value for a task that may run on any of the workers of its graph


def _pinned(owner: Mapping, workers: list[str], key):
    """The workers ``key`` may run on: its slab's, else all of them (see the module's docstring)."""
    worker = owner.get(key)
    return list(workers) if worker is None else [worker]


def _pin(owner: Mapping, key):
    return owner.get(key, ANYWHERE)


class ReleasePins(SchedulerPlugin):
    """On the scheduler: when a worker leaves, the tasks pinned to it, and those restricted to all
    the workers of their graph (:data:`ANYWHERE`), may run on any worker (without this they would
    wait for it, or for all of them, for ever). Register it before computing a placed graph."""

    name = "pipeline-release-pins"
    idempotent = True

    def remove_worker(self, scheduler, worker, *, stimulus_id, **kwargs):
        stranded = {}
        for ts in scheduler.tasks.values():
            pin = ts.annotations.get(PIN) if ts.annotations else None
            if pin == worker or (pin == ANYWHERE and worker in (ts.worker_restrictions or ())):
                ts.worker_restrictions = None
                if ts.state == "no-worker":
                    stranded[ts.key] = "processing"
        scheduler.transitions(stranded, stimulus_id=stimulus_id)


# a value inlined into the tasks that take it is sent with each of them: only small ones are
INLINE_BYTES = 64 * 2**10


def _inlinable(task, blocks: Mapping[str, int]) -> bool:
    """Whether ``task`` costs less inside each task that takes it than as a task of its own: a
    small value (the handle of a store's array, that every read takes), or a getitem of a task's
    output that is not one of many blocks (a reduction's statistics taken apart). A getitem of a
    block stays a task: it may cut a halo, or a small part of a large block, that goes to another
    worker without the rest (``blocks``: blocks along the first axis, per name of an indexed key)."""
    import operator
    import pickle

    from dask._task_spec import DataNode, Task
    from dask.array.chunk import getitem
    from dask.sizeof import sizeof

    if isinstance(task, DataNode):
        if sizeof(task.value) > INLINE_BYTES:  # an estimate, without copying a large value
            return False
        try:
            return len(pickle.dumps(task.value, protocol=5)) <= INLINE_BYTES
        except Exception:  # what pickle cannot take, the cluster's cloudpickle will: keep it a task
            return False
    if not (isinstance(task, Task) and task.func in (operator.getitem, getitem) and len(task.dependencies) == 1):
        return False
    (source,) = task.dependencies
    return block_index(source) is None or blocks.get(source[0], 1) <= 1


def lean(collections: list) -> list:
    """``collections`` (optimized) with fewer tasks that do next to nothing, each of which costs a
    round of scheduling (a few milliseconds on a cluster, more where it moves data between
    workers):

    - the aliases that dask's linear fusion leaves behind: fusing a chain renames it, and the
      chain's last key (often an output block) becomes an alias of the fused task, a task of its
      own after the last read. dask's own ``resolve_aliases`` gives the fused task that key where
      nothing else takes it;
    - small values and getitems (:func:`_inlinable`), inlined into the tasks that take them: the
      reads no longer wait for the task that hands out the store's array (nor fetch it from the
      worker that ran it), and the second pass of a two-pass op no longer waits for the tasks that
      take its statistics apart.

    The same functions run on the same values: the results are the same, bit for bit."""
    from dask._task_spec import Alias, DependenciesMapping, convert_legacy_graph, resolve_aliases
    from dask.core import flatten, reverse_dict

    graph = {}
    for c in collections:
        graph.update(c.__dask_graph__())
    graph = convert_legacy_graph(graph)  # a Delayed's tasks may still be tuples
    keys = set(flatten([c.__dask_keys__() for c in collections]))
    dependencies = DependenciesMapping(graph)
    dependents = reverse_dict(dependencies)
    blocks: dict[str, int] = {}
    for key in graph:
        if (i := block_index(key)) is not None:
            blocks[key[0]] = max(blocks.get(key[0], 0), i + 1)
    inline = {k: t for k, t in graph.items() if k not in keys and dependents[k] and _inlinable(t, blocks)}
    # one level only: what an inlined task takes stays a task
    inline = {k: t for k, t in inline.items() if not (t.dependencies & inline.keys())}
    # the blocks of one array all or none: :func:`owners` counts a grid's blocks by the keys left,
    # and a filter's mask of 20 blocks whose short last one alone was inlined (2.5 million variants
    # on the GPU) became a grid of 19 that no read matched: nothing was placed, and each worker
    # pulled the other's genotypes
    whole = {k[0] for k in inline if block_index(k) is not None} - {
        k[0] for k in graph if block_index(k) is not None and k not in inline}
    inline = {k: t for k, t in inline.items() if block_index(k) is None or k[0] in whole}
    if not inline and not any(isinstance(t, Alias) for t in graph.values()):
        return collections
    graph = {k: t.substitute({d: inline[d] for d in dependencies[k] & inline.keys()}) if dependencies[k] & inline.keys() else t
             for k, t in graph.items() if k not in inline}
    graph = resolve_aliases(graph, keys, reverse_dict(DependenciesMapping(graph)))
    out = []
    for c in collections:
        rebuild, args = c.__dask_postpersist__()
        out.append(rebuild(graph, *args))
    return out


def is_frame(collection) -> bool:
    """Whether ``collection`` is a dask DataFrame, Series, Index or Scalar: dask optimizes those as
    expressions, whose ``__dask_postpersist__`` does not take a graph of blocks (``dask.optimize``
    of one raised ``TypeError`` in ``ld_prune``'s table of pairs on a cluster). Their few tasks are
    not placed."""
    frames = sys.modules.get("dask.dataframe")  # none made where it was never imported
    return frames is not None and isinstance(collection, (frames.DataFrame, frames.Series, frames.Index, frames.Scalar))


def place(obj, nthreads: Mapping[str, int]):
    """``obj`` (what ``client.compute`` takes) with its graphs optimized and its block tasks
    pinned to the workers of ``nthreads`` (``{address: threads}``), and whether anything was
    pinned; compute the result with ``optimize_graph=False``, with :class:`ReleasePins` on the
    scheduler. Without blocks to place (or with fewer than two workers), ``obj`` and False."""
    from dask.base import unpack_collections
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    collections, repack = unpack_collections(obj)
    if len(nthreads) < 2 or not collections or any(is_frame(c) for c in collections):
        return obj, False
    from .optimize import optimized

    collections = lean(optimized(collections))
    graph = {}
    for c in collections:
        graph.update(c.__dask_graph__())
    owner = owners(graph, nthreads)
    if not owner:
        return obj, False
    # per key, through callables
    annotations = {"workers": functools.partial(_pinned, owner, sorted(nthreads)), PIN: functools.partial(_pin, owner)}
    placed = []
    for c in collections:
        if isinstance(c, Delayed) and not isinstance(c.dask, HighLevelGraph):
            layer = f"placed-{c.key}"  # a graph of layers, to carry the annotations
            c = Delayed(c.key, HighLevelGraph.from_collections(layer, c.dask, dependencies=()), layer=layer)
        # the layers are the optimizer's own copies: annotating them leaves the caller's graph alone
        for layer in c.__dask_graph__().layers.values():
            layer.annotations = {**(layer.annotations or {}), **annotations}
        placed.append(c)
    return repack(placed)[0], True
