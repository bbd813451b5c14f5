"""Where blocks and partials go on a multi-worker cluster, measured on the CPU.

The flows of ``scaling.py`` on a ``distributed.LocalCluster`` (``--workers`` worker processes of
``--threads`` threads) over a small demo store: for each task prefix, which worker ran which
block index along time; and every task output that a worker received from another worker, with
its size: data blocks (at least 90% of an input block) apart from partials and statistics (a
monthly partial, 12 months of float64 sums and counts, is two thirds of a block of 73 float32
steps). Each result is checked against the same flow computed in this process, without a cluster.

    python benchmarks/locality.py --workers 4                  # blocks placed by pipeline.exec.locality
    python benchmarks/locality.py --workers 4 --no-locality    # placed by the scheduler alone
    python benchmarks/locality.py --memory-limit 30MB          # two-pass ops read their input twice

``--memory-limit`` sets ``pipeline.cpu.memory-limit`` where the graphs are built, so that the
two-pass ops read their input a second time (``pipeline.exec.spill.second_pass``), as they do on a GPU
under a device budget; by default the input fits and the first pass's blocks are held.
``--shape 4380,46,90`` gives 60 blocks of 73 steps, as the 18 GB store of the GPU runs has.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def placement(records: list[dict], names: dict[str, str]) -> dict:
    """Per task prefix: ``{worker: [block indices along the first axis]}``, from a task stream."""
    from dask.utils import key_split

    out: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        key = r["key"]
        index = key[1] if isinstance(key, tuple) and len(key) > 1 else None
        out[key_split(key)][names.get(r.get("worker"), r.get("worker"))].append(index)
    return {p: {w: sorted(i, key=lambda v: (v is None, v)) for w, i in sorted(ws.items())} for p, ws in sorted(out.items())}


def transfers(incoming: dict, block_bytes: int) -> dict:
    """Bytes and task outputs that crossed between workers (from ``scaling.received``); an output
    of at least 90% of an input block counts as a data block, anything smaller as a partial."""
    from dask.utils import key_split

    out = {"bytes": 0, "keys": 0, "data_blocks": 0, "data_bytes": 0, "partials": 0, "partial_bytes": 0, "by_prefix": {}}
    for worker, log in incoming.items():
        for key, nbytes in log["keys"].items():
            big = nbytes >= 0.9 * block_bytes
            out["bytes"] += nbytes
            out["keys"] += 1
            out["data_blocks" if big else "partials"] += 1
            out["data_bytes" if big else "partial_bytes"] += nbytes
            p = out["by_prefix"].setdefault(key_split(key), {"keys": 0, "bytes": 0, "largest": 0})
            p["keys"] += 1
            p["bytes"] += nbytes
            p["largest"] = max(p["largest"], nbytes)
    return out


def run(store: str, n_workers: int, flow_names: list[str], memory_limit: str | None, locality: bool, repeat: int = 1,
        threads: int = 1, stealing: bool = True) -> dict:
    import dask
    from distributed import Client, LocalCluster, get_task_stream

    import pipeline
    from scaling import clear_transfer_logs, flows, received, task_summary

    settings = {"pipeline.cluster.locality": locality, "distributed.scheduler.work-stealing": stealing}
    if memory_limit:
        settings["pipeline.cpu.memory-limit"] = memory_limit
    results = {}
    with dask.config.set(settings):
        tas = pipeline.open_dataset(store, backend="cpu")["tas"]
        block_bytes = int(np.prod([c[0] for c in tas.data.chunks])) * tas.dtype.itemsize
        reference = {name: np.asarray(pipeline.compute(build())) for name, build in flows(tas).items() if name in flow_names}
        with LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
            names = {addr: f"w{w['name']}" for addr, w in client.scheduler_info()["workers"].items()}
            for name in flow_names:
                build = flows(tas)[name]
                pipeline.compute(build())  # warm-up: imports and compilation on the workers
                times, blocks_moved = [], []
                for _ in range(repeat):
                    clear_transfer_logs(client)
                    with get_task_stream() as stream:
                        t = time.perf_counter()
                        value = np.asarray(pipeline.compute(build()))
                        times.append(time.perf_counter() - t)
                    incoming = received(client)
                    moved = transfers(incoming, block_bytes)
                    blocks_moved.append(moved["data_blocks"])
                results[name] = {
                    "seconds": min(times),
                    "data_blocks_per_run": blocks_moved,
                    "equal": bool(np.array_equal(value, reference[name], equal_nan=True)),
                    "transfers": moved,
                    "placement": placement(stream.data, names),
                    "per_worker": {names.get(w, w): v for w, v in task_summary(stream.data, incoming).items()},
                }
                print(f"{name}: {min(times):.3f} s, equal to in-process: {results[name]['equal']}; "
                      f"moved between workers {moved['bytes'] / 1e6:.1f} MB in {moved['keys']} outputs: "
                      f"{moved['data_blocks']} data blocks ({moved['data_bytes'] / 1e6:.1f} MB), "
                      f"{moved['partials']} partials ({moved['partial_bytes'] / 1e6:.1f} MB); data blocks moved per run {blocks_moved}", flush=True)
    return {"block_bytes": block_bytes, "flows": results}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="a store with a tas variable (default: generate one of --shape)")
    ap.add_argument("--shape", default="730,91,180", help="time,lat,lon of the generated store")
    ap.add_argument("--time-chunk", type=int, default=73)
    ap.add_argument("--workdir", default="data/bench")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--flows", default="standardized_anomaly,monthly_anomaly,rolling")
    ap.add_argument("--memory-limit", default=None, help="pipeline.cpu.memory-limit where the graphs are built")
    ap.add_argument("--no-locality", action="store_true", help="leave the placement of every task to the scheduler")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--no-work-stealing", action="store_true", help="the scheduler keeps tasks where it placed them")
    ap.add_argument("--verbose", action="store_true", help="print the placement of each task prefix")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not args.store:
        from peers import ensure_store

        args.store = str(ensure_store(Path(args.workdir), tuple(int(n) for n in args.shape.split(",")), args.time_chunk, 0)[0])
    out = run(args.store, args.workers, args.flows.split(","), args.memory_limit, not args.no_locality, args.repeat,
              args.threads, not args.no_work_stealing)
    if args.verbose:
        for name, r in out["flows"].items():
            print(f"== {name}")
            for prefix, where in r["placement"].items():
                print(f"  {prefix}: {dict(where)}")
            for prefix, moved in r["transfers"]["by_prefix"].items():
                print(f"  moved {prefix}: {moved}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
