"""Strong scaling over the GPUs of one machine: the same flow on the same store, 1, 2, 4 GPUs.

Each GPU count gets a dask-cuda ``LocalCUDACluster`` over the first N GPUs (one worker per GPU,
``--threads`` threads each); pipeline's graph is the same as on one GPU: every worker reads and
decodes its own slab of blocks along time (nvCOMP; ``pipeline/locality.py``, off with
``--no-locality``), and partial results meet in trees across the GPUs. The flow is the
standardized-anomaly global mean (and the others with ``--flows``). Medians of ``--repeat`` runs
after a warm-up; the store stays in the page cache. For the last run of each flow, per worker:
tasks, seconds computing and receiving data, and the bytes and task outputs received from the other
workers (their transfer logs).

    python benchmarks/scaling.py --store data/bench/tas.zarr --gpus 1,2,4 --json scaling.json

``--processes K`` times the user's own command instead (or as well, ``--mode both``): ``pipeline
run FLOW_FILE --input STORE`` as fresh processes, K of each, alternating: one GPU without a cluster,
then each GPU count with ``--cluster PROFILE`` over the first N GPUs (``CUDA_VISIBLE_DEVICES``).
Per row, the medians of the run's own seconds, the computations made while its graph was built
(``stats``: a genomics filter's statistics, a whole pass over the data before the run), the whole
process's seconds, the read rate (the input's bytes over the run), where the process's seconds
went before the run (imports, opening, the backend: a cluster's start), and whether every process
wrote the same output.

    python benchmarks/scaling.py --store STORE --gpus 1,2,4 --mode processes --processes 3

With ``--trace`` every process of those runs (the command, the fork server, the workers) records
its steps on one clock (``benchmarks/tracing/sitecustomize.py``), and each row adds the medians of
the runs' milestones: the cluster's start, the first worker's fork and start, the run's start, the
first block read, the last read's end, the run's end, and the collector's seconds
(``benchmarks/process_trace.py``, which also prints one run's processes step by step).

With ``--user-stores`` the processes run on each store as the users' tools write it
(``user_stores.py``: Zarr v3 as xarray writes it, Zarr v2 Blosc, NetCDF4 zlib), made at ``--shape``
under ``--workdir`` or reused, and on ``--genomics-store`` with ``--genomics-flow-file`` (a GWAS), one
table of every store at the end:

    python benchmarks/scaling.py --user-stores v3-default,v2-blosc,zlib --shape 12410,721,1440 \
        --genomics-store genomics.vcz --gpus 1,2,4 --processes 2 --trace

Without ``--store``, the demo store of ``--shape`` that ``peers.py`` generates is made (or reused)
under ``--workdir`` and converted once to the GPU layout, which is what is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


CLIMATE = ("standardized_anomaly", "monthly_anomaly", "rolling")
GENOMICS = ("pca", "gwas")


def flows(tas):
    import pipeline

    ops = pipeline.ops
    return {
        "standardized_anomaly": lambda: ops.weighted_mean(ops.standardized_anomaly(tas, dim="time"), dims=["lat", "lon"], weights="coslat"),
        "monthly_anomaly": lambda: ops.weighted_mean(ops.anomaly(tas, freq="month"), dims=["lat", "lon"], weights="coslat"),
        "rolling": lambda: ops.rolling_mean(tas, window=5, center=True).max("time"),
    }


def genomics_flows(ds):
    """``pca`` and ``gwas_linear_regression`` as benchmarks/genomics_sgkit.py runs them against
    sgkit: each a list of arrays."""
    from genomics_sgkit import _analysis

    import pipeline.genomics as sg

    return {name: (lambda name=name: [v.data for v in _analysis(name, sg, ds, None).values()]) for name in GENOMICS}


def open_genomics(store: str, variant_chunk: int):
    """The genomics store on the GPU in blocks of ``variant_chunk`` variants, with
    genomics_sgkit.py's selection (biallelic, polymorphic; the dosage with missing calls as the
    reference allele), computed on the current cluster, each block keeping its own variants
    (``keep_in_blocks``: dask's ``take`` would move variants between blocks, and workers)."""
    import dask

    import pipeline
    from pipeline.ops.genomics._dataset import keep_in_blocks

    ds = pipeline.open_dataset(store, backend="gpu", chunks={"variants": variant_chunk})
    alleles = np.asarray(ds["variant_allele"].values)
    biallelic = np.array([[bool(a) for a in row] for row in alleles]).sum(axis=1) == 2
    ds = keep_in_blocks(ds, "variants", biallelic).isel(alleles=slice(0, 2))
    ac = ds["call_genotype"].clip(0).sum("ploidy", dtype="int8")  # int8: no int64 block in between
    (total,) = dask.compute(ac.sum("samples", dtype="int32").data)
    total = np.asarray(pipeline.to_numpy(total))
    ds = ds.assign(call_alternate_allele_count=ac, call_dosage=ac.astype("float64"))
    return keep_in_blocks(ds, "variants", (total > 0) & (total < 2 * ds.sizes["samples"]))


def build_flows(store: str | None, genomics_store: str | None, names: list[str], variant_chunk: int) -> dict:
    import pipeline

    out = {}
    if any(n in CLIMATE for n in names):
        out.update(flows(pipeline.open_dataset(store, backend="gpu")["tas"]))
    if any(n in GENOMICS for n in names):
        out.update(genomics_flows(open_genomics(genomics_store, variant_chunk)))
    return out


def as_numpy(value) -> list:
    import pipeline

    values = value if isinstance(value, (list, tuple)) else [value]
    return [np.ascontiguousarray(pipeline.to_numpy(v)) for v in values]


def digest(values: list) -> str:
    """sha256 of the results' bytes: equal digests are bitwise equal results (NaNs included)."""
    import hashlib

    h = hashlib.sha256()
    for v in values:
        h.update(str((v.dtype.str, v.shape)).encode())
        h.update(v.tobytes())
    return h.hexdigest()


def run(stores: dict, n_gpus: int, names: list[str], repeat: int, threads: int, memory_limit: str | None,
        stealing: bool = True, locality: bool = True, device_memory_limit: str | None = None, protocol: str | None = None,
        worker_saturation: float | None = None) -> dict:
    """Each flow of ``names`` on ``n_gpus`` GPUs. Under ``memory_limit`` each climate flow gets as
    many threads a worker as its memory plan allows (at most ``threads``), one cluster for each
    such count; the genomics flows take ``threads`` (the workers' own memory check refuses a count
    that does not fit)."""
    import dask
    import distributed  # noqa: F401  # its defaults in dask's config before any setting of its own is set:
    # a set() entered before distributed is imported takes the whole "distributed" section away on exit

    import pipeline
    from pipeline.exec.compute import compute_threads

    settings = {"pipeline.gpu.memory-limit": memory_limit} if memory_limit else {}
    settings["pipeline.cluster.locality"] = locality  # read where the graph is submitted
    if not stealing:  # read by the scheduler when the cluster starts
        settings["distributed.scheduler.work-stealing"] = False
    if worker_saturation is not None:  # also read by the scheduler when it starts
        settings["distributed.scheduler.worker-saturation"] = worker_saturation
    by_threads: dict[int, list[str]] = {}
    with dask.config.set(settings):
        for name in names:
            n = threads
            if memory_limit and name in CLIMATE:  # this process sees the same GPUs as the workers
                tas = pipeline.open_dataset(stores["climate"], backend="gpu")["tas"]
                n = min(threads, compute_threads(flows(tas)[name]()) or threads)
            by_threads.setdefault(n, []).append(name)
    out = {}
    for n, group in by_threads.items():
        out.update(run_on_cluster(stores, n_gpus, group, repeat, n, settings, device_memory_limit, protocol))
    return out


def run_on_cluster(stores: dict, n_gpus: int, names: list[str], repeat: int, threads: int, settings: dict,
                   device_memory_limit: str | None = None, protocol: str | None = None) -> dict:
    import dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client, get_task_stream

    import pipeline

    visible = ",".join(str(i) for i in range(n_gpus))
    out = {}
    t_start = time.perf_counter()
    with dask.config.set(settings), LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=visible, threads_per_worker=threads,
            **({"device_memory_limit": device_memory_limit} if device_memory_limit else {}),
            **({"protocol": protocol} if protocol else {})) as cluster, Client(cluster) as client:
        client.run(dask.config.set, settings)  # workers read the same settings
        out["cluster_start_s"] = round(time.perf_counter() - t_start, 2)
        out["workers"] = workers(client)
        if n_gpus > 1:
            out["transfer_200MB_s"] = transfer_seconds(client)
            print(f"{n_gpus} GPU(s): 200 MB from one worker's GPU to another's: {out['transfer_200MB_s']:.3f} s", flush=True)
        t = time.perf_counter()
        built = build_flows(stores.get("climate"), stores.get("genomics"), names, stores.get("variant_chunk", 10_000))
        out["open_s"] = round(time.perf_counter() - t, 2)  # the genomics selection computes on the cluster
        for name in names:
            build = built[name]
            try:
                t = time.perf_counter()
                result = as_numpy(pipeline.compute(build()))  # the first run: the workers compile their kernels
                first = time.perf_counter() - t
            except Exception as e:  # report it, and go on with the other flows
                out[name] = {"failed": f"{type(e).__name__}: {e}"}
                print(f"{n_gpus} GPU(s) {name} ({threads} threads a worker): FAILED {out[name]['failed'][:300]}", flush=True)
                continue
            times = []
            for i in range(repeat):
                clear_transfer_logs(client)
                with get_task_stream() as stream:
                    t, t0 = time.perf_counter(), time.time()  # the task stream's clock is time.time()
                    value = as_numpy(pipeline.compute(build()))
                    times.append(time.perf_counter() - t)
            from pipeline.gpu.pinned import pinned_files_bytes

            out[name] = {"seconds": statistics.median(times), "first_seconds": first, "all": times, "threads": threads,
                         "pinned_files_bytes": client.run(pinned_files_bytes),  # chunk files pinned by each worker
                         "digest": digest(value), "first_digest": digest(result),
                         "checksum": float(sum(np.nansum(np.asarray(v, dtype=np.float64)) for v in value)),
                         "last_run": task_summary(stream.data, received(client), t0),
                         "timeline": timeline(stream.data, t0)}
            received_mb = sum(w.get("received_bytes", 0) for w in out[name]["last_run"].values()) / 1e6
            pinned_gb = sum(out[name]["pinned_files_bytes"].values()) / 1e9
            print(f"{n_gpus} GPU(s) {name} ({threads} threads a worker): first {first:.3f} s, warm {out[name]['seconds']:.3f} s "
                  f"({', '.join(f'{x:.3f}' for x in times)}), {received_mb:.0f} MB moved between workers, "
                  f"{pinned_gb:.1f} GB of files pinned; digest {out[name]['digest'][:12]}; "
                  f"last run per worker: {out[name]['last_run']}", flush=True)
            del result
    return out


