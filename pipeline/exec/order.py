"""Where the small inputs that dask's order leaves to the end go, on dask's threads in this process.

dask's order ranks the tasks of a graph, and dask's threaded scheduler starts the tasks without
inputs (the roots: reads, mostly) in that order, each time a thread is free and no started chain
has a task ready. A flow's small outputs that take nothing from the large ones, such as the
positions and contigs of the variants a GWAS keeps, come last in that order: their 40 reads (125
chunk files each) ran after the regression's last task, 0.6 s of a 1.74 s computation on one
H200 (the GWAS flow over 2.5 million variants x 10,000 samples), while the genotypes' reads, which
wait on the disk and the device, had left the threads free for them.

:func:`interleaved` moves such roots, and only those, among the large ones: after each large root,
as many of them as spread them over all. A root is small where the largest block it makes or takes
is at most 1/64 of the largest root's (the sizes come from the arrays' chunks as the graph was
built, see :func:`block_bytes`; a root of unknown size is neither), and moved only where dask's
order put it after every large root: a small input that a large block's chain takes comes earlier
in that order, and stays. The large roots keep their order, and so the blocks that each thread
holds at once.
"""

from __future__ import annotations

import graphlib
import itertools
import math

SMALL = 64  # a root is small where its block is at most the largest root's block / SMALL


def block_bytes(collections) -> dict:
    """``{layer name, and its token: the largest block in bytes of that layer and of every layer
    it takes}`` of the Dask arrays in ``collections``' graphs, as they were built (a fused task
    keeps the key, or the token, of its chain's last step, one of these layers). Counting what a
    layer takes makes a task that reads large blocks into a small result (a partial of a
    reduction) a large one. None where a layer it takes has blocks of unknown size: a layer of
    tasks with no note of its blocks (a copy of a graph for a second pass, a spill's hand-over),
    other than the one key that holds a source's array (``original-``)."""
    own: dict = {}
    deps: dict = {}
    for c in collections:
        graph = c.__dask_graph__()
        layers = getattr(graph, "layers", None)
        if layers is None:
            continue
        for name, layer in layers.items():
            deps[name] = set(graph.dependencies.get(name, ()))
            info = getattr(layer, "collection_annotations", None) or {}
            chunks, dtype = info.get("chunks"), info.get("dtype")
            size = None
            if chunks is not None and dtype is not None:
                size = _largest(chunks, dtype)
            elif name.startswith("original-") and len(layer) == 1:
                size = 0  # the handle of a source's array, not a block
            own[name] = size
    for c in collections:  # an array's own chunks over its layer's note of them (unknown after a mask)
        if isinstance(getattr(c, "chunks", None), tuple) and getattr(c, "name", None) in own:
            own[c.name] = _largest(c.chunks, c.dtype)
    out: dict = {}
    try:  # layers before the layers that take them (a graph of any depth: no recursion)
        ordered = list(graphlib.TopologicalSorter({n: deps.get(n, ()) for n in own}).static_order())
    except graphlib.CycleError:  # none in a graph of dask's
        return {}
    for name in ordered:
        sizes = [own.get(name)] + [out.get(d) for d in deps.get(name, ())]  # a layer not seen: unknown
        out[name] = None if any(v is None for v in sizes) else max(sizes)
    for name, value in list(out.items()):
        token = _token(name)
        if token is not None:
            out.setdefault(token, value)
    return out


def _largest(chunks, dtype) -> int | None:
    import numpy as np

    n = np.dtype(dtype).itemsize
    for c in chunks:
        if not c:
            return 0
        top = max(c)
        if isinstance(top, float) and math.isnan(top):
            return None
        n *= int(top)
    return n


def _token(name) -> str | None:
    """The hex token that ends a Dask key name, else None."""
    if isinstance(name, str) and len(name) > 33 and name[-33] == "-":
        tail = name[-32:]
        if all(ch in "0123456789abcdef" for ch in tail):
            return tail
    return None


def key_bytes(key, sizes: dict) -> int | None:
    """The largest block that the task ``key`` (``(name, i, ...)``) makes or takes, from ``sizes``
    (:func:`block_bytes`), else None."""
    if not isinstance(key, tuple) or not key:
        return None
    found = sizes.get(key[0])
    return found if found is not None else sizes.get(_token(key[0]))


def interleaved(roots: list, sizes: dict) -> list:
    """``roots`` (in the order their tasks are to start) with the small ones that come after every
    large one spread among the large ones (see the module's docstring); else ``roots`` itself."""
    nbytes = {k: key_bytes(k, sizes) for k in roots}
    known = [n for n in nbytes.values() if n is not None]
    if not known:
        return roots
    top = max(known)
    large = [i for i, k in enumerate(roots) if nbytes[k] is not None and nbytes[k] * SMALL > top]
    if not large:
        return roots
    last = large[-1]
    late = [k for k in roots[last + 1:] if nbytes[k] is not None and nbytes[k] * SMALL <= top]
    if not late:
        return roots
    moved = set(late)
    per = -(-len(late) // len(large))
    out, queue, after = [], iter(late), set(large)
    for i, k in enumerate(roots):
        if k in moved:
            continue
        out.append(k)
        if i in after:
            out.extend(itertools.islice(queue, per))
    return out


def start_state(sizes: dict):
    """A ``start_state`` callback of dask's local scheduler (``dask.callbacks.Callback``) that
    reorders the roots it is about to start (:func:`interleaved`). Its ready list is started from
    its end."""

    def reorder(dsk, state) -> None:
        ready = state.get("ready")
        if not isinstance(ready, list) or not ready:
            return
        first = ready[::-1]
        try:
            order = interleaved(first, sizes)
        except Exception:  # a hint on the order: never a reason for a computation to fail
            return
        if order is not first and sorted(map(str, order)) == sorted(map(str, first)):
            ready[:] = order[::-1]

    return reorder
