"""How many input-sized blocks a flow holds at once: in one process on dask's threads, and on
distributed workers with the same threads in all, by ``distributed.scheduler.worker-saturation``.

On the CPU backend, out of core (``pipeline.cpu.memory-limit`` well under the input), each block
that pipeline decodes, each anomaly block and each rolling block is followed by a weak reference,
and the most alive at once is reported (medians over ``--repeat`` runs). The graph is unchanged:
the block functions are wrapped, not the graph. The GPU runs under a 4 GB budget ran out of memory
on a distributed worker with the threads that fit in one process; this shows why, where it runs
in seconds.

    python benchmarks/live_blocks.py --threads 2,3 --saturation 1.1,1.0
    python benchmarks/live_blocks.py --threads 2 --workers 2 [--no-locality]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


# the blocks alive now and the most at once; module-level, so that the wrapped functions in a
# graph pickle by reference (a distributed client serializes the graph, also for workers in this
# process)
_STATE = {"alive": set(), "peak": 0, "min_bytes": 0}
_LOCK = threading.Lock()
_INNER: dict = {}


def _track(arr):
    if getattr(arr, "nbytes", 0) >= _STATE["min_bytes"]:
        key = id(arr)
        with _LOCK:
            _STATE["alive"].add(key)
            _STATE["peak"] = max(_STATE["peak"], len(_STATE["alive"]))
        weakref.finalize(arr, _STATE["alive"].discard, key)
    return arr


def cf_decode_cpu(*args, **kwargs):
    return _track(_INNER["cf_decode_cpu"](*args, **kwargs))


def _subtract_block(*args, **kwargs):
    return _track(_INNER["_subtract_block"](*args, **kwargs))


def _with_halo(block, ahead, behind, *, block_id=None, **kwargs):  # map_blocks passes block_id by name
    return _track(_INNER["_with_halo"](block, ahead, behind, block_id=block_id, **kwargs))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="data/live_blocks")
    ap.add_argument("--shape", default="4380,37,72", help="time,lat,lon of the generated store (blocks of 73 steps)")
    ap.add_argument("--threads", default="2,3")
    ap.add_argument("--saturation", default="1.1,1.0", help="worker-saturation values for the distributed worker")
    ap.add_argument("--flows", default="monthly_anomaly,rolling")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="distributed workers (the threads in one process: workers x threads)")
    ap.add_argument("--memory-limit", default="16MB", help="pipeline.cpu.memory-limit: well under the input, so two-pass flows read twice")
    ap.add_argument("--no-locality", action="store_true", help="pipeline.cluster.locality false: the scheduler places every block")
    args = ap.parse_args(argv)

    import peers
    from pipeline.reduce import overlap
    from pipeline.kernels import elementwise
    from pipeline.ops import grouped

    import live_blocks as me  # this file as a module: its functions pickle by reference

    shape = tuple(int(n) for n in args.shape.split(","))
    store = peers.ensure_store(Path(args.workdir), shape, 73, 0)[0]
    me._STATE["min_bytes"] = 73 * shape[1] * shape[2] * 4 // 2
    patched = ((elementwise, "cf_decode_cpu"), (grouped, "_subtract_block"), (overlap, "_with_halo"))
    for module, name in patched:
        me._INNER[name] = getattr(module, name)
        setattr(module, name, getattr(me, name))
    try:
        return _measure(args, me, store)
    finally:
        for module, name in patched:
            setattr(module, name, me._INNER[name])


def _measure(args, me, store) -> dict:
    import dask
    from distributed import Client, LocalCluster

    import peers
    import pipeline

    # out of core: the two-pass flows read twice
    settings = {"pipeline.backend": "cpu", "pipeline.cpu.memory-limit": args.memory_limit, "pipeline.cluster.locality": not args.no_locality}

    def peak(compute, flow) -> int:
        peaks = []
        for _ in range(args.repeat):
            outs = peers.PIPELINE_FLOWS[flow](pipeline.open_dataset(store, backend="cpu")["tas"])
            me._STATE["peak"] = 0
            compute(outs)
            peaks.append(me._STATE["peak"])
        return int(statistics.median(peaks))

    table = {}
    with dask.config.set(settings):
        for flow in args.flows.split(","):
            for n in (int(t) for t in args.threads.split(",")):
                row = table.setdefault(f"{flow}, {n} threads", {})
                row["one process"] = peak(lambda outs: pipeline.compute(outs, threads=n * args.workers), flow)
                for sat in args.saturation.split(","):
                    with dask.config.set({"distributed.scheduler.worker-saturation": float(sat)}), \
                            LocalCluster(n_workers=args.workers, threads_per_worker=n, processes=False, dashboard_address=None) as cluster, \
                            Client(cluster, set_as_default=False) as client, client.as_current():
                        row[f"{args.workers} worker(s), saturation {sat}"] = peak(pipeline.compute, flow)
                print(f"{flow}, {n} threads: {row}", flush=True)
    return table


if __name__ == "__main__":
    main()
