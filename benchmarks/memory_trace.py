"""What a flow holds on the GPU under a device memory budget, task by task.

For each flow, budget and thread count (``--repeat`` times): the flow of ``peers.py`` runs over a store with
``pipeline.gpu.memory-limit`` set to the budget, and after every task this records the bytes in use
in CuPy's pool, the bytes the pool holds (in use and cached), and the results Dask's scheduler keeps
for later tasks, by task name. It prints, per run, whether it completed, its seconds, and the
composition of the moment it used the most device memory (or of the last task before it ran out).

    python benchmarks/memory_trace.py --store data/bench/tas_4380x721x1440_t73_sharded.zarr \\
        --flows standardized_anomaly --budgets 4GB,8GB --threads 1,3 --json trace.json
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dask  # noqa: E402
from dask.callbacks import Callback  # noqa: E402
from dask.utils import format_bytes, key_split, parse_bytes  # noqa: E402

import pipeline  # noqa: E402
from pipeline import backend as B  # noqa: E402


def nbytes(value) -> int:
    """Device bytes of a task's result (CuPy arrays, and dicts or tuples of them)."""
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    return int(value.nbytes) if B.is_cupy(value) else 0


class Trace(Callback):
    """After each task: the pool's bytes in use and held, and the scheduler's kept results."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool
        self.lock = threading.Lock()
        self.tasks = 0
        self.peak = {"used": 0}
        self.last = {}
        self.started = {}
        self.seconds = collections.Counter()  # task seconds by task name

    def _pretask(self, key, dsk, state):
        self.started[key] = time.perf_counter()

    def snapshot(self, state, key) -> dict:
        held = collections.Counter()
        for k, v in state["cache"].items():
            held[key_split(k)] += nbytes(v)
        return {
            "after_task": self.tasks,
            "task": key_split(key),
            "used": int(self.pool.used_bytes()),
            "pool": int(self.pool.total_bytes()),
            "running": sorted(collections.Counter(key_split(k) for k in state["running"]).items()),
            "held": {k: v for k, v in held.most_common() if v},
        }

    def _posttask(self, key, result, dsk, state, id):
        elapsed = time.perf_counter() - self.started.pop(key, time.perf_counter())
        with self.lock:
            self.tasks += 1
            self.seconds[key_split(key)] += elapsed
            snap = self.snapshot(state, key)
            self.last = snap
            if snap["used"] > self.peak["used"]:
                self.peak = snap


def show(snap: dict) -> str:
    held = ", ".join(f"{k} {format_bytes(v)}" for k, v in snap.get("held", {}).items()) or "nothing"
    running = ", ".join(f"{k} x{n}" for k, n in snap.get("running", [])) or "none"
    return (f"after task {snap.get('after_task')} ({snap.get('task')}): in use {format_bytes(snap.get('used', 0))}, "
            f"pool {format_bytes(snap.get('pool', 0))}; scheduler keeps {held}; running {running}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True, help="a tas store (the GPU layout of `pipeline convert`, or plain)")
    p.add_argument("--flows", default="standardized_anomaly,monthly_anomaly,rolling")
    p.add_argument("--budgets", default="4GB", help="device memory budgets, comma-separated (none: the default limit)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each setting (the first includes compiling kernels)")
    p.add_argument("--threads", default="3", help="pipeline.gpu.threads values, comma-separated")
    p.add_argument("--json", help="write the runs here")
    args = p.parse_args(argv)

    from peers import PIPELINE_FLOWS

    cp = B.module("gpu")
    pool = cp.get_default_memory_pool()
    runs = []
    for flow in args.flows.split(","):
        for budget in args.budgets.split(","):
            for threads, run in itertools.product((int(t) for t in args.threads.split(",")), range(args.repeat)):
                pool.free_all_blocks()
                B.device_memory_peak(reset=True)
                limit = None if budget == "none" else parse_bytes(budget)
                settings = {"pipeline.gpu.memory-limit": limit, "pipeline.gpu.threads": threads, "pipeline.gpu.nvcomp": True}
                row = {"flow": flow, "budget": budget, "threads": threads, "run": run}
                with dask.config.set(settings):
                    tas = pipeline.open_dataset(args.store, backend="gpu")["tas"]
                    outs = PIPELINE_FLOWS[flow](tas)
                    row["plan_threads"] = pipeline.exec.compute.compute_threads(outs[0])
                    trace = Trace(pool)
                    t = time.perf_counter()
                    try:
                        with trace:
                            pipeline.compute(list(outs))
                        row["seconds"] = time.perf_counter() - t
                    except Exception as e:  # out of memory: what was held before it
                        row["error"] = f"{type(e).__name__}: {e}"
                row.update(tasks=trace.tasks, peak=trace.peak, last=trace.last, pool_peak=B.device_memory_peak(),
                           task_seconds=dict(trace.seconds.most_common()))
                runs.append(row)
                status = f"{row['seconds']:.2f} s" if "seconds" in row else row["error"][:120]
                print(f"{flow} budget {budget} threads {threads} run {run} (plan {row['plan_threads']}): {status}; "
                      f"{trace.tasks} tasks, pool peak {format_bytes(row['pool_peak'])}", flush=True)
                print(f"  most in use {show(trace.peak)}", flush=True)
                print("  task seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in trace.seconds.most_common(6)), flush=True)
                if "error" in row:
                    print(f"  last {show(trace.last)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