def _ones(n: int, seed: int):
    import cupy

    return cupy.full(n, seed, dtype="f8")


def _head(x) -> float:
    return float(x[:10].sum())


def transfer_seconds(client, nbytes: int = 200_000_000, repeat: int = 3) -> float:
    """Median seconds to move a CuPy array of ``nbytes`` made on one worker to another and run a
    tiny task there: the comms' cost (TCP goes through host memory, UCX GPU to GPU)."""
    from distributed import wait

    a, b = sorted(client.nthreads())[:2]
    times = []
    for i in range(repeat):
        x = client.submit(_ones, nbytes // 8, i, workers=[a], pure=False)
        wait(x)
        t = time.perf_counter()
        client.submit(_head, x, workers=[b], pure=False).result()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def workers(client) -> dict:
    """What each worker runs with: CPU cores it may use, host memory limit, its GPU."""

    def probe():
        import os

        return {"cpus": len(os.sched_getaffinity(0)), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    info = client.run(probe)
    for addr, w in client.scheduler_info()["workers"].items():
        info[addr]["memory_limit"] = w.get("memory_limit")
    print(f"workers: {info}", flush=True)
    return info


def clear_transfer_logs(client) -> None:
    """Empty each worker's log of the data it received from other workers (before a timed run)."""

    def clear(dask_worker):
        dask_worker.transfer_incoming_log.clear()

    client.run(clear)


def received(client) -> dict:
    """Per worker: ``{key: bytes}`` of every task output it received from another worker since
    :func:`clear_transfer_logs`, and from which worker (``{key: worker}``)."""

    def log(dask_worker):
        keys, source = {}, {}
        for entry in dask_worker.transfer_incoming_log:
            keys.update(entry["keys"])
            source.update(dict.fromkeys(entry["keys"], entry["who"]))
        return {"keys": keys, "source": source}

    return client.run(log)


def timeline(records: list[dict], t0: float) -> list[list]:
    """The last run's task stream, one row per step: worker, task name (its key's prefix), block
    index, action (compute, transfer, ...), start and stop in seconds after ``t0``."""
    from dask.utils import key_split

    rows = []
    for r in records:
        key = r.get("key")
        index = list(key[1:]) if isinstance(key, tuple) else []
        for st in r.get("startstops", ()):
            rows.append([r.get("worker", "?"), key_split(key), index, st["action"], round(st["start"] - t0, 4), round(st["stop"] - t0, 4)])
    return sorted(rows, key=lambda row: row[4])


def task_summary(records: list[dict], incoming: dict | None = None, t0: float | None = None) -> dict:
    """Per worker: tasks, seconds computing, seconds moving data in from other workers, bytes of
    the task outputs it made and, with ``incoming`` (from :func:`received`), the bytes and the
    number of task outputs it received from other workers, and the largest of them; with ``t0``
    (``time.time()`` when the computation was asked for), when its first task began and its last
    ended, in seconds after ``t0``."""
    out = {}
    for r in records:
        w = out.setdefault(r.get("worker", "?"), {"tasks": 0, "compute_s": 0.0, "transfer_s": 0.0, "output_bytes": 0})
        w["tasks"] += 1
        for s in r.get("startstops", ()):
            if s["action"] == "compute":
                w["compute_s"] += s["stop"] - s["start"]
                if t0 is not None:
                    w["first_s"] = round(min(w.get("first_s", 1e9), s["start"] - t0), 3)
                    w["last_s"] = round(max(w.get("last_s", -1e9), s["stop"] - t0), 3)
            elif s["action"] == "transfer":
                w["transfer_s"] += s["stop"] - s["start"]
        nbytes = r.get("nbytes", 0)
        w["output_bytes"] += sum(nbytes.values()) if isinstance(nbytes, dict) else int(nbytes or 0)
    for worker, log in (incoming or {}).items():
        sizes = list(log["keys"].values())
        w = out.setdefault(worker, {"tasks": 0, "compute_s": 0.0, "transfer_s": 0.0, "output_bytes": 0})
        w.update(received_bytes=sum(sizes), received_keys=len(sizes), largest_received=max(sizes, default=0))
    return {k: {**v, "compute_s": round(v["compute_s"], 3), "transfer_s": round(v["transfer_s"], 3)} for k, v in out.items()}


def touch_memory(nbytes: int, threads: int = 16) -> float:
    """Fault in ``nbytes`` of anonymous memory on ``threads`` threads, then free it; the seconds
    taken. Some virtual machines back their memory only as it is first used: on the 2-GPU H200
    machine, about 3 GB/s. The first run that allocates tens of GB there (a process's pinned
    buffers, the workers) pays seconds that the runs after it and a physical host do not: pinned
    buffers of 1.7 GB took 3.9-4.5 s each to fault in during one such run, and 0.1-0.5 s each in
    a later one. Touched once first, every configuration meets the same machine."""
    import ctypes
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = (ctypes.c_char * nbytes).from_buffer(m)
    ptr, piece = ctypes.addressof(view), 64 << 20
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda at: ctypes.memset(ptr + at, 1, min(piece, nbytes - at)), range(0, nbytes, piece)))
    seconds = time.perf_counter() - t
    del view
    m.close()
    return seconds


