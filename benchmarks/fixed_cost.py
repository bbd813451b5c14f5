"""The fixed cost of a distributed run: what a tiny flow spends before its first read and after
its last, on a cluster.

A tiny store (the demo dataset, ``--blocks`` blocks of 73 steps on a 5 degree grid) and the flows
of ``scaling.py`` on it (the standardized anomaly and the monthly anomaly, each then the
cos(lat)-weighted mean), on a cluster this script starts or attaches to. After a warm-up, for
``--repeat`` runs of each flow, from the task stream (``distributed.get_task_stream``; the workers'
clock is this machine's ``time.time()``):

- ``before_first_read``: from the call of ``pipeline.compute`` (the submission) to the start of the
  first read task (a task that takes the source's array handle, the ``original-`` key of its read
  layer), and its parts: asking the scheduler for its workers (``workers``), measuring the graph
  (``sizes``), the workers' memory check (``memory``),
  registering the scheduler plugin (``plugin``), placing the blocks (``place``, graph optimization
  included), ``client.compute`` (``submit``), until the first task starts on a worker
  (``dispatch``) and the tasks before the first read (``to_read``);
- ``after_last_read``: from the end of the last read task to the moment ``pipeline.compute``
  returned, and its parts: the tasks after the last read (``tree``: the last levels of the
  reductions, and in core the second pass of a two-pass op; ``tree_idle``: the part of it during
  which no worker computed, scheduling and moving partials) and from the end of the last task to the
  result here (``gather``).

Medians of the runs. The floor is what distributed itself costs on the same cluster: one trivial
task, from its submission to its start and from its end to its result.

    python benchmarks/fixed_cost.py --cluster local                      # 2 worker processes x 1 thread, CPU
    python benchmarks/fixed_cost.py --cluster local-cuda --gpus 2        # dask-cuda, one worker per GPU
    python benchmarks/fixed_cost.py --scheduler-file sched.json --backend gpu
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = 73  # time steps a block
RESOLUTION = 5.0  # degrees: 37 x 72 points, 10.7 kB a step for tas


def flows(tas):
    import pipeline

    ops = pipeline.ops
    return {
        "standardized_anomaly": lambda: ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"], weights="coslat"),
        "monthly_anomaly": lambda: ops.weighted_mean(ops.anomaly(tas, freq="month"), dims=["lat", "lon"], weights="coslat"),
    }


def tiny_store(workdir: Path, blocks: int) -> Path:
    """The demo store of ``blocks`` blocks along time (made once, then reused)."""
    from pipeline.demo import BYTES_PER_POINT, _axes, write_demo

    path = workdir / f"fixed_cost_{blocks}.zarr"
    if not path.exists():
        lat, lon = _axes(RESOLUTION)
        write_demo(path, size=blocks * STEPS * lat.size * lon.size * BYTES_PER_POINT, resolution=RESOLUTION, time_chunk=STEPS)
    return path


def read_keys(result) -> set:
    """The keys of the read tasks of ``result``'s optimized graph (the one a cluster runs): the
    tasks that take a source's array handle, the ``original-<read layer>`` key of
    ``da.from_array`` (``open_dataset-<var>-<token>`` on the CPU, ``read-<var>-<token>`` on the GPU)."""
    import dask
    from dask.core import get_dependencies

    layers = result.data.__dask_graph__().layers
    handles = {f"original-{name}" for name in layers if f"original-{name}" in layers}
    (optimized,) = dask.optimize(result.data)
    graph = dict(optimized.__dask_graph__())
    return {k for k in graph if handles & set(get_dependencies(graph, k))}


class Spans:
    """Seconds spent in named calls during one run (their first call's start and last end, and
    their total), by wrapping them where ``pipeline.compute`` looks them up."""

    def __init__(self):
        self.calls: dict[str, list[tuple[float, float]]] = {}

    def wrap(self, owner, attr: str, name: str):
        original = getattr(owner, attr, None)
        if original is None:
            return contextlib.nullcontext()

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                self.calls.setdefault(name, []).append((t, time.time()))

        return _patched(owner, attr, timed)

    def seconds(self, name: str) -> float:
        return sum(b - a for a, b in self.calls.get(name, ()))

    def end(self, name: str) -> float | None:
        spans = self.calls.get(name)
        return spans[-1][1] if spans else None


@contextlib.contextmanager
def _patched(owner, attr, value):
    had = attr in vars(owner)
    old = vars(owner).get(attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        if had:
            setattr(owner, attr, old)
        else:
            delattr(owner, attr)


def instrumented(client, spans: Spans) -> contextlib.ExitStack:
    """Wrap the steps of ``pipeline.compute``'s distributed path with :class:`Spans`."""
    from pipeline.exec import compute, locality, memory

    stack = contextlib.ExitStack()
    for owner, attr, name in [
        (compute, "_graph_sizes", "sizes"),
        (memory, "check_workers", "memory"),
        (locality, "place", "place"),
        (client, "nthreads", "workers"),
        (client, "register_plugin", "plugin"),
        (client, "compute", "submit"),
        (client, "get", "submit"),
        (client, "gather", "gather"),
    ]:
        stack.enter_context(spans.wrap(owner, attr, name))
    return stack


