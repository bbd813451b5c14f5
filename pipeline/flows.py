"""Declarative flows: a YAML file names a source, a list of steps (registered ops) and a sink.

Steps run in order, each on the result of the step before, or on ``input:`` (``source`` or an
earlier step's ``name:``); ``sink.variables`` writes several steps' results into one store.

A flow is validated whole before anything runs: the YAML, every key (unknown keys rejected), each
step's op name and each op's parameters, against the same parameter models that Python callers
use. Errors name the file, the key and what was expected. Building the graph computes nothing;
only writing the sink does.

.. code-block:: yaml

    name: climate_anomaly
    source: {path: data/demo.zarr, variable: tas, demo: {size: 64MB}}
    steps:
      - op: standardized_anomaly
        params: {dim: time}
      - op: weighted_mean
        params: {dims: [lat, lon], weights: coslat}
    sink: {path: out/climate_anomaly.zarr}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import dask
import xarray as xr
import yaml
from dask.utils import parse_bytes
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import backend as B
from . import config
from .exec import memory
from . import ops as ops_registry
from .errors import FlowError, InputError
from .sinks.zarr import check_target, directory_bytes, source_fingerprint, write_zarr
from .sources import open_dataset
from .exec.report import attribute, gbps, task_timer


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DemoSource(_Strict):
    """Generate the source with ``pipeline demo`` settings when it does not exist yet."""

    size: str = Field(default_factory=lambda: str(config.get("demo.size", "64MB")))
    seed: int = 0
    resolution: float | None = None

    @field_validator("size")
    @classmethod
    def _size(cls, v):
        try:
            if parse_bytes(v) <= 0:
                raise ValueError
        except (ValueError, TypeError):
            raise ValueError(f"expected a size such as '64MB' or '4GB', got {v!r}") from None
        return v


class Source(_Strict):
    path: str
    variable: str
    chunks: dict[str, int] | None = None
    demo: DemoSource | None = None


NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Step(_Strict):
    op: str
    params: dict[str, Any] = Field(default_factory=dict)
    name: str | None = Field(default=None, pattern=NAME)  # default: the op's name
    input: str | None = None  # "source" or an earlier step's name; default: the step before

    @property
    def label(self) -> str:
        return self.name or self.op


class Sink(_Strict):
    path: str
    mode: Literal["overwrite", "fail"] = "overwrite"
    name: str | None = Field(default=None, pattern=NAME)  # variable name of a single result
    variables: list[str] | None = Field(default=None, min_length=1)  # step names to write


class Flow(_Strict):
    name: str
    description: str = ""
    backend: Literal["auto", "cpu", "gpu"] | None = None
    source: Source
    steps: list[Step] = Field(min_length=1)
    sink: Sink

    # where the flow came from, for messages (not a YAML key)
    _file: str = "<flow>"


def _loc(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _messages(file: str, err: ValidationError, prefix: tuple = ()) -> list[str]:
    lines = []
    for e in err.errors():
        loc = _loc((*prefix, *e["loc"]))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif "input" in e and e["type"] not in ("value_error",):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{file}: {loc}: {msg}")
    return lines


def parse_flow(data: Any, file: str = "<flow>") -> Flow:
    """Validate a flow given as a mapping (parsed YAML). Raises FlowError listing every problem."""
    if not isinstance(data, dict):
        raise FlowError(f"{file}: expected a mapping with keys name, source, steps, sink; got {type(data).__name__}")
    try:
        flow = Flow(**data)
    except ValidationError as e:
        raise FlowError("\n".join(_messages(file, e))) from None
    problems = []
    known = ["source"]
    for i, step in enumerate(flow.steps):
        if step.label in known:
            problems.append(f"{file}: steps[{i}].name: {step.label!r} names an earlier step; give this step a name of its own")
        if step.input is not None and step.input not in known:
            problems.append(f"{file}: steps[{i}].input: expected 'source' or an earlier step ({', '.join(known[1:]) or 'none yet'}), got {step.input!r}")
        known.append(step.label)
        try:
            op = ops_registry.get(step.op)
        except KeyError as e:
            problems.append(f"{file}: steps[{i}].op: {e.args[0]}")
            continue
        try:
            op.params(**step.params)
        except ValidationError as e:
            problems.extend(_messages(file, e, ("steps", i, "params")))
    for v in flow.sink.variables or ():
        if v not in known[1:]:
            problems.append(f"{file}: sink.variables: {v!r} is not a step (steps: {', '.join(known[1:])})")
    if flow.sink.variables and flow.sink.name:
        problems.append(f"{file}: sink.name: give either sink.name (one result) or sink.variables, not both")
    if problems:
        raise FlowError("\n".join(problems))
    flow._file = file
    return flow


def load_flow(path: str | Path) -> Flow:
    """Read and validate a flow file."""
    path = Path(path)
    if not path.exists():
        raise FlowError(f"{path}: no such flow file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise FlowError(f"{path}: not valid YAML: {e}") from None
    return parse_flow(data, str(path))


# --- building and running ------------------------------------------------------------------------


def _layers(x: xr.DataArray) -> set[str]:
    return set(x.data.__dask_graph__().layers)


@dataclass
class BuiltFlow:
    """A flow's graph, built and not computed: the source array, the result, and which graph
    layers each part ("read" and one entry per step) added."""

    flow: Flow
    backend: str
    source: xr.DataArray
    result: xr.DataArray | xr.Dataset
    parts: dict[str, set[str]] = field(default_factory=dict)


def with_source(flow: Flow, path: str | Path) -> Flow:
    """The flow reading its source variable from ``path``, with no demo to generate there."""
    path = str(path)
    if not Path(path).exists() and "://" not in path:
        raise FlowError(f"{flow._file}: source {path} (given for source.path): no such file or directory")
    return flow.model_copy(update={"source": flow.source.model_copy(update={"path": path, "demo": None})})


def ensure_source(flow: Flow) -> bool:
    """Generate a flow's demo source if it is missing; True when it was generated."""
    src = flow.source
    if Path(src.path).exists() or src.demo is None:
        return False
    from .demo import write_demo

    try:
        write_demo(src.path, src.demo.size, seed=src.demo.seed, resolution=src.demo.resolution)
    except InputError:
        if not Path(src.path).exists():  # another run may have written it meanwhile
            raise
    return True


