"""The ``pipeline`` command: a thin layer over the Python API and the op registry.

Exit codes: 0 done, 2 bad input (flow, file, variable, parameter, profile), 1 failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import sys

from ._version import __version__

EXIT_OK, EXIT_FAILURE, EXIT_INPUT = 0, 1, 2


log = logging.getLogger("pipeline.cli")


def _err(msg: str, **fields) -> None:
    """An error on stderr: ``pipeline: error: ...`` as text, or a JSON line with ``--log-format json``."""
    log.error(msg, extra=fields)


def _terminate(signum, frame):
    # batch systems cancel jobs with SIGTERM: unwind like an interrupt, so partial output is removed
    raise KeyboardInterrupt(f"signal {signum}")


def _may_use_gpu(args, flow_path: str | None = None) -> bool:
    """Whether this command may use the GPU in this process: no ``cpu`` backend asked for (on the
    command line, in the settings, or by the flow). A run on a cluster does too: it resolves the
    backend and builds its graph of CuPy blocks here, which made the command's CUDA context after
    its imports (2-GPU H200 machine: 0.46 s for the driver and 0.3 s for the context, before the
    graph was built)."""
    import dask.config

    if (args.backend or dask.config.get("pipeline.backend", "auto")) == "cpu":
        return False
    return args.backend is not None or flow_path is None or _flow_backend(flow_path) != "cpu"


def _flow_doc(path: str) -> dict:
    """A flow file as read, where it reads as a mapping (else empty); the flow is validated later."""
    import yaml  # dask's config has imported it

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except Exception:
        return {}
    return doc if isinstance(doc, dict) else {}


def _flow_backend(path: str):
    """The ``backend`` key of a flow file."""
    return _flow_doc(path).get("backend")


def cmd_run(args) -> int:
    import time

    t = time.perf_counter()
    _pause_collector()  # until its imports are done (_freeze_imports)
    from .exec import prefork

    prefork.start_for(args.cluster)  # a local cluster's fork server first: its imports are the longest path
    if _may_use_gpu(args, args.flow):
        from .gpu import context

        _gpu_settings(args)  # before the context and the cluster's workers are made
        context.start()  # made while the libraries below are imported
    from .exec.cluster import open_cluster, profile_from_args, start_early

    profile = profile_from_args(args.cluster, args.scheduler, args.scheduler_file)
    _one_shot_pinning()  # before the cluster starts: its workers take this process's settings
    starting = start_early(profile)  # a local cluster's workers start while this process imports
    try:
        import dask.array  # noqa: F401  (a run needs them: imported here, its report counts them as imports)
        import zarr  # noqa: F401

        from .flows import check_report, load_flow, run_flow, step_times, with_source

        if args.import_seconds is not None:
            args.import_seconds += time.perf_counter() - t
        _freeze_imports()
        flow = load_flow(args.flow)  # validate before the cluster is used or anything is written
        if args.input is not None:
            flow = with_source(flow, args.input)
        if args.report:
            check_report(flow, args.report, args.output)
        progress = not args.no_progress and sys.stderr.isatty()
        cluster, starting = open_cluster(profile, starting), None  # it closes the cluster it takes
        with cluster as client:
            rep = run_flow(
                flow, backend=args.backend, output=args.output, client=client, report=args.report, progress=progress,
                command=args.command_line, resume=args.resume, import_seconds=args.import_seconds,
            )
    finally:
        if starting is not None:  # not taken over: an invalid flow, an interrupt
            starting.close()
    print(
        f"{rep['flow']}: wrote {rep['sink']['path']} on {rep['backend']} in {rep['wall_seconds']:.2f} s "
        f"({rep['bytes_read'] / 1e9:.3f} GB read, {rep['throughput_GBps']} GB/s; {step_times(rep['steps'])})"
    )
    if rep["sink"]["chunks_kept"]:
        kept, total = rep["sink"]["chunks_kept"], rep["sink"]["chunks_kept"] + rep["sink"]["chunks_written"]
        print(f"resumed: {kept} of {total} chunks were kept from the interrupted run")
    if args.report:
        print(f"report: {args.report}")
    return EXIT_OK


def _one_shot_pinning() -> None:
    """A run of one flow pins a chunk file in the page cache only when it reads it again
    (``pipeline.gpu.pin-files: auto`` becomes ``reread``): pinning costs about one read and ends
    with the process. Set before a local cluster starts, so that its workers, which serve this run
    alone, take it too: distributed's nannies hand their workers the settings of the process that
    makes them, as they are made. On two H200s, workers that pinned each file at its first read
    spent 70 s of I/O threads' time in ``cudaHostRegister`` over a 31 GB store of 12,410 files:
    one worker read it in 7.7 s, and in 4.3 s with the command's policy. A value other than
    ``auto`` is kept (and checked with every setting, by ``pipeline.config.check``, before
    anything runs)."""
    import dask.config

    if dask.config.get("pipeline.gpu.pin-files", "auto") == "auto":
        dask.config.set({"pipeline.gpu.pin-files": "reread"})


def _gpu_settings(args) -> None:
    """``pipeline.gpu.hardware-queues: auto`` for a run: 32 hardware work queues, and 16 task
    threads where ``pipeline.gpu.threads`` is at its default (8), over a Zarr store whose chunks
    are large single zstd frames (:func:`pipeline.gpu.context.large_frames`: zarr's default codec,
    as xarray writes it); CUDA's default of 8 queues elsewhere. Set before the context and the
    cluster, whose workers take this process's settings.

    Measured on the H200 machine (fresh processes, 18.2 GB): over zarr's default store the run took
    2.01-2.27 s with both, against 2.75-3.63 s with neither, and 32 queues with 8 threads gained
    nothing measurable. But each process with 32 queues took 0.3 s longer outside its run (its
    exit), over Blosc and NetCDF4 stores the run was no faster, and a GPU shared by many processes
    of 32 queues made new contexts fail."""
    import dask.config

    from . import config
    from .gpu import context

    if dask.config.get("pipeline.gpu.hardware-queues", "auto") != "auto":
        return
    source = _flow_doc(args.flow).get("source")
    source = source if isinstance(source, dict) else {}
    if not context.large_frames(args.input or source.get("path"), source.get("variable")):
        return
    settings = {"pipeline.gpu.hardware-queues": 32}
    if dask.config.get("pipeline.gpu.threads", None) == config.defaults["pipeline"]["gpu"]["threads"]:
        settings["pipeline.gpu.threads"] = 16
    dask.config.set(settings)


def cmd_validate(args) -> int:
    """Check each flow file; where its source exists, also against the data (metadata only)."""
    from .errors import InputError

    status = EXIT_OK
    for path in args.flow:
        try:
            print(_validate_one(path))
        except InputError as e:
            _err(str(e), flow_file=path)
            status = EXIT_INPUT
    return status


def _validate_one(path: str) -> str:
    from pathlib import Path

    from .flows import check_data, check_dataset_steps, check_sink, load_flow

    flow = load_flow(path)
    check_sink(flow)  # a sink that would destroy data (the source itself, a store pipeline did not write)
    line = f"{path}: valid flow {flow.name!r} with {len(flow.steps)} step(s): {' -> '.join(s.op for s in flow.steps)}"
    src = flow.source
    if not Path(src.path).exists() and "://" not in src.path and src.demo is not None:
        skipped = f"{line}\n  source {src.path} does not exist yet (a demo is generated when the flow runs): data checks skipped"
        if src.dataset:  # the steps' variables, by name, from source.variables
            check_dataset_steps(flow)
            skipped += "; the steps' variables checked by name against source.variables"
        return skipped
    sizes = ", ".join(f"{d}: {n}" for d, n in check_data(flow).items())  # the source's metadata only
    return f"{line}\n  checked against {src.path}: {src.label} ({sizes})"


def cmd_ops(args) -> int:
    from . import ops

    listing = [
        {"name": op.name, "description": op.description, "backends": list(op.backends),
         "kernels": {b: list(names) for b, names in op.kernels.items()}, "params": op.parameters()}
        for op in ops.all_ops()
    ]
    if args.json:
        print(json.dumps(listing, indent=2, default=str))
        return EXIT_OK
    for op in listing:
        print(f"{op['name']}  [{', '.join(op['backends'])}]")
        print(f"    {op['description']}")
        per_backend = {b: ", ".join(names) for b, names in op["kernels"].items()}
        if not any(per_backend.values()):
            print("    kernels: none (runs xarray's own methods)")
        elif len(set(per_backend.values())) == 1:
            print(f"    kernels: {next(iter(per_backend.values()))}")
        else:
            print("    kernels: " + "; ".join(f"{b}: {names}" for b, names in per_backend.items()))
        for name, p in op["params"].items():
            default = "required" if p["required"] else f"default {p['default']!r}"
            print(f"    - {name}: {p['type']} ({default})")
    return EXIT_OK


def cmd_info(args) -> int:
    from . import backend as B

    gpus = []
    if B.gpu_available():
        cp = B.module("gpu")
        for i in range(B.gpu_count()):
            props = cp.cuda.runtime.getDeviceProperties(i)
            gpus.append({"id": i, "name": props["name"].decode(), "memory_GiB": round(props["totalGlobalMem"] / 2**30, 1)})
    from .exec.report import versions

    info = {
        "versions": versions(),
        "gpus": gpus,
        "backends": ["cpu", "gpu"] if gpus else ["cpu"],
        "default_backend": B.resolve(None) if gpus else "cpu",
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    print("versions:")
    for k, v in info["versions"].items():
        print(f"  {k}: {v}")
    print("gpus:" + ("" if gpus else " none visible"))
    for g in gpus:
        print(f"  {g['id']}: {g['name']} ({g['memory_GiB']} GiB)")
    print(f"backends: {', '.join(info['backends'])} (default: {info['default_backend']})")
    return EXIT_OK


CLIMATE_OPTIONS = {"size": "--size", "resolution": "--resolution", "time_chunk": "--time-chunk"}
GENOMICS_OPTIONS = {"samples": "--samples", "variants": "--variants", "variant_chunk": "--variant-chunk",
                    "sample_chunk": "--sample-chunk", "zarr_format": "--zarr-format", "missing": "--missing"}


def cmd_demo(args) -> int:
    import time

    from .errors import InputError

    own, other = (GENOMICS_OPTIONS, CLIMATE_OPTIONS) if args.kind == "genomics" else (CLIMATE_OPTIONS, GENOMICS_OPTIONS)
    given = [flag for key, flag in other.items() if getattr(args, key) is not None]
    if given:
        raise InputError(f"{', '.join(given)}: not an option of the {args.kind} demo (its options: {', '.join(own.values())})")
    t = time.perf_counter()
    if args.kind == "genomics":
        from .demo_genomics import SAMPLE_CHUNK, VARIANT_CHUNK, write_genomics_demo

        defaults = {"samples": 1_000, "variants": 10_000, "variant_chunk": VARIANT_CHUNK, "sample_chunk": SAMPLE_CHUNK,
                    "zarr_format": 2, "missing": 0.01}
        given = {k: getattr(args, k) for k in defaults if getattr(args, k) is not None}
        path = write_genomics_demo(
            args.path or "data/genomics.vcz", seed=args.seed, overwrite=args.overwrite, progress=_progress(args),
            **{**defaults, **given},
        )
    else:
        from . import config
        from .demo import write_demo

        path = write_demo(
            args.path or "data/demo.zarr", args.size or config.get("demo.size", "64MB"), seed=args.seed,
            resolution=args.resolution, time_chunk=73 if args.time_chunk is None else args.time_chunk, overwrite=args.overwrite, progress=_progress(args),
        )
    from .exec.cluster import directory_bytes

    print(f"wrote {path} ({directory_bytes(path) / 1e9:.3f} GB stored) in {time.perf_counter() - t:.1f} s")
    return EXIT_OK


def cmd_import_vcf(args) -> int:
    import time

    from .demo_genomics import import_vcf
    from .exec.cluster import directory_bytes

    t = time.perf_counter()
    path = import_vcf(
        args.vcf, args.path, variant_chunk=args.variant_chunk, sample_chunk=args.sample_chunk, zarr_format=args.zarr_format,
        workers=args.workers, overwrite=args.overwrite, progress=_progress(args), samples_table=args.samples_table,
    )
    print(f"wrote {path} ({directory_bytes(path) / 1e9:.3f} GB stored) in {time.perf_counter() - t:.1f} s")
    return EXIT_OK


def cmd_convert(args) -> int:
    import time

    if _may_use_gpu(args):
        from .gpu import context

        context.start()  # made while convert's libraries are imported
    from .sinks.convert import convert
    from .exec.cluster import directory_bytes

    chunks = None
    if args.chunks:
        try:
            chunks = {k: int(v) for k, v in (item.split("=") for item in args.chunks.split(","))}
        except ValueError:
            from .errors import InputError

            raise InputError(f"--chunks: expected DIM=SIZE[,DIM=SIZE...], got {args.chunks!r}") from None
    t = time.perf_counter()
    path = convert(
        args.src, args.dst, inner_bytes=args.inner_chunk, chunks=chunks, compression=args.compression, level=args.level,
        mode="overwrite" if args.overwrite else "fail", progress=_progress(args), backend=args.backend,
    )
    print(f"wrote {path} ({directory_bytes(path) / 1e9:.3f} GB stored) in {time.perf_counter() - t:.1f} s")
    return EXIT_OK


def cmd_bench(args) -> int:
    from .bench import run
    from .exec.report import write_report

    result = run(args.flow, input=args.input, repeat=args.repeat, fresh_process=not args.no_fresh,
                 peer_scheduler=args.peer_scheduler, report=args.json)
    print(result.table())
    if args.json:
        write_report(result.as_dict(), args.json)
    return EXIT_OK if result.ok else EXIT_FAILURE


def cmd_verify(args) -> int:
    from .sinks.zarr import verify

    digests = verify(args.store)
    print(f"{args.store}: {len(digests)} variable(s) match their digests: {', '.join(digests)}")
    return EXIT_OK


def _progress(args) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline", description="Out-of-core array pipelines on GPUs and CPUs.")
    p.add_argument("--version", action="version", version=f"pipeline {__version__}")
    _log_options(p, None)
    common = argparse.ArgumentParser(add_help=False)
    _log_options(common, argparse.SUPPRESS)  # also after the command; not given there: the global value
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a flow", parents=[common])
    r.add_argument("flow", help="flow file (YAML)")
    r.add_argument("--backend", choices=["auto", "cpu", "gpu"], default=None, help="default: the flow's, else auto")
    where = r.add_mutually_exclusive_group()
    where.add_argument("--cluster", help="cluster profile: the name of one shipped with pipeline (local-cpu, local-gpu, slurm-gpu, attach) or a YAML path")
    where.add_argument("--scheduler", help="address of a running dask scheduler")
    where.add_argument("--scheduler-file", help="scheduler file of a running dask scheduler")
    r.add_argument("--input", help="read the source from this store instead of the flow's source.path "
                   "(e.g. the copy that `pipeline convert` writes)")
    r.add_argument("--output", help="write the result here instead of the flow's sink.path")
    r.add_argument("--report", help="write a JSON report here: time per step, bytes, throughput, and an audit "
                   "trail (flow digest, input fingerprints, output digests, versions, host, user, command)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
    r.add_argument("--resume", action="store_true", help="continue from the partial output a killed run of the "
                   "same flow on the same source left: only its missing chunks are computed")
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("validate", help="check flows without running them", parents=[common],
                       description="Check each flow file; where its source exists, also against the data's "
                       "metadata (variable, dimensions, each step's shape; for Dataset ops, the variables each step "
                       "reads and adds, and sink.variables). Exit 2 if any is invalid.")
    v.add_argument("flow", nargs="+", help="flow files (YAML)")
    v.set_defaults(func=cmd_validate)

    o = sub.add_parser("ops", help="list the ops, their parameters and backends", parents=[common])
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=cmd_ops)

    i = sub.add_parser("info", help="versions, GPUs and backends", parents=[common])
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)

    d = sub.add_parser("demo", help="write a synthetic dataset: CF-style climate (Zarr), or genomics (VCF Zarr)",
                       parents=[common], description="Write a synthetic dataset, deterministic from --seed: a "
                       "CF-style climate dataset as Zarr (--kind climate, the default), or genotypes simulated by "
                       "msprime and written by bio2zarr as VCF Zarr, with missing calls, cohorts, traits and "
                       "covariates (--kind genomics; needs python -m pip install -e \".[genomics]\" in a checkout).")
    d.add_argument("path", nargs="?", default=None, help="default: data/demo.zarr (climate), data/genomics.vcz (genomics)")
    d.add_argument("--kind", choices=("climate", "genomics"), default="climate", help="default: climate")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--size", default=None, help="climate: total uncompressed size, e.g. 64MB, 4GB (default: the setting pipeline.demo.size, 64MB)")
    d.add_argument("--resolution", type=float, default=None, help="climate: grid spacing in degrees (default: 2.5 below 1 GiB, else 0.25)")
    d.add_argument("--time-chunk", type=int, default=None, help="climate: time steps per chunk (default 73)")
    d.add_argument("--samples", type=int, default=None, help="genomics: diploid samples (default 1000)")
    d.add_argument("--variants", type=int, default=None, help="genomics: variants, exactly (default 10000)")
    d.add_argument("--variant-chunk", type=int, default=None, help="genomics: variants per chunk (default 1000)")
    d.add_argument("--sample-chunk", type=int, default=None, help="genomics: samples per chunk (default 10000)")
    d.add_argument("--zarr-format", type=int, choices=(2, 3), default=None, help="genomics: 2 (default, as bio2zarr) or 3")
    d.add_argument("--missing", type=float, default=None, help="genomics: fraction of calls missing (default 0.01)")
    d.add_argument("--overwrite", action="store_true", help="replace a demo store pipeline wrote there")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_demo)

    iv = sub.add_parser("import-vcf", help="convert a VCF file to VCF Zarr (bio2zarr)", parents=[common],
                        description="Convert a VCF or BCF file (plain or bgzipped; several contigs need a .tbi or "
                        ".csi index beside it) to a VCF Zarr store with bio2zarr, all or nothing. Needs the genomics extra "
                        "(python -m pip install -e \".[genomics]\" in a checkout).")
    iv.add_argument("vcf", help="the VCF (or BCF) file")
    iv.add_argument("path", help="the new VCF Zarr store")
    iv.add_argument("--variant-chunk", type=int, default=None, help="variants per chunk (default bio2zarr's, 1000)")
    iv.add_argument("--sample-chunk", type=int, default=None, help="samples per chunk (default bio2zarr's, 10000)")
    iv.add_argument("--zarr-format", type=int, choices=(2, 3), default=2, help="2 (default, as bio2zarr) or 3")
    iv.add_argument("--workers", type=int, default=0, help="worker processes (default 0: this process)")
    iv.add_argument("--overwrite", action="store_true", help="replace a store pipeline imported there")
    iv.add_argument("--samples-table", metavar="FILE", default=None,
                    help="a TSV or CSV file keyed by sample ID whose columns (cohort, traits, covariates) are added as "
                    "per-sample variables")
    iv.add_argument("--no-progress", action="store_true")
    iv.set_defaults(func=cmd_import_vcf)

    c = sub.add_parser("convert", help="copy a store into the sharded Zarr v3 layout the GPU decodes fastest",
                       parents=[common])
    c.add_argument("src", help="a Zarr store or NetCDF file")
    c.add_argument("dst", help="the new Zarr store")
    c.add_argument("--inner-chunk", default="1MB", help="bytes of one compressed frame inside a shard (default 1MB)")
    c.add_argument("--chunks", help="shard shape as DIM=SIZE,... (default: the source's chunks)")
    c.add_argument("--compression", choices=("zstd", "none"), default="zstd",
                   help="zstd frames that nvCOMP decodes (default), or none: one uncompressed chunk per block")
    c.add_argument("--level", type=int, default=2, help="zstd level of the frames, -7 to 22 (default 2: twice as fast as 3)")
    c.add_argument("--backend", choices=["auto", "cpu", "gpu"], default=None,
                   help="where the frames are compressed: gpu (nvCOMP; no levels, a tenth larger), cpu, or auto (default)")
    c.add_argument("--overwrite", action="store_true")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=cmd_convert)

    b = sub.add_parser("bench", help="time a flow on pipeline's backends beside the same analysis in xarray + dask",
                       parents=[common], description="Run FLOW on the GPU (where one is visible) and the CPU, and "
                       "the same steps in plain xarray + dask; print their times, pipeline's speed-up and whether "
                       "the results agree (exit 1 where they do not).")
    b.add_argument("flow", help="flow file (YAML)")
    b.add_argument("--input", help="read the source from this store instead of the flow's source.path")
    b.add_argument("--repeat", type=int, default=3, help="warm runs in one process, after the first (default 3)")
    b.add_argument("--no-fresh", action="store_true", help="skip the fresh-process runs (the 'process' column)")
    b.add_argument("--peer-scheduler", choices=("threads", "distributed"), default="threads",
                   help="where the xarray + dask peer computes: dask's threads (default) or a LocalCluster")
    b.add_argument("--json", help="write the results, and the xarray + dask script, here as JSON")
    b.set_defaults(func=cmd_bench)

    f = sub.add_parser("verify", help="check a store pipeline wrote against the digests in its manifest")
    f.add_argument("store")
    f.set_defaults(func=cmd_verify)
    return p


def _log_options(p: argparse.ArgumentParser, default) -> None:
    from .log import FORMATS

    p.add_argument("--log-format", choices=FORMATS, default=default or "text",
                   help="log lines on stderr: text (default) or json (one object per line)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=default or "info",
                   help="least important log lines shown (default info)")


def _hint(e: Exception) -> str:
    """What to change after a failure whose cause the user controls."""
    if type(e).__name__ == "OutOfMemoryError" and type(e).__module__.startswith("cupy"):
        return (
            "\n  the GPU ran out of memory: lower pipeline.gpu.threads, read smaller blocks "
            "(pipeline convert --chunks time=N, or source.chunks in the flow), or raise pipeline.gpu.memory-limit"
        )
    if type(e).__name__ == "CUDARuntimeError" and "cudaErrorMemoryAllocation" in str(e):
        return (
            "\n  the GPU could not make or grow this process's CUDA context: where many processes share it, "
            "set pipeline.gpu.hardware-queues: null (fewer work queues a context) or run fewer at once"
        )
    if isinstance(e, MemoryError):
        return "\n  the host ran out of memory: lower dask's num_workers or read smaller blocks (source.chunks)"
    return ""


def _since_process_start() -> float | None:
    """Seconds since this process started (Python's start and the imports so far): the process's
    start and the uptime, both in the kernel's clock since boot (``/proc``; psutil's start time is
    on the wall clock, whose boot time is rounded to a second); None where neither tells."""
    import os
    import time

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        try:
            import psutil

            return max(0.0, time.time() - psutil.Process().create_time())
        except Exception:  # no psutil, or a platform without the process's start time
            return None


def main(argv: list[str] | None = None) -> int:
    import_seconds = _since_process_start()
    from . import log as pipeline_log

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    pipeline_log.configure(getattr(args, "log_format", "text"), getattr(args, "log_level", "info"))
    args.command_line = shlex.join(["pipeline", *argv])
    args.import_seconds = import_seconds
    from .errors import BackendError, InputError

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        from . import config, patches

        config.check()  # a misspelt or invalid setting: exit 2 before anything runs
        patches.check_setting()  # and a change of pipeline.patches' that is not one
        return args.func(args)
    except (InputError, BackendError) as e:
        _err(str(e), exit_status=EXIT_INPUT)
        return EXIT_INPUT
    except KeyboardInterrupt:
        if getattr(args, "resume", False):
            _err("interrupted; the partial output is kept: run again with --resume to complete it", exit_status=EXIT_FAILURE)
        else:
            _err("interrupted; no partial output was left behind", exit_status=EXIT_FAILURE)
        return EXIT_FAILURE
    except BrokenPipeError:  # the reader of our output went away (`pipeline ops | head`)
        sys.stderr.close()
        return EXIT_FAILURE
    except Exception as e:  # a failure, not bad input: show what happened
        log.error("run failed: %s: %s%s", type(e).__name__, e, _hint(e), exc_info=True,
                  extra={"exit_status": EXIT_FAILURE})
        return EXIT_FAILURE
    finally:
        signal.signal(signal.SIGTERM, previous)
        from .gpu import context

        context.wait()


# Set by script(): this process ends when the command does.
_ONE_SHOT = False


def script() -> int:
    """The ``pipeline`` command and ``python -m pipeline``: :func:`main` in a process of its own.

    Python's cyclic garbage collector walks every live object at each full collection, and the
    imports of a run leave about 200,000 (dask, xarray, zarr, Numba): collections took 0.3 s of a
    1.8 s run of the demo flow, and the last ones, as the interpreter exits, 0.45 s more. A
    process that ends with its command moves what is alive after its imports (and at the end) out
    of the collector's reach (``gc.freeze``), as long-running servers do before they fork; garbage
    made during the run is collected as usual. While ``pipeline run`` imports, the collector is
    off (:func:`_pause_collector`): its full collections during the imports took 0.14 s of a
    process on the H200 machine. :func:`main`, called in a process that goes on (the tests), leaves
    the collector alone."""
    import gc

    global _ONE_SHOT
    _ONE_SHOT = True
    code = main()
    gc.freeze()
    return code


def _pause_collector() -> None:
    if _ONE_SHOT:
        import gc

        gc.disable()


def _freeze_imports() -> None:
    """What the imports left, out of the collector's reach, and the collector on again."""
    if _ONE_SHOT:
        import gc

        gc.freeze()
        gc.enable()


if __name__ == "__main__":
    sys.exit(script())