READERS = (("pipeline.gpu.reader", "GpuSource"), ("pipeline.gpu.reader", "StagedSource"), ("pipeline.sources.reads", "StoreArray"))


def _clock_reads(dask_worker=None) -> int:
    """On a worker: record the wall-clock start and end of every block read by pipeline's readers
    (their ``__getitem__``), for when the task stream's keys do not show which tasks read (a
    read fused into the task that takes its block)."""
    import functools
    import importlib
    import time as _time

    wrapped = 0
    for module, name in READERS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if getattr(cls, "_read_spans", None) is not None:
            wrapped += 1
            continue
        original = cls.__getitem__
        spans = []

        @functools.wraps(original)
        def getitem(self, region, _original=original, _spans=spans):
            t = _time.time()
            try:
                return _original(self, region)
            finally:
                _spans.append((t, _time.time()))

        cls.__getitem__, cls._read_spans = getitem, spans
        wrapped += 1
    return wrapped


def _read_spans(dask_worker=None) -> list:
    """On a worker: the read spans recorded since the last call (and forget them)."""
    import importlib

    out = []
    for module, name in READERS:
        try:
            spans = getattr(importlib.import_module(module), name).__dict__.get("_read_spans")
        except ImportError:
            continue
        if spans:
            out += spans
            spans.clear()
    return out


def one_run(client, build, reads: set, local: bool) -> tuple[dict, object]:
    """The fixed costs of one run of ``build()`` (seconds), and its result; ``local``: the workers
    run on this machine."""
    from distributed import get_task_stream

    import pipeline

    result = build()  # the graph is built before the clock starts: that is the flow's, not the cluster's
    client.run(_read_spans)  # forget the reads of earlier runs
    spans = Spans()
    with get_task_stream(client) as stream, instrumented(client, spans):
        t0 = time.time()
        value = pipeline.compute(result)
        t1 = time.time()
    # the workers shift their clocks by their estimate of the scheduler's (a few ms off); on this
    # machine their clock is this process's, so the shift is undone
    shift = client.run(_scheduler_delay) if local else {}
    computes = [(r["key"], s["start"] - shift.get(r["worker"], 0.0), s["stop"] - shift.get(r["worker"], 0.0))
                for r in stream.data for s in r.get("startstops", ()) if s["action"] == "compute"]
    read = [(a, b) for k, a, b in computes if k in reads]
    if not read:  # the reads were fused into other tasks: the readers' own clocks
        read = [(a - shift.get(w, 0.0), b - shift.get(w, 0.0)) for w, spans_ in client.run(_read_spans).items() for a, b in spans_]
    if not read:
        raise RuntimeError("no read task in the task stream: the read layer was not found")
    first_task = min(a for _, a, _ in computes)
    last_task = max(b for _, _, b in computes)
    first_read, last_read = min(a for a, _ in read), max(b for _, b in read)
    submitted = spans.end("submit") or t0
    out = {
        "before_first_read": first_read - t0,
        "workers": spans.seconds("workers"),
        "sizes": spans.seconds("sizes"),
        "memory": spans.seconds("memory"),
        "plugin": spans.seconds("plugin"),
        "place": spans.seconds("place"),
        "submit": spans.seconds("submit"),
        "dispatch": first_task - submitted,
        "to_read": first_read - first_task,
        "after_last_read": t1 - last_read,
        "tree": last_task - last_read,
        "tree_idle": (last_task - last_read) - busy(computes, last_read),
        "gather": t1 - last_task,
        "tasks": len(computes),
        "tasks_after_last_read": sum(1 for _, a, _ in computes if a >= last_read),
        "total": t1 - t0,
    }
    return out, value


def busy(computes: list, since: float) -> float:
    """Seconds after ``since`` during which at least one worker computed a task."""
    total, end = 0.0, since
    for a, b in sorted((max(a, since), b) for _, a, b in computes if b > since):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _scheduler_delay(dask_worker) -> float:
    return dask_worker.scheduler_delay


def _noop(x):
    return x