def build_flow(flow: Flow, backend: str | None = None) -> BuiltFlow:
    """Open the source and chain the steps into one graph. Computes nothing."""
    target = B.resolve(backend or flow.backend)
    src, f = flow.source, flow._file
    if not Path(src.path).exists() and "://" not in src.path:
        hint = " (add a 'demo' entry to the source to generate it)" if src.demo is None else ""
        raise FlowError(f"{f}: source.path: {src.path}: no such file or directory{hint}")
    try:
        ds = open_dataset(src.path, backend=target, chunks=src.chunks, variables=[src.variable])
    except InputError as e:
        key = "source.variable" if "no variable" in str(e) else "source.path"
        raise FlowError(f"{f}: {key}: {e}") from None
    results = {"source": ds[src.variable]}
    parts = {"read": _layers(results["source"])}
    seen = set(parts["read"])
    x = results["source"]
    for i, step in enumerate(flow.steps):
        op = ops_registry.get(step.op)
        params = op.params(**step.params).model_dump()
        x_in = x if step.input is None else results[step.input]
        try:
            x = op.func(x_in, **params)
        except (InputError, NotImplementedError) as e:
            raise FlowError(f"{f}: steps[{i}] ({step.op}): {e}") from None
        results[step.label] = x
        layers = _layers(x)
        parts[f"{i}:{step.label}"] = layers - seen
        seen |= layers
    if flow.sink.variables:
        result = xr.Dataset({v: results[v].rename(v) for v in flow.sink.variables})
    else:
        result = x
    return BuiltFlow(flow, target, results["source"], result, parts)


