"""Graphs optimized as ``dask.compute`` optimizes them, for the computations that pipeline submits
itself (a cluster's placed graphs, a sink's writes). No cluster needed: nothing here imports
distributed."""

from __future__ import annotations


def optimized(collections: list) -> list:
    """``collections`` sharing one graph, optimized together as ``dask.compute`` optimizes them.

    ``dask.optimize`` (dask 2026.7 and 2026.8) optimizes each collection's graph on its own and
    merges the results: a step that two collections share is fused into each, and computed once
    for each (two arrays made of one map over the blocks: every block mapped twice, on a
    ``LocalCluster``). ``dask.compute`` builds one expression of them all and optimizes that, as
    here: the shared step stays one task a block."""
    from dask.base import collections_to_expr

    if not collections:
        return []
    graph = collections_to_expr(list(collections), optimize_graph=True).optimize().__dask_graph__()
    out = []
    for c in collections:
        rebuild, args = c.__dask_postpersist__()
        out.append(rebuild(graph, *args))
    return out