def process_runs(store: str, flow_file: str, counts: list[int], repeat: int, backend: str, profile: str,
                 workdir: Path, trace: bool = False) -> dict:
    """The user's command as fresh processes (the module's docstring): ``repeat`` of each
    configuration, alternating; one row per configuration. With ``trace``, every process of each
    run records its steps (``benchmarks/tracing``), and each row has the medians of the runs'
    milestones (``process_trace.milestones``: the cluster's start, the worker's fork and start, the
    first and last block read, the run's start and end, the collector's seconds)."""
    from out_of_core import run_once
    from process_trace import load, milestones

    workdir.mkdir(parents=True, exist_ok=True)
    configs = [("1 GPU, no cluster" if backend == "gpu" else "no cluster", 1, ())]
    configs += [(f"{n} GPU(s), --cluster {profile}" if backend == "gpu" else f"--cluster {profile}", n, ("--cluster", profile))
                for n in counts]
    got: dict = {label: [] for label, _, _ in configs}
    tracing = Path(__file__).resolve().parent / "tracing"
    for i in range(repeat):
        for k, (label, n, args) in enumerate(configs):
            env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(n)))} if backend == "gpu" else {}
            if trace:
                folder = workdir / "traces" / f"process-{k}-{i}"
                folder.mkdir(parents=True, exist_ok=True)
                env |= {"PYTHONPATH": os.pathsep.join([str(tracing), *filter(None, [os.environ.get("PYTHONPATH")])]),
                        "PIPELINE_TRACE_DIR": str(folder), "PIPELINE_TRACE_T0": repr(time.time())}
            got[label].append(run_once(Path(flow_file), store, backend, None, workdir, f"process-{k}-{i}", args, env))
            if trace:
                got[label][-1]["trace"] = milestones(load(folder))
    first = got[configs[0][0]][0]["digests"]
    rows = []
    for label, n, _ in configs:
        runs = got[label]
        med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        before = {k: statistics.median(r["startup"].get(f"{k}_seconds", 0.0) for r in runs)
                  for k in ("import", "open_source", "build_graph", "statistics", "backend_init")}
        rows.append({"config": label, "gpus": n, "run_seconds": med("run_seconds"), "process_seconds": med("process_seconds"),
                     "read_GBps": runs[0]["bytes_read"] / 1e9 / max(med("run_seconds"), 1e-9), "before_run": before,
                     "cluster": runs[0]["cluster"], "same_output": all(r["digests"] == first for r in runs), "runs": runs})
        if trace:
            rows[-1]["trace"] = {k: statistics.median(r["trace"][k] for r in runs) if all(r["trace"][k] is not None for r in runs)
                                 else None for k in runs[0]["trace"]}
    # stats: computations made while the graph was built (a genomics filter's statistics over the
    # data, a whole pass over it), apart from the run's own compute
    print(f"{'fresh processes':<34}{'run':>8}{'stats':>8}{'process':>9}{'read':>10}{'imports':>9}{'backend':>9}  same output")
    for r in rows:
        print(f"{r['config']:<34}{r['run_seconds']:>7.2f}s{r['before_run']['statistics']:>7.2f}s{r['process_seconds']:>8.2f}s"
              f"{r['read_GBps']:>7.1f}GB/s{r['before_run']['import']:>8.2f}s{r['before_run']['backend_init']:>8.2f}s"
              f"  {r['same_output']}")
    if trace:
        keys = list(rows[0]["trace"])
        print("milestones (s since the command started, medians): " + ", ".join(keys))
        for r in rows:
            print(f"{r['config']:<34}" + "".join(f"{'-' if r['trace'][k] is None else round(r['trace'][k], 2):>9}" for k in keys))
    return {"flow_file": flow_file, "repeat": repeat, "rows": rows}


