"""Copies of a graph that are computed again: :func:`dask.graph_manipulation.bind` and
:func:`~dask.graph_manipulation.clone` for graphs whose layers hold dask's task objects.

A two-pass op's second pass out of core (:func:`pipeline.exec.spill.second_pass`) and the
quantile's slabs (:mod:`pipeline.ops.fields`) read their input again from a copy of its graph,
every key renamed. dask renames the keys of each copied layer and the references to them in its
tasks, but the copy that materialized layers fall back to (``Layer.clone``: every rechunk, the
task layers that pipeline builds) rewrites only tasks written as tuples. A ``Task`` keeps the
original key and points at the original blocks (dask/dask#12455, open in dask 2026.8), so the
copy shares everything from the first such layer down: the "second read" is the first pass's
blocks, held between the passes. On a 1-worker cluster, PCA of a rechunked input held every
block of its first pass until the Gram matrix was done (twice over, as dask counts a block and
its rechunked views apart); on the GPU machine that was 200 GB of float64 on one worker, which
spilled to host memory for 20 s.

Here those layers are copied with the references inside their tasks renamed too
(``GraphNode.substitute``); layers with a copy of their own (Blockwise) are dask's. The copy of
a layer keeps its annotations (the memory plan's declarations among them), which dask's drops.
"""

from __future__ import annotations

from typing import TypeVar

from dask.highlevelgraph import HighLevelGraph, Layer, MaterializedLayer

T = TypeVar("T")


class _TaskLayer(MaterializedLayer):
    """A materialized layer whose copy renames the keys that its ``Task`` objects refer to."""

    def clone(self, keys: set, seed, bind_to=None) -> tuple[Layer, bool]:
        from dask._task_spec import GraphNode, Task, TaskRef
        from dask.base import clone_key
        from dask.graph_manipulation import chunks

        tuples = {k: v for k, v in self.mapping.items() if not isinstance(v, GraphNode)}
        out, bound = MaterializedLayer(tuples).clone(keys, seed, bind_to) if tuples else ({}, False)
        out = dict(out)
        for key, node in self.mapping.items():
            if not isinstance(node, GraphNode):
                continue
            if key not in keys:
                out[key] = node
                continue
            new = clone_key(key, seed)
            renamed = {dep: clone_key(dep, seed) for dep in node.dependencies if dep in keys}
            node = node.substitute(renamed, key=new)
            if bind_to is not None and not renamed:  # a leaf of the copy: it waits for bind_to
                node = Task(new, chunks.bind, node, TaskRef(bind_to))
                bound = True
            out[new] = node
        return MaterializedLayer(out, annotations=self.annotations,
                                 collection_annotations=self.collection_annotations), bound


def copyable(collection: T) -> T:
    """``collection`` with every layer that has no copy of its own made a :class:`_TaskLayer`:
    the same graph, keys and tasks."""
    graph = collection.__dask_graph__()
    if not isinstance(graph, HighLevelGraph):
        return collection
    layers = {
        name: _TaskLayer(dict(layer), annotations=layer.annotations,
                         collection_annotations=layer.collection_annotations)
        if type(layer).clone is Layer.clone else layer
        for name, layer in graph.layers.items()
    }
    rebuild, args = collection.__dask_postpersist__()
    return rebuild(HighLevelGraph(layers, graph.dependencies), *args)


def bind(children: T, parents, **kwargs) -> T:
    """:func:`dask.graph_manipulation.bind` of one collection, its copy computed again whatever its layers."""
    from dask.graph_manipulation import bind as dask_bind

    return dask_bind(copyable(children), parents, **kwargs)


def clone(collection: T, **kwargs) -> T:
    """:func:`dask.graph_manipulation.clone` of one collection, computed again whatever its layers."""
    from dask.graph_manipulation import clone as dask_clone

    return dask_clone(copyable(collection), **kwargs)
