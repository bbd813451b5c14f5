"""``pipeline bench``: a user's flow on a user's store, timed on pipeline's backends beside the same
analysis written in plain xarray + dask, with the results checked against it.

Each step's op has its xarray peer in :data:`PEERS`: the xarray (or xclim) call that the op's
docstring names, written as an analyst writes it, not a re-implementation of pipeline. The peers
of a flow's steps make one standalone Python script (:func:`peer_script`), which the fresh-process
run executes and the in-process runs execute too, so what was timed is exactly what the user
reads. It reads the store with ``xr.open_dataset(..., chunks={})`` and computes on dask's threads
on all cores, or on a ``distributed.LocalCluster`` (``peer_scheduler="distributed"``).

Each of pipeline-gpu (where a GPU is visible), pipeline-cpu and the xarray + dask peer gets:

- ``process``: the wall-clock time of a fresh process, ``python -m pipeline run FLOW --backend B``
  or the peer script, from start to the result written as Zarr in a temporary directory;
- ``first``: the first run in this process (opening the store, building the graph, computing and
  copying the result to host memory; pipeline compiles its kernels here), as
  ``benchmarks/peers.py`` times a run;
- ``warm``: the median of ``repeat`` more runs of the same.

The store is read once before anything is timed, so that every run reads it from the page cache.
Every pipeline result (in process, and the fresh process's output store) is compared with the
peer's in float64: relative L2 error over the values that are not NaN in either, below ``rtol``,
and identical NaN masks.

Nothing is written next to the user's files: outputs and the script go to a temporary directory
that is removed; the flow's sink is never written. Only a missing demo source that the flow
declares is generated, as ``pipeline run`` would.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import xarray as xr

from . import backend as B
from . import ops as ops_registry
from .errors import InputError
from .exec.compute import compute, compute_threads
from .exec.report import check_report_path
from .flows import Flow, build_flow, ensure_source, load_flow, with_source
from .sources import is_url, store_format

PIPELINE_GPU, PIPELINE_CPU, PEER = "pipeline-gpu", "pipeline-cpu", "xarray+dask"


# --- the xarray + dask peer of each op ----------------------------------------------------------
# Each function stands alone (numpy as np, xarray as xr, xclim imported inside): its source is
# copied into the peer script.


def xr_standardized_anomaly(x, dim="time"):
    """(x - mean) / std along dim, NaN-skipping; xarray's std has ddof=0. The statistics in
    float64: in float32 their rounding alone, a few 1e-6 of the result, comes near the tolerance."""
    return ((x - x.mean(dim, dtype="float64")) / x.std(dim, dtype="float64")).astype(x.dtype)


def xr_weighted_mean(x, dims=("lat", "lon"), weights="coslat"):
    """x.weighted(w).mean(dims): w is cos(latitude) for "coslat", else a coordinate, or none."""
    if weights is None:
        return x.mean(dims)
    if isinstance(weights, str) and weights == "coslat":
        lat = next(name for name, c in x.coords.items()
                   if name in ("lat", "latitude") or c.attrs.get("standard_name") == "latitude")
        weights = np.cos(np.deg2rad(x[lat]))
    elif isinstance(weights, str):
        weights = x[weights]
    return x.weighted(weights).mean(dims)


def xr_rolling_mean(x, window, dim="time", center=False, min_periods=None):
    """x.rolling({dim: window}).mean(): NaN-skipping, min_periods valid values (default: all)."""
    return x.rolling({dim: window}, center=center, min_periods=min_periods).mean()


def xr_climatology(x, freq="month", dim="time"):
    """x.groupby("time.month").mean("time")."""
    return x.groupby(f"{dim}.{freq}").mean(dim)


def xr_anomaly(x, freq="month", dim="time"):
    """x.groupby("time.month") - its climatology (the month label along time dropped). The
    climatology in float64: in float32 its rounding is 1e-5 of an anomaly, over the tolerance."""
    groups = x.groupby(f"{dim}.{freq}")
    return (groups - groups.mean(dim, dtype="float64")).drop_vars(freq).astype(x.dtype)


def xr_resample_mean(x, freq="1D", dim="time"):
    """x.resample(time=freq).mean()."""
    return x.resample({dim: freq}).mean()


def xr_count_above(x, threshold, freq="YS", dim="time"):
    """xclim's tx_days_above (a threshold without units is in x's units); along another
    dimension than time, (x > threshold).resample(...).sum()."""
    if dim == "time" and "units" in x.attrs:
        from xclim.indices import tx_days_above

        thresh = threshold if isinstance(threshold, str) else f"{threshold} {x.attrs['units']}"
        return tx_days_above(x, thresh=thresh, freq=freq)
    return (x > threshold).resample({dim: freq}).sum()


def xr_max_spell_length(x, threshold, freq="YS", resample_before_rl=False, dim="time"):
    """xclim's run_length.longest_run of x > threshold; runs cut at period bounds with
    resample_before_rl."""
    from xclim.core.units import convert_units_to
    from xclim.indices import run_length

    if isinstance(threshold, str):
        threshold = convert_units_to(threshold, x)
    above = x > threshold
    if resample_before_rl:
        return above.resample({dim: freq}).map(run_length.longest_run, dim=dim)
    return run_length.longest_run(above, dim=dim, freq=freq)


def xr_coarsen_mean(x, factors):
    """x.coarsen(factors, boundary="trim").mean()."""
    return x.coarsen(factors, boundary="trim").mean()


def xr_detrend(x, dim="time", deg=1):
    """x - xr.polyval(x[dim], x.polyfit(dim, deg).polyfit_coefficients)."""
    fit = x.polyfit(dim, deg)
    return x - xr.polyval(x[dim], fit.polyfit_coefficients)


def xr_quantile(x, q, dim="time"):
    """x.quantile(q, dim); on dask, dim must be one chunk."""
    return x.chunk({dim: -1}).quantile(q, dim)


def xr_saturation_vapor_pressure(x, method="sonntag90"):
    """xclim.indices.saturation_vapor_pressure."""
    from xclim.indices import saturation_vapor_pressure

    return saturation_vapor_pressure(x, method=method)


def xr_resample(x, freq, how, q=None, dim="time"):
    r = x.resample({dim: freq})
    return r.quantile(q) if how == "quantile" else getattr(r, how)()


def xr_groupby(x, group, how, q=None):
    g = x.groupby(group)
    return g.quantile(q) if how == "quantile" else getattr(g, how)()


def xr_rolling(x, window, how, dim="time", center=False, min_periods=None):
    return getattr(x.rolling({dim: window}, center=center, min_periods=min_periods), how)()


def xr_coarsen(x, factors, how, boundary="exact"):
    return getattr(x.coarsen(factors, boundary=boundary), how)()


def xr_weighted(x, how, q=None, weights="coslat", dims=("lat", "lon")):
    import numpy as np
    import xarray as xr
    if weights is None:
        w = xr.DataArray(1.0)
    elif weights == "coslat":
        w = np.cos(np.deg2rad(x["lat"]))
    else:
        w = x[weights]
    if how == "quantile":
        return x.chunk({d: -1 for d in ([dims] if isinstance(dims, str) else dims)}).weighted(w).quantile(q, dim=dims)
    return getattr(x.weighted(w), how)(dim=dims)


def xr_reduce(x, dims, how, q=None):
    if how == "quantile":
        return x.chunk({d: -1 for d in ([dims] if isinstance(dims, str) else dims)}).quantile(q, dim=dims)
    return getattr(x, how)(dim=dims)


PEERS = {
    "standardized_anomaly": xr_standardized_anomaly,
    "weighted_mean": xr_weighted_mean,
    "rolling_mean": xr_rolling_mean,
    "climatology": xr_climatology,
    "anomaly": xr_anomaly,
    "resample_mean": xr_resample_mean,
    "count_above": xr_count_above,
    "max_spell_length": xr_max_spell_length,
    "coarsen_mean": xr_coarsen_mean,
    "detrend": xr_detrend,
    "quantile": xr_quantile,
    "saturation_vapor_pressure": xr_saturation_vapor_pressure,
    "resample": xr_resample,
    "groupby": xr_groupby,
    "rolling": xr_rolling,
    "coarsen": xr_coarsen,
    "weighted": xr_weighted,
    "reduce": xr_reduce,
}
"""Op name -> its plain xarray peer, ``function(DataArray, **params) -> DataArray``."""


# --- the peer script --------------------------------------------------------------------------------

SCRIPT = '''\
"""A flow in plain xarray + dask, as `pipeline bench` timed it beside pipeline.

    python {script_name} SOURCE OUTPUT