def store_table(args) -> dict:
    """``--user-stores``: the stores made (or reused) by ``user_stores.py``, and the genomics store,
    each timed as fresh processes (:func:`process_runs`), then one table of every store and
    configuration."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import user_stores

    made = user_stores.main(["--shape", args.shape, "--workdir", args.workdir, "--only", args.user_stores])
    stores = [(name, path, args.flow_file) for name, path in made.items()]
    if args.genomics_store:
        stores.append(("vcf-zarr", args.genomics_store, args.genomics_flow_file))
    counts = [int(n) for n in args.gpus.split(",")]
    tables = {}
    for name, path, flow_file in stores:
        print(f"== {name}: {path}", flush=True)
        tables[name] = process_runs(path, flow_file, counts, args.processes, args.backend, args.cluster_profile,
                                    Path(args.workdir) / "scaling-processes" / name, args.trace)
    # speed-ups of the run: against the process without a cluster, and against the cluster of the
    # fewest GPUs (the "2 GPUs at least 1.85x one GPU")
    print(f"\n{'store':<12}{'configuration':<34}{'run':>8}{'process':>9}{'read':>10}{'vs alone':>10}{'vs fewest':>11}  same output")
    for name, table in tables.items():
        alone, fewest = table["rows"][0]["run_seconds"], table["rows"][min(1, len(table["rows"]) - 1)]["run_seconds"]
        for r in table["rows"]:
            run = max(r["run_seconds"], 1e-9)
            print(f"{name:<12}{r['config']:<34}{r['run_seconds']:>7.2f}s{r['process_seconds']:>8.2f}s"
                  f"{r['read_GBps']:>7.1f}GB/s{alone / run:>9.2f}x{fewest / run:>10.2f}x  {r['same_output']}")
    out = {"shape": args.shape, "stores": {name: path for name, path, _ in stores}, "processes": tables}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="a store with a tas variable (default: generate one of --shape)")
    ap.add_argument("--genomics-store", help="a VCF Zarr store, for the flows pca and gwas")
    ap.add_argument("--variant-chunk", type=int, default=10_000, help="variants a block of the genomics store")
    ap.add_argument("--shape", default="4380,721,1440", help="time,lat,lon of the generated store")
    ap.add_argument("--workdir", default="data/bench")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--flows", default="standardized_anomaly", help=f"of {', '.join(CLIMATE + GENOMICS)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--memory-limit", default=None,
                    help="pipeline.gpu.memory-limit on each GPU; each flow then runs with as many threads a worker as its memory plan allows")
    ap.add_argument("--device-memory-limit", default=None,
                    help="dask-cuda's device_memory_limit a worker: task outputs past it spill to host memory")
    ap.add_argument("--protocol", default=None,
                    help="the workers' comms: tcp (distributed's default), or ucx (needs distributed-ucxx: GPU to GPU over NVLink)")
    ap.add_argument("--worker-saturation", type=float, default=None,
                    help="distributed.scheduler.worker-saturation (dask's default 1.1; pipeline's cluster profiles take 1.0)")
    ap.add_argument("--no-work-stealing", action="store_true",
                    help="the scheduler keeps tasks where it placed them (no moving of blocks to idle workers)")
    ap.add_argument("--no-locality", action="store_true",
                    help="leave the placement of every block to the scheduler (pipeline.cluster.locality: false)")
    ap.add_argument("--mode", choices=["in-process", "processes", "both"], default=None,
                    help="in-process: one cluster a GPU count, runs in this process (the default without --processes); "
                         "processes: the user's command as fresh processes (the default with --processes)")
    ap.add_argument("--processes", type=int, default=0, help="fresh processes of each configuration, alternating")
    ap.add_argument("--flow-file", default=str(Path(__file__).resolve().parent.parent / "flows" / "climate_anomaly.yaml"),
                    help="the flow of --processes")
    ap.add_argument("--user-stores", default=None,
                    help="with --processes: the stores as the users' tools write them, made at --shape under --workdir "
                         "(benchmarks/user_stores.py: some of v3-default, v2-blosc, zlib), each timed in turn, and "
                         "--genomics-store with --genomics-flow-file: one table of every store")
    ap.add_argument("--genomics-flow-file", default=str(Path(__file__).resolve().parent.parent / "flows" / "gwas.yaml"),
                    help="the flow of --processes on --genomics-store")
    ap.add_argument("--cluster-profile", default="local-gpu", help="the --cluster of --processes")
    ap.add_argument("--backend", choices=["gpu", "cpu"], default="gpu", help="the --backend of --processes")
    ap.add_argument("--trace", action="store_true",
                    help="with --processes: every process of each run records its steps (benchmarks/tracing), "
                         "and each row gets the runs' milestones: where a worker's seconds go")
    ap.add_argument("--warm-memory", default=None,
                    help="touch this much host memory (such as 64GB) once before any run, then free it (see touch_memory)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import xarray as xr

    if args.warm_memory:
        import dask.utils

        nbytes = dask.utils.parse_bytes(args.warm_memory)
        print(f"host memory: {nbytes / 1e9:.0f} GB touched in {touch_memory(nbytes):.1f} s, then freed", flush=True)
    mode = args.mode or ("processes" if args.processes else "in-process")
    if mode != "in-process" and args.processes < 1:
        raise SystemExit("--mode processes needs --processes K (K >= 1)")

    if args.user_stores is not None:
        if mode != "processes":
            raise SystemExit("--user-stores needs --processes K")
        return store_table(args)

    names = args.flows.split(",")
    unknown = [n for n in names if n not in CLIMATE + GENOMICS]
    if unknown:
        raise SystemExit(f"unknown flows {unknown}: expected some of {', '.join(CLIMATE + GENOMICS)}")
    if any(n in GENOMICS for n in names) and not args.genomics_store:
        raise SystemExit("the flows pca and gwas need --genomics-store")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not args.store and any(n in CLIMATE for n in names):
        from peers import ensure_store

        import pipeline

        plain = ensure_store(Path(args.workdir), tuple(int(n) for n in args.shape.split(",")), 73, 0)[0]
        sharded = plain.with_name(plain.stem + "_sharded.zarr")  # the name peers.py gives it
        if not sharded.exists():
            pipeline.convert(plain, sharded)
        args.store = str(sharded)
    stores = {"climate": args.store, "genomics": args.genomics_store, "variant_chunk": args.variant_chunk}
    sizes = {}
    if args.store:
        opened = xr.open_dataset(args.store) if Path(args.store).is_file() else xr.open_zarr(args.store)  # NetCDF4, Zarr
        sizes["climate"] = opened["tas"].nbytes
    if args.genomics_store:
        sizes["genomics"] = xr.open_zarr(args.genomics_store, concat_characters=False)["call_genotype"].nbytes
    counts = [int(n) for n in args.gpus.split(",")]
    table = {"stores": stores, "bytes": sizes, "memory_limit": args.memory_limit}
    if mode != "in-process":
        if not args.store:
            raise SystemExit("--processes needs a climate store (--store, or a generated one)")
        table["processes"] = process_runs(args.store, args.flow_file, counts, args.processes, args.backend,
                                          args.cluster_profile, Path(args.workdir) / "scaling-processes", args.trace)
        if mode == "processes":
            if args.json:
                Path(args.json).write_text(json.dumps(table, indent=1, default=str))
            return table
    results = {}
    for n in counts:
        try:
            results[n] = run(stores, n, names, args.repeat, args.threads, args.memory_limit, stealing=not args.no_work_stealing,
                             locality=not args.no_locality, device_memory_limit=args.device_memory_limit,
                             protocol=args.protocol, worker_saturation=args.worker_saturation)
        except Exception as e:  # report it, and go on with the other counts
            print(f"{n} GPU(s): FAILED {type(e).__name__}: {e}", flush=True)
    counts = [n for n in counts if n in results]
    if not counts:
        raise SystemExit("no GPU count ran")
    table["results"] = results
    for kind, nbytes in sizes.items():
        print(f"{kind} store {stores[kind]}: {nbytes / 1e9:.1f} GB")
    base = results[counts[0]]
    print(f"{'flow':<22}" + "".join(f"{n:>3} GPU first  warm  speed-up" for n in counts))
    for name in names:
        ran = [n for n in counts if "seconds" in results[n].get(name, {})]
        ref = base.get(name, {}).get("seconds")
        row = "".join(f"{results[n][name]['first_seconds']:>9.2f} {results[n][name]['seconds']:>6.2f} "
                      + (f"{ref / results[n][name]['seconds']:>7.2f}x" if ref else f"{'':>8}")
                      if n in ran else f"{'failed':>24}" for n in counts)
        print(f"{name:<22}{row}")
        digests = {results[n][name]["digest"] for n in ran} | {results[n][name]["first_digest"] for n in ran}
        table.setdefault("identical", {})[name] = len(ran) == len(counts) and len(digests) == 1
        print(f"  results bitwise identical across GPU counts and runs: {table['identical'][name]}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1, default=str))
    return table


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
