"""Run reports: wall time, per-step task time, bytes read and written, throughput.

Per-step time is the summed duration of the tasks of each step's part of the graph, read from
dask's own instrumentation (the local Profiler, or the distributed task stream). Dask fuses
chains of blockwise tasks into one task; a fused task counts towards the step whose layer ends
it, so a cheap step fused into the next one shows little time of its own.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field


def layer_of(key) -> str:
    return key[0] if isinstance(key, tuple) else str(key)


@dataclass
class TaskTimes:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wall: float = 0.0

    def add(self, key, duration: float) -> None:
        name = layer_of(key)
        self.seconds[name] += duration
        self.counts[name] += 1


@contextlib.contextmanager
def task_timer(client=None):
    """Time every task run inside the block, on the local scheduler or on ``client``'s cluster."""
    times = TaskTimes()
    start = time.perf_counter()
    if client is None:
        from dask.diagnostics import Profiler

        with Profiler() as prof:
            yield times
        for r in prof.results:
            times.add(r.key, r.end_time - r.start_time)
    else:
        from distributed import get_task_stream

        with get_task_stream(client) as stream:
            yield times
        for t in stream.data:
            compute = sum(s["stop"] - s["start"] for s in t.get("startstops", ()) if s.get("action") == "compute")
            times.add(t["key"], compute)
    times.wall = time.perf_counter() - start


def attribute(times: TaskTimes, layers_by_part: dict[str, set[str]], rest: str = "write") -> dict[str, dict]:
    """Sum task seconds and counts per part (step) of the graph.

    Executed task names are layer names, possibly fused with others ("a-b-c") and suffixed with
    a token when the graph was finalized; a task belongs to the latest part whose layer name it
    contains, and tasks of no known layer (the store itself) to ``rest``.
    """
    order = {part: i for i, part in enumerate(layers_by_part)}
    owner = [(layer, part) for part, layers in layers_by_part.items() for layer in layers]
    out = {part: {"task_seconds": 0.0, "tasks": 0} for part in [*layers_by_part, rest]}
    for name, secs in times.seconds.items():
        parts = [part for layer, part in owner if layer in name]
        part = max(parts, key=order.__getitem__) if parts else rest
        out[part]["task_seconds"] += secs
        out[part]["tasks"] += times.counts[name]
    for v in out.values():
        v["task_seconds"] = round(v["task_seconds"], 4)
    return out


def gbps(nbytes: float, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 else None