def check_sink(flow: Flow, output: str | Path | None = None) -> None:
    """Refuse, before anything runs, a sink that would destroy data: one that is, contains or lies
    inside the source, or (mode overwrite) an existing path that is not a store pipeline wrote."""
    check_target(output or flow.sink.path, mode=flow.sink.mode, protect=(flow.source.path,))


def run_flow(
    flow: Flow | str | Path,
    *,
    backend: str | None = None,
    source: str | Path | None = None,
    output: str | None = None,
    client=None,
    report: str | Path | None = None,
    progress: bool = False,
    resume: bool = False,
) -> dict:
    """Run a flow: generate a missing demo source, build the graph, write the sink, report.

    ``source`` reads the source variable from that store instead of the flow's ``source.path``
    (for instance the copy ``pipeline convert`` writes); no demo is generated for it. Returns the
    report (also written as JSON to ``report`` when given). ``resume`` continues from the partial
    output a killed run of the same flow on the same source left, computing only missing chunks.
    """
    if not isinstance(flow, Flow):
        flow = load_flow(flow)
    if source is not None:
        flow = with_source(flow, source)
    target = B.resolve(backend or flow.backend)  # a backend that is not there is refused before any write
    sink_path = output or flow.sink.path
    check_sink(flow, sink_path)
    t0 = time.perf_counter()
    generated = ensure_source(flow)
    t_source = time.perf_counter() - t0
    built = build_flow(flow, target)
    results = built.result.data_vars.values() if isinstance(built.result, xr.Dataset) else [built.result]
    mem_plan = None
    if client is None:  # a cluster's workers keep their own limits and spill
        mem_plan = memory.plan(built.source.data, *(r.data for r in results), backend=built.backend)
        memory.check(mem_plan, f"{flow._file}: ")
    from .exec.spill import spilled_bytes

    spilled_bytes(reset=True)
    # what a partial output must have been written from to be resumed: this flow, backend and source
    fingerprint = dask.base.tokenize(flow.model_dump(mode="json"), built.backend, source_fingerprint(flow.source.path))
    with task_timer(client) as times:
        written = write_zarr(
            built.result, sink_path, mode=flow.sink.mode, name=flow.sink.name, progress=progress,
            protect=(flow.source.path,), resume=resume, fingerprint=fingerprint,
        )
    by_part = attribute(times, built.parts)

    src_var = Path(flow.source.path) / flow.source.variable
    stored_read = directory_bytes(src_var) if src_var.is_dir() else directory_bytes(flow.source.path)
    nbytes_read = int(built.source.nbytes)
    steps = []
    for i, step in enumerate(flow.steps):
        t = by_part[f"{i}:{step.label}"]
        steps.append({"name": step.label, "op": step.op, "params": step.params, **t})
    from .exec.cluster import describe

    rep = {
        "flow": flow.name,
        "flow_file": flow._file,
        "backend": built.backend,
        "cluster": describe(client),
        "source": {
            "path": flow.source.path,
            "variable": flow.source.variable,
            "generated": generated,
            "generate_seconds": round(t_source, 3),
            "shape": list(built.source.shape),
            "chunks": [list(c) for c in built.source.data.chunks],
        },
        "sink": {
            "path": str(sink_path), "bytes_stored": directory_bytes(sink_path), "nbytes": int(built.result.nbytes),
            "digests": written.digests, "chunks_written": written.chunks_written, "chunks_kept": written.chunks_kept,
        },
        "bytes_read": nbytes_read,
        "bytes_read_stored": stored_read,
        "wall_seconds": round(times.wall, 4),
        "throughput_GBps": gbps(nbytes_read, times.wall),
        "read": by_part["read"],
        "steps": steps,
        "write": by_part["write"],
        "memory": {
            "plan": mem_plan.as_dict() if mem_plan else None,
            **memory.usage(built.backend),
            **({"workers": memory.cluster_usage(client)} if client is not None else {}),
        },
    }
    if report:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(json.dumps(rep, indent=2, default=str))
    return rep
