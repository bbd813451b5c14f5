"""The small reads that dask's order leaves to the end start among the large ones, on dask's
threads (:mod:`pipeline.exec.order`); nothing else about the order changes."""

from __future__ import annotations

import threading

import dask.array as da
import numpy as np

import pipeline
from pipeline.exec import order

SIZES = {"big": 8000, "small": 100, "mid": 800}  # the largest block each task makes or takes
BIG = [("big", i, 0) for i in range(4)]
SMALL = [("small", i) for i in range(8)]


def test_small_roots_after_every_large_one_are_spread_among_them():
    assert order.interleaved(BIG + SMALL, SIZES) == [
        BIG[0], *SMALL[0:2], BIG[1], *SMALL[2:4], BIG[2], *SMALL[4:6], BIG[3], *SMALL[6:8]]
    # fewer small roots than large ones: one after each, from the first
    assert order.interleaved(BIG + SMALL[:2], SIZES) == [BIG[0], SMALL[0], BIG[1], SMALL[1], BIG[2], BIG[3]]


def test_roots_that_dasks_order_put_earlier_and_roots_of_unknown_size_stay():
    early = [SMALL[0], BIG[0], SMALL[1], BIG[1], BIG[2], BIG[3]]  # a small input of the large chains
    assert order.interleaved(early, SIZES) is early
    unknown = BIG + ["a-delayed", ("other", 0)]
    assert order.interleaved(unknown, SIZES) is unknown
    # not small (1/64 of the largest block or less): left where it is
    mid = BIG + [("mid", i) for i in range(4)]
    assert order.interleaved(mid, SIZES) is mid
    assert order.interleaved(SMALL, SIZES) is SMALL  # no large root


def test_block_bytes_come_from_the_arrays_as_built():
    x = da.ones((30, 4), chunks=(7, 4), dtype=np.float32)
    sizes = order.block_bytes([x])
    assert order.key_bytes((x.name, 0, 0), sizes) == 7 * 4 * 4 == order.key_bytes((x.name, 4, 0), sizes)
    # a chain that dask's blockwise optimization fused: named after its steps, ending in the token
    # of the last
    assert order.key_bytes(("ones-mul-" + x.name.rsplit("-", 1)[1], 0, 0), sizes) == 7 * 4 * 4
    # what a task takes counts: a small partial of large blocks is large
    s = x.sum(axis=1)
    assert order.key_bytes((s.name, 0), order.block_bytes([s])) == 7 * 4 * 4
    y = x[x[:, 0] > 0]  # unknown chunk sizes: the array's own, not its layer's note of them
    assert order.key_bytes((y.name, 0, 0), order.block_bytes([y])) is None
    # a layer with no note of its blocks (a graph's copy, a hand-over): unknown
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    layers = {"raw": MaterializedLayer({("raw", 0): (np.ones, 4)}),
              "wrap": MaterializedLayer({("wrap", 0): (np.add, ("raw", 0), 1)})}
    wrap = da.Array(HighLevelGraph(layers, {"raw": set(), "wrap": {"raw"}}), "wrap", ((4,),), dtype=float)
    assert order.key_bytes(("wrap", 0), order.block_bytes([wrap])) is None


def test_block_bytes_of_a_graph_deeper_than_pythons_recursion():
    x = da.ones(10, chunks=5)
    for _ in range(1500):  # a chain of 1,500 layers
        x = x + 1
    assert order.key_bytes((x.name, 0), order.block_bytes([x])) == 5 * 8


def _noted(block, log=None, lock=None, tag=""):
    with lock:
        log.append(tag)
    return block


def test_small_outputs_read_beside_the_large_reads_on_dasks_threads():
    """A large array reduced and two small ones that take nothing from it (a GWAS's statistics,
    its variants' positions and contigs): dask's order starts the 32 small reads after the 16
    large ones; here they start before the last large one, the results the same."""
    log, lock = [], threading.Lock()
    big = da.random.default_rng(0).random((16 * 2000, 50), chunks=(2000, 50)).map_blocks(
        _noted, log=log, lock=lock, tag="big", meta=np.array((), float))
    # each output one chunk, as a flow's sink writes the small ones
    small = [da.arange(16 * 10, chunks=10).map_blocks(_noted, log=log, lock=lock, tag=f"small{j}", meta=np.array((), int))
             .rechunk(160) for j in range(2)]
    got = pipeline.compute([big.sum(axis=1).rechunk(16 * 2000), *small], threads=2)
    np.testing.assert_array_equal(got[1], np.arange(160))
    last_big = max(i for i, n in enumerate(log) if n == "big")
    assert log.count("big") == 16 and log.count("small0") == 16 and log.count("small1") == 16
    assert min(i for i, n in enumerate(log) if n.startswith("small")) < last_big, log
    np.testing.assert_allclose(got[0], big.sum(axis=1).compute(scheduler="sync"))
