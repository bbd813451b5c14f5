"""What the graph builders declare for the memory plan.

The builders that make reductions and halos (:mod:`pipeline.reduce`) say, on each layer they create,
what its blocks hold, under one key of the layer's ``collection_annotations`` (as cubed's
``projected_mem``); the plan (:mod:`pipeline.exec.memory`) reads those
declarations:

- ``partial_bytes``: the layer's blocks are a reduction's partials, each of up to this many bytes;
  not counted as blocks (the plan counts a tree's partials, :func:`pipeline.exec.memory.graph_trees`);
- ``merge_copies``: a merge of ``k`` partials holds ``merge_copies * k + 1`` of them: its inputs,
  a copy of them laid side by side and its output (2, where not declared), or its inputs and its
  output where it merges them slab by slab (1);
- ``merges``, ``waiting_bytes``, ``level_waits``, ``leaf_bytes``: instead, the merges of each
  level of the tree ([(bytes one holds, merges), ...]), the bytes of the partials that may wait for
  their siblings at once (in all, and at each level), and the bytes of a block's partial, where
  partials differ in size from level to level (by groups: a block's partial holds its own groups'
  rows, the last merge every group's);
- ``view``: the layer's blocks are views of a smaller array (broadcast weights); not counted;
- ``block_bytes``: each block of the layer counts as this many bytes (instead of its shape and dtype);
- ``extra_blocks``: a thread running the layer's tasks holds this many blocks more than
  BLOCKS_PER_THREAD (the halos of moving-window ops).
- ``held_bytes``: the layer's tasks, together, keep this many bytes alive until the last of them
  has run (a rechunk that gathers a whole axis from blocks split along it holds all of its
  input); counted once, not per thread.

A layer without a declaration is an array of its own, sized from dask's annotations.
"""

from __future__ import annotations

from ..deferred import module as _deferred

da = _deferred("dask.array")  # imported when the first graph is built

DECLARED = "pipeline-memory"


def declare(array: da.Array, layers=None, **declaration) -> da.Array:
    """Record ``declaration`` (the keys above) on the layers ``layers`` of ``array``'s graph (by
    default its own last layer); returns ``array``."""
    graph = array.__dask_graph__()
    for name in [array.name] if layers is None else layers:
        layer = graph.layers[name]
        if layer.collection_annotations is None:
            layer.collection_annotations = {}
        layer.collection_annotations.setdefault(DECLARED, {}).update(declaration)
    return array


def declared(layer) -> dict:
    """The declaration on ``layer`` ({} where none)."""
    return (getattr(layer, "collection_annotations", None) or {}).get(DECLARED, {})
