"""The steps that ``benchmarks/tracing/sitecustomize.py`` recorded in a run's processes, read back
as a run's milestones (seconds since the command started) and each process's totals.

    python benchmarks/process_trace.py TRACE_DIR     # one run's milestones and processes
    python benchmarks/process_trace.py TRACE_DIR PID # where that process's threads were (sampled)
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

READS = ("reader.read_block", "hdf5.read_block", "engine.read_block_host", "hdf5.read_block_host", "hdf5.decode_block_host", "ahead._decode")


def load(folder) -> list[list]:
    """Every step of every process: [pid, step, thread, start, end, detail]."""
    rows = []
    for f in sorted(Path(folder).glob("*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def processes(rows) -> dict[int, dict]:
    """Each process: its role (command, server, worker, other), first and last second, and the
    summed seconds of each step."""
    by_pid: dict[int, list] = collections.defaultdict(list)
    for r in rows:
        by_pid[r[0]].append(r)
    out = {}
    for pid, rs in by_pid.items():
        steps = {r[1] for r in rs}
        argv = next((r[5] or "" for r in rs if r[1] == "start"), None)
        if "worker.dask_setup" in steps or "worker._run_task" in steps:
            role = "worker"
        elif argv is not None and " run " in f" {argv} ":
            role = "command"
        elif argv is not None and argv.startswith("-c") and any(r[1] == "import distributed" for r in rs):
            role = "server"  # multiprocessing's fork server, importing what a worker needs
        else:
            role = "other"
        sums = collections.defaultdict(float)
        for r in rs:
            if r[1] != "sample":
                sums[r[1]] += r[4] - r[3]
        out[pid] = {"role": role, "first": min(r[3] for r in rs), "last": max(r[4] for r in rs),
                    "seconds": {k: round(v, 4) for k, v in sums.items() if not k.startswith(("start", "import "))},
                    "gc": round(sum(v for k, v in sums.items() if k.startswith("gc")), 4)}
    return out


def milestones(rows) -> dict[str, float | None]:
    """A run's milestones, seconds since the command started (None where the run had none):
    the cluster's start, the first worker's fork (its first step) and the end of its start
    (``dask_setup``), the run's start and end, the first block read's start and the last one's end;
    and the collector's seconds in all processes."""
    def first(step, end=False, pick=min):
        xs = [r[4] if end else r[3] for r in rows if r[1] == step]
        return round(pick(xs), 4) if xs else None

    procs = processes(rows)
    workers = [p for p in procs.values() if p["role"] == "worker"]
    reads = [r for r in rows if r[1] in READS]
    return {  # start_early is called without a cluster too: its start counts where workers ran
        "cluster_start": first("cluster.start_early") if workers else None,
        "worker_forked": round(min(p["first"] for p in workers), 4) if workers else None,
        "worker_ready": first("worker.dask_setup", end=True),
        "run_start": first("flows.run_flow"),
        "first_read": round(min(r[3] for r in reads), 4) if reads else None,
        "last_read_end": round(max(r[4] for r in reads), 4) if reads else None,
        "run_end": first("flows.run_flow", end=True, pick=max),
        "gc_seconds": round(sum(p["gc"] for p in procs.values()), 4),
    }


def samples(rows, pid: int, since: float = 0.0, until: float = float("inf"), least: float = 0.02) -> list[str]:
    """Where process ``pid``'s sampled threads were (``PIPELINE_TRACE_SAMPLE``) between ``since``
    and ``until``, in stretches of at least ``least`` seconds: one line each."""
    out = []
    for r in sorted((r for r in rows if r[0] == pid and r[1] == "sample"), key=lambda r: r[3]):
        if r[4] >= since and r[3] <= until and r[4] - r[3] >= least:
            out.append(f"{r[3]:8.3f} {r[4] - r[3]:6.3f}  {r[2][:10]:10s} {r[5]}")
    return out


def main(argv=None) -> None:
    args = argv or sys.argv[1:]
    folder = args[0]
    rows = load(folder)
    if len(args) > 1:  # TRACE_DIR PID: that process's sampled main thread
        print("\n".join(samples(rows, int(args[1]))))
        return
    for k, v in milestones(rows).items():
        print(f"{k:16s} {v}")
    for pid, p in sorted(processes(rows).items(), key=lambda kv: kv[1]["first"]):
        top = sorted(p["seconds"].items(), key=lambda kv: -kv[1])[:6]
        print(f"pid {pid} {p['role']:8s} {p['first']:7.3f}-{p['last']:7.3f} gc {p['gc']:.3f}  "
              + ", ".join(f"{k} {v:.3f}" for k, v in top))


if __name__ == "__main__":
    main()