def floor(client, repeat: int, local: bool) -> dict:
    """What distributed costs for a graph of one trivial task: submission to its start, its end to
    the result here."""
    from distributed import get_task_stream

    runs = []
    for i in range(repeat + 1):
        with get_task_stream(client) as stream:
            t0 = time.time()
            client.submit(_noop, i, pure=False).result()
            t1 = time.time()
        (r,) = stream.data
        shift = client.run(_scheduler_delay)[r["worker"]] if local else 0.0
        (s,) = [s for s in r["startstops"] if s["action"] == "compute"]
        runs.append({"before": s["start"] - shift - t0, "after": t1 - s["stop"] + shift, "total": t1 - t0})
    return {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]}


def measure(client, store: Path, backend: str, names: list[str], repeat: int, local: bool) -> dict:
    import pipeline

    tas = pipeline.open_dataset(store, backend=backend)["tas"]
    out = {"workers": dict(client.nthreads()), "floor": floor(client, repeat, local), "flows": {}}
    client.run(_clock_reads)
    for name in names:
        build = flows(tas)[name]
        reads = read_keys(build())
        expected = np.asarray(pipeline.to_numpy(pipeline.compute(build())))  # the warm-up
        # the same flow on dask's threads in this process: equal bit for bit, whatever the workers
        here = np.asarray(pipeline.to_numpy(build().compute(scheduler="threads")))
        runs = []
        for _ in range(repeat):
            figures, value = one_run(client, build, reads, local)
            value = np.asarray(pipeline.to_numpy(value))
            if not np.array_equal(value, expected, equal_nan=True):
                raise RuntimeError(f"{name}: a run's result differs from the warm-up's")
            runs.append(figures)
        out["flows"][name] = {"median": {k: statistics.median(r[k] for r in runs) for k in runs[0]}, "runs": runs,
                              "equal_to_threads": bool(np.array_equal(expected, here, equal_nan=True))}
    return out


BEFORE = ["workers", "sizes", "memory", "plugin", "place", "submit", "dispatch", "to_read"]
AFTER = ["tree", "tree_idle", "gather"]


def table(results: dict) -> str:
    """The medians in milliseconds, a row per flow and one for the floor."""
    columns = ["before_first_read", *BEFORE, "after_last_read", *AFTER]
    short = {"before_first_read": "BEFORE", "after_last_read": "AFTER"}
    lines = [f"milliseconds, medians of {results['repeat']} runs; workers: {results['workers']}",
             f"{'flow':<22}" + "".join(f"{short.get(c, c):>10}" for c in columns) + "   tasks (after the last read), equal to threads"]
    for name, r in results["flows"].items():
        m = r["median"]
        lines.append(f"{name:<22}" + "".join(f"{1e3 * m[c]:10.1f}" for c in columns)
                     + f"   {m['tasks']:.0f} ({m['tasks_after_last_read']:.0f}), {r['equal_to_threads']}")
    f = results["floor"]
    lines.append(f"{'floor (one task)':<22}{1e3 * f['before']:10.1f}" + " " * 10 * len(BEFORE) + f"{1e3 * f['after']:10.1f}")
    return "\n".join(lines)


@contextlib.contextmanager
def cluster_client(args):
    from distributed import Client

    if args.scheduler_file:
        with Client(scheduler_file=args.scheduler_file) as client:
            yield client
        return
    if args.cluster == "local-cuda":
        from dask_cuda import LocalCUDACluster

        visible = ",".join(str(i) for i in range(args.gpus))
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=visible, threads_per_worker=args.threads, host="127.0.0.1", protocol="tcp", dashboard_address=None)
    else:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=args.threads, processes=True, host="127.0.0.1",
                               protocol="tcp://", dashboard_address=None)
    with cluster, Client(cluster) as client:
        yield client


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", choices=["local", "local-cuda"], default="local")
    ap.add_argument("--scheduler-file", help="attach to a running scheduler instead of starting a cluster")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of --cluster local")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs (one worker each) of --cluster local-cuda")
    ap.add_argument("--threads", type=int, default=1, help="threads a worker")
    ap.add_argument("--backend", choices=["cpu", "gpu"], help="default: gpu on local-cuda, else cpu")
    ap.add_argument("--store", help="a store with a tas variable (default: the tiny demo store of --blocks)")
    ap.add_argument("--blocks", type=int, default=6, help="blocks of 73 steps of the tiny demo store")
    ap.add_argument("--workdir", default="data/bench")
    ap.add_argument("--flows", default="standardized_anomaly,monthly_anomaly")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    backend = args.backend or ("gpu" if args.cluster == "local-cuda" else "cpu")
    store = Path(args.store) if args.store else tiny_store(Path(args.workdir), args.blocks)
    with cluster_client(args) as client:
        results = measure(client, store, backend, args.flows.split(","), args.repeat, local=not args.scheduler_file)
    results.update(store=str(store), backend=backend, repeat=args.repeat)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    main()