reads the flow's source variable of SOURCE, runs its steps and writes the result to the Zarr
store OUTPUT. FLOW below holds the flow's values (names, parameters) as data.
"""

import json
import sys

import numpy as np
import xarray as xr

{functions}

PEERS = {peers}

FLOW = json.loads(
{flow}
)


def analysis(source):
    """The flow's steps, each on the result before it or on the step it names."""
    results, previous = {{"source": source}}, "source"
    for step in FLOW["steps"]:
        results[step["name"]] = PEERS[step["op"]](results[step["input"] or previous], **step["params"])
        previous = step["name"]
    if FLOW["sink"]["variables"]:
        return xr.Dataset({{v: results[v] for v in FLOW["sink"]["variables"]}})
    return results[previous].rename(FLOW["sink"]["name"] or previous).to_dataset()


def open_source(path):
    source = FLOW["source"]
    return xr.open_dataset(path, engine=source["engine"], chunks=source["chunks"])[source["variable"]]


def main(path, output):
{main}


if __name__ == "__main__":
    main(*sys.argv[1:3])
'''

SCRIPT_NAME = "xarray_peer.py"


def missing_peers(flow: Flow) -> list[str]:
    """The ops of ``flow`` that have no xarray peer."""
    return list(dict.fromkeys(s.op for s in flow.steps if s.op not in PEERS))


def peer_script(flow: Flow, peer_scheduler: Literal["threads", "distributed"] = "threads") -> str:
    """A standalone Python script of ``flow`` in plain xarray + dask: the peers of its steps,
    called with the flow's parameters (and the ops' defaults), on the flow's source variable.

    The script's code is pipeline's alone: the flow's values (its name, file, variable, steps'
    names and parameters) go into it as a JSON text that the script parses, each line a Python
    string literal written by ``repr``, so no value of a flow can become code."""
    used = {s.op for s in flow.steps}
    peers = {op: f for op, f in PEERS.items() if op in used}
    src = flow.source
    spec = {
        "name": flow.name,
        "file": flow._file,
        "source": {
            "variable": src.variable, "chunks": src.chunks or {},
            "engine": None if not is_url(src.path) and store_format(src.path) == "netcdf" else "zarr",
        },
        "steps": [{"name": s.label, "op": s.op, "input": s.input,
                   "params": ops_registry.get(s.op).params(**s.params).model_dump()} for s in flow.steps],
        "sink": {"name": flow.sink.name, "variables": flow.sink.variables},
    }
    write = 'analysis(open_source(path)).drop_encoding().to_zarr(output, mode="w")'
    if peer_scheduler == "distributed":
        main = f"    from dask.distributed import Client\n\n    with Client():  # a LocalCluster of this machine\n        {write}"
    else:
        main = f"    {write}  # dask's threads, one per core"
    return SCRIPT.format(
        script_name=SCRIPT_NAME,
        functions="\n\n".join(inspect.getsource(f) for f in peers.values()),
        peers="{" + ", ".join(f"{op!r}: {f.__name__}" for op, f in peers.items()) + "}",
        flow="\n".join(f"    {line!r}" for line in _json_lines(spec)),
        main=main,
    )


def _json_lines(spec: dict) -> list[str]:
    """``spec`` as JSON text for a reader: a line per key, and per step."""
    def value(k, v):
        return "[\n" + ",\n".join(f"  {json.dumps(x)}" for x in v) + "\n ]" if k == "steps" else json.dumps(v)

    text = "{\n" + ",\n".join(f" {json.dumps(k)}: {value(k, v)}" for k, v in spec.items()) + "\n}"
    return text.splitlines(keepends=True)


def _script_namespace(script: str, path: Path) -> dict:
    """The peer script's functions, compiled from its file: the in-process runs call the very
    code that the fresh process runs (and tracebacks show its lines)."""
    namespace = {"__name__": "xarray_peer"}
    exec(compile(script, str(path), "exec"), namespace)  # the script pipeline wrote, just above
    return namespace


# --- agreement --------------------------------------------------------------------------------------


@dataclass
class Agreement:
    """A result against the peer's: worst relative L2 error (float64, values not NaN in either),
    whether NaN masks are equal, and what else differs (variables, shapes)."""

    rel_error: float
    nan_masks_equal: bool
    agrees: bool
    problem: str = ""


def agreement(out: dict[str, xr.DataArray], ref: dict[str, xr.DataArray], rtol: float) -> Agreement:
    """``out`` against ``ref``, variable by variable (the reference's dimensions put in the
    order of the result's where they are the same)."""
    if set(out) != set(ref):
        return Agreement(float("inf"), False, False, f"variables {sorted(out)} against the peer's {sorted(ref)}")
    worst, masks = 0.0, True
    for name, o in out.items():
        r = ref[name]
        if set(r.dims) == set(o.dims):
            r = r.transpose(*o.dims)
        if r.shape != o.shape:
            return Agreement(float("inf"), False, False, f"{name}: shape {o.shape} {o.dims} against the peer's {r.shape} {r.dims}")
        a, b = np.asarray(o.values, np.float64), np.asarray(r.values, np.float64)
        masks &= bool(np.array_equal(np.isnan(a), np.isnan(b)))
        valid = ~np.isnan(a) & ~np.isnan(b)
        diff, norm = np.linalg.norm(a[valid] - b[valid]), np.linalg.norm(b[valid])
        worst = max(worst, float(diff / norm) if norm else float(diff))
    return Agreement(worst, masks, worst < rtol and masks)


def _dataset(result: xr.DataArray | xr.Dataset) -> xr.Dataset:
    return result if isinstance(result, xr.Dataset) else result.to_dataset()


def _variables(result: xr.DataArray | xr.Dataset) -> dict[str, xr.DataArray]:
    """A computed result's variables by name."""
    return {str(k): v for k, v in _dataset(result).data_vars.items()}


def _host_blocks(result: xr.DataArray | xr.Dataset) -> xr.Dataset:
    """A result whose blocks are copied to host memory as each is computed, in the graph, so that
    a GPU result is never gathered whole on the device."""
    def to_host(v: xr.DataArray) -> xr.DataArray:
        data = v.data
        return v.copy(data=data.map_blocks(B.to_numpy, meta=np.empty((0,) * data.ndim, data.dtype)))

    return _dataset(result).map(to_host, keep_attrs=True)


def _stored(path: Path) -> dict[str, xr.DataArray]:
    with xr.open_zarr(path, chunks=None) as ds:
        return {str(k): v.load() for k, v in ds.data_vars.items()}


# --- results ------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One peer's times (seconds) and how its results agree with the xarray + dask peer's."""

    peer: str
    process_seconds: float | None = None
    first_seconds: float | None = None
    warm_seconds: float | None = None  # median of the warm runs
    warm_all: list[float] = field(default_factory=list)
    skipped: str | None = None  # why it did not run ("no GPU")
    error: str | None = None  # a run that failed
    in_process: Agreement | None = None
    process: Agreement | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(a is None or a.agrees for a in (self.in_process, self.process))


@dataclass
class BenchResult:
    """What :func:`run` measured; :meth:`table` is what ``pipeline bench`` prints."""

    flow: str
    flow_file: str
    source: str
    variable: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    cores: int
    gpu: str | None
    repeat: int
    rtol: float
    peer_scheduler: str
    rows: list[Row]
    script: str | None  # the peer script; None where an op has no peer
    missing_peers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every run that ran completed, and every result agrees with the peer's."""
        return all(r.ok for r in self.rows)

    def row(self, peer: str) -> Row:
        return next(r for r in self.rows if r.peer == peer)

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    def table(self) -> str:
        """One table: the time of each peer, pipeline's speed-up over the xarray + dask peer
        (the peer's time divided by pipeline's) and whether the results agree."""
        peer = self.row(PEER)
        head = (f"{'':14s}{'process':>9s}{'first':>9s}{'warm':>9s}   {'x process':>9s}{'x first':>9s}{'x warm':>9s}"
                f"   agrees with {PEER}")
        lines = [
            f"pipeline bench: flow {self.flow} ({self.flow_file}) on {self.source}",
            f"  {self.variable} {self.shape} {self.dtype}, {self.nbytes / 1e9:.3f} GB; {self.cores} CPU cores; "
            f"GPU: {self.gpu or 'none visible'}",
            "",
            head,
            "-" * len(head),
            *(_line(r, peer) for r in self.rows),
            "",
            "process: a fresh process, to its result written as Zarr; first: the first run in one process; "
            f"warm: the median of {self.repeat} more (seconds)",
            f"x: speed-up over {PEER} (its time / pipeline's); the store is read from the page cache",
            f"agrees: relative L2 error in float64 below {self.rtol:g} and the same NaN masks"
            + (" (in process / fresh process)" if any(r.process for r in self.rows) else ""),
        ]
        if self.script:
            scheduler = "a distributed LocalCluster" if self.peer_scheduler == "distributed" else "dask's threads"
            lines.append(f"{PEER}: the flow's steps as xarray calls on {scheduler} (--json holds the script)")
        return "\n".join(lines)


def _seconds(s: float | None) -> str:
    return f"{s:8.3f}s" if s is not None else f"{'-':>9s}"


def _line(r: Row, peer: Row) -> str:
    name = f"{r.peer:14s}"
    if r.skipped:
        return name + r.skipped
    times = "".join(_seconds(s) for s in (r.process_seconds, r.first_seconds, r.warm_seconds))
    if r.peer == PEER:
        return name + times + " " * 30 + (f"FAILED: {r.error}" if r.error else "reference")
    ratios = "".join(
        f"{theirs / mine:8.2f}x" if mine and theirs else f"{'-':>9s}"
        for mine, theirs in ((r.process_seconds, peer.process_seconds), (r.first_seconds, peer.first_seconds),
                             (r.warm_seconds, peer.warm_seconds))
    )
    return name + times + "   " + ratios + "   " + _verdict(r, peer)


def _verdict(r: Row, peer: Row) -> str:
    if r.error:
        return f"FAILED: {r.error}"
    checks = [a for a in (r.in_process, r.process) if a is not None]
    if not checks:
        return "not checked: " + (peer.skipped or peer.error or "no peer result")
    if all(a.agrees for a in checks):
        return "yes (rel. error " + " / ".join(f"{a.rel_error:.1e}" for a in checks) + ")"
    bad = [a for a in checks if not a.agrees]
    return "NO: " + "; ".join(a.problem or f"rel. error {a.rel_error:.1e}, NaN masks {'equal' if a.nan_masks_equal else 'differ'}"
                              for a in bad)


# --- running ------------------------------------------------------------------------------------------


def _read_through(path: str) -> None:
    """Read every file of a local store once, so that every timed run reads the page cache."""
    if is_url(path):
        return
    p = Path(path)
    buf = bytearray(1 << 24)
    for f in [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file()):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def _timed(fn, repeat: int):
    """``fn()`` once (the first run), then ``repeat`` times: (first seconds, warm seconds, the last result)."""
    t = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t
    warm = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        warm.append(time.perf_counter() - t)
    return first, warm, out


def _process(argv: list[str]) -> float:
    """Wall-clock seconds of a fresh process; RuntimeError with the end of its output if it fails."""
    t = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        raise RuntimeError(f"exit status {done.returncode}: " + " | ".join(tail))
    return seconds


def _failure(e: BaseException) -> str:
    last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(e).__name__}: {e}{where}"


def _run_peer(row: Row, flow: Flow, script: str, tmp: Path, repeat: int, fresh: bool, scheduler: str):
    """The xarray + dask peer: the script in a fresh process, then in this one; its results."""
    path = tmp / SCRIPT_NAME
    path.write_text(script)
    out_store = tmp / "xarray.zarr"
    if fresh:
        row.process_seconds = _process([sys.executable, str(path), flow.source.path, str(out_store)])
    ns = _script_namespace(script, path)

    def once():
        return _variables(ns["analysis"](ns["open_source"](flow.source.path)).compute())

    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet("pint"))
        if scheduler == "distributed":
            from distributed import Client

            stack.enter_context(Client())  # as the script: a LocalCluster of this machine, closed after the runs
        else:
            import dask

            stack.enter_context(dask.config.set(scheduler="threads"))
        row.first_seconds, row.warm_all, result = _timed(once, repeat)
    return result, (_stored(out_store) if fresh else None)


@contextlib.contextmanager
def _quiet(name: str):
    """The logger ``name`` at errors only: importing xclim redefines units of pint's registry,
    which pint logs as warnings that are nothing to the user."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run_pipeline(row: Row, backend: str, flow: Flow, flow_file: str, input, tmp: Path, repeat: int, fresh: bool):
    """pipeline on one backend: ``pipeline run`` in a fresh process, then in this one; its results."""
    out_store = tmp / f"{row.peer}.zarr"
    if fresh:
        argv = [sys.executable, "-m", "pipeline", "run", flow_file, "--backend", backend, "--output", str(out_store),
                "--no-progress"]
        row.process_seconds = _process(argv + (["--input", str(input)] if input is not None else []))

    def once():
        result = build_flow(flow, backend).result
        # the threads that pipeline runs this graph with, not those of a graph ending on the host
        return _variables(compute(_host_blocks(result), threads=compute_threads(result)))

    row.first_seconds, row.warm_all, result = _timed(once, repeat)
    return result, (_stored(out_store) if fresh else None)


def run(
    flow_path: str | Path,
    input: str | Path | None = None,
    backends: tuple[str, ...] = ("gpu", "cpu"),
    repeat: int = 3,
    fresh_process: bool = True,
    *,
    rtol: float = 1e-5,
    peer_scheduler: Literal["threads", "distributed"] = "threads",
    workdir: str | Path | None = None,
    report: str | Path | None = None,
) -> BenchResult:
    """Time ``flow_path`` on pipeline's ``backends`` and on its xarray + dask peer; check the results.

    ``input`` reads the flow's source variable from that store instead of its ``source.path``
    (the flow file is not changed). Outputs go to a temporary directory under ``workdir`` (the
    system's by default), removed at the end. A backend that is not here ("gpu" without a GPU)
    gets a row that says so. Bad input (the flow, the store) raises InputError before anything
    is timed; a run that fails is recorded in its row (``BenchResult.ok`` is then False).
    ``report``, where the caller writes the results (``--json``), is checked before anything runs:
    a writable place that is neither the flow file nor in the source.
    """
    if repeat < 1:
        raise InputError(f"repeat: expected at least 1 warm run, got {repeat}")
    if not set(backends) <= {"gpu", "cpu"}:
        raise InputError(f"backends: expected 'gpu' and/or 'cpu', got {', '.join(map(repr, backends))}")
    flow = load_flow(flow_path)
    if flow.source.dataset:
        raise InputError(f"{flow_path}: pipeline bench compares flows of one variable with xarray; a flow of Dataset ops "
                         "(genomics) compares with sgkit: python benchmarks/genomics_sgkit.py STORE")
    if input is not None:
        flow = with_source(flow, input)
    if report is not None:
        check_report_path(report, inputs=(flow.source.path,), flow_file=flow._file, option="--json")
    if input is None:
        ensure_source(flow)
    source = build_flow(flow, "cpu").source  # the flow against the data: bad input fails here
    missing = missing_peers(flow)
    script = None if missing else peer_script(flow, peer_scheduler)
    gpu = _gpu_name()
    rows = {b: Row(f"pipeline-{b}") for b in backends}
    peer = Row(PEER)
    if gpu is None and "gpu" in rows:
        rows["gpu"].skipped = "no GPU"
    if missing:
        peer.skipped = f"no xarray peer for op {', '.join(missing)}"
    _read_through(flow.source.path)
    # the outputs (as large as the flow's) in a scratch folder that a bench killed outright leaves
    # for the next one to remove
    from .exec.cluster import scratch_directory

    with scratch_directory(Path(workdir or tempfile.gettempdir()), prefix="pipeline-bench-") as tmp:
        reference = (None, None)
        if script is not None:
            try:
                reference = _run_peer(peer, flow, script, Path(tmp), repeat, fresh_process, peer_scheduler)
            except Exception as e:
                peer.error = _failure(e)
        for backend, row in rows.items():
            if row.skipped:
                continue
            try:
                results = _run_pipeline(row, backend, flow, str(flow_path), input, Path(tmp), repeat, fresh_process)
            except Exception as e:
                row.error = _failure(e)
                continue
            for attr, mine, theirs in (("in_process", results[0], reference[0]), ("process", results[1], reference[1])):
                if mine is not None and theirs is not None:
                    setattr(row, attr, agreement(mine, theirs, rtol))
    for row in (*rows.values(), peer):
        row.warm_seconds = statistics.median(row.warm_all) if row.warm_all else None
    ordered = [rows[b] for b in ("gpu", "cpu") if b in rows] + [peer]
    return BenchResult(
        flow=flow.name, flow_file=str(flow_path), source=flow.source.path, variable=flow.source.variable,
        shape=tuple(source.shape), dtype=str(source.dtype), nbytes=int(source.nbytes),
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        gpu=gpu, repeat=repeat, rtol=rtol, peer_scheduler=peer_scheduler, rows=ordered, script=script,
        missing_peers=missing,
    )


def _gpu_name() -> str | None:
    """The name of the GPU pipeline would use, or None where CuPy sees none."""
    if not B.gpu_available():
        return None
    props = B.module("gpu").cuda.runtime.getDeviceProperties(0)
    return props["name"].decode()
