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
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import xarray as xr
import yaml
from dask.utils import parse_bytes
from pydantic import (
    BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator,
)
from pydantic_core import PydanticCustomError

from . import backend as B
from . import config, patches
from . import ops as ops_registry
from .errors import FlowError, InputError
from .exec.report import (
    attribute, check_report_path, combined, gbps, path_fingerprint, sha256_bytes, task_timer, versions, who,
    write_report,
)
from .ops.registry import unknown as unknown_op

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DemoSource(_Strict):
    """Generate the source with ``pipeline demo`` settings when it does not exist yet: the climate
    dataset (``size``, ``resolution``), or with ``kind: genomics`` a VCF Zarr store of ``samples``
    diploid samples and ``variants`` variants."""

    kind: Literal["climate", "genomics"] = "climate"
    size: str = Field(default_factory=lambda: str(config.get("demo.size", "64MB")))
    seed: int = 0
    resolution: float | None = None
    samples: int | None = Field(default=None, gt=0)
    variants: int | None = Field(default=None, gt=0)

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
    """The store a flow reads: one ``variable`` (the steps are ops of a DataArray), or the
    ``variables`` a flow of Dataset ops needs (the genomics ops, as sgkit's)."""

    path: str
    variable: str | None = None
    variables: list[str] | None = Field(default=None, min_length=1)
    chunks: dict[str, int] | None = None
    demo: DemoSource | None = None
    # a sample table (TSV or CSV) whose columns become per-sample variables of the dataset
    samples: str | None = None

    @model_validator(mode="after")
    def _one(self):
        if self.variable is None and self.variables is None:
            raise PydanticCustomError("source_variable", "required key is missing (or give variables: the arrays of a dataset, for Dataset ops)")
        if self.variable is not None and self.variables is not None:
            raise PydanticCustomError("source_variable", "give either variable (one array) or variables (a dataset's arrays), not both")
        if self.samples is not None and self.variables is None:
            raise PydanticCustomError("source_samples", "a sample table adds variables to a dataset: give variables (a VCF "
                                      "Zarr store's arrays), not variable")
        return self

    @property
    def dataset(self) -> bool:
        """Whether the steps work on a Dataset (``variables``)."""
        return self.variables is not None

    @property
    def label(self) -> str:
        return self.variable if self.variable is not None else ", ".join(self.variables or ())


NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a step's or a result's name: a variable of the output
FLOW_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


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
    # the steps whose results to write; in a flow of Dataset ops, the last step's variables to write
    # (default: those the steps added)
    variables: list[Annotated[str, StringConstraints(pattern=NAME)]] | None = Field(default=None, min_length=1)


class Flow(_Strict):
    name: str = Field(pattern=FLOW_NAME)
    description: str = ""
    backend: Literal["auto", "cpu", "gpu"] | None = None
    source: Source
    steps: list[Step] = Field(min_length=1)
    sink: Sink

    # where the flow came from, for messages, and what it was (not YAML keys)
    _file: str = "<flow>"
    _sha256: str = ""  # of the file's bytes; of the mapping as canonical JSON when given as one
    _content: Any = None  # the mapping as parsed


def _loc(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _messages(file: str, err: ValidationError, prefix: tuple = (), model: type[BaseModel] | None = None) -> list[str]:
    """One line per error of ``err``, raised by ``model`` (for an unknown key, the keys it has)."""
    lines = []
    for e in err.errors():
        loc = _loc((*prefix, *e["loc"]))
        msg = e["msg"]
        if e["type"] == "source_variable":
            loc = _loc((*prefix, *e["loc"], "variable"))
        if e["type"] == "source_samples":
            loc = _loc((*prefix, *e["loc"], "samples"))
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(str(e["loc"][-1]), _keys(model, e["loc"][:-1]), "keys")
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "string_pattern_mismatch":
            msg = f"expected a name matching the pattern {e['ctx']['pattern']}, got {e['input']!r}"
        elif "input" in e and e["type"] not in ("value_error",):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{file}: {loc}: {msg}")
    return lines


def _keys(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    """The keys of the mapping at ``loc`` in ``model`` (through its fields, lists and optional
    values), or none where that is not a model."""
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def _did_you_mean(given: str, known: list[str], what: str) -> str:
    """``; did you mean 'x'?`` for the name closest to ``given``, else ``known`` listed (what: its noun)."""
    import difflib

    close = difflib.get_close_matches(given, known, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" ({what}: {', '.join(known)})" if known else ""


def parse_flow(data: Any, file: str = "<flow>") -> Flow:
    """Validate a flow given as a mapping (parsed YAML). Raises FlowError listing every problem."""
    if not isinstance(data, dict):
        raise FlowError(f"{file}: expected a mapping with keys name, source, steps, sink; got {type(data).__name__}")
    try:
        flow = Flow(**data)
    except ValidationError as e:
        raise FlowError("\n".join(_messages(file, e, model=Flow))) from None
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
        except KeyError:
            problems.append(f"{file}: steps[{i}].op: {unknown_op(step.op, flow.source.dataset)}")
            continue
        if op.dataset != flow.source.dataset:
            problems.append(
                f"{file}: steps[{i}].op: {step.op!r} takes a Dataset; give the source's variables (source.variables)"
                if op.dataset else
                f"{file}: steps[{i}].op: {step.op!r} takes one variable (source.variable), and this flow's source "
                "gives a dataset (source.variables): its steps are ops of datasets"
            )
        try:
            op.params(**step.params)
        except ValidationError as e:
            problems.extend(_messages(file, e, ("steps", i, "params"), op.params))
    for v in () if flow.source.dataset else flow.sink.variables or ():
        if v not in known[1:]:
            problems.append(f"{file}: sink.variables: {v!r} is not a step (steps: {', '.join(known[1:])})")
    if flow.sink.variables and flow.sink.name:
        problems.append(f"{file}: sink.name: give either sink.name (one result) or sink.variables, not both")
    if problems:
        raise FlowError("\n".join(problems))
    flow._file = file
    flow._content = data
    flow._sha256 = sha256_bytes(json.dumps(data, sort_keys=True, default=str).encode())
    return flow


class _Refused(yaml.YAMLError):
    """YAML that is valid but not accepted in a flow."""


class FlowLoader(yaml.SafeLoader):
    """YAML as flows need it: plain mappings, lists and scalars, nothing else.

    On top of SafeLoader (which builds no Python objects and runs no code), it refuses keys that
    appear twice in a mapping (YAML keeps the last silently), aliases (``*name``: a flow needs
    none, and ten lines of nested aliases expand to billions of items) and tags that SafeLoader
    does not know (``!!python/...``), each naming its line.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                f"line {event.start_mark.line + 1}: alias *{event.anchor}: flows do not use YAML anchors "
                "and aliases (&name, *name); write the value out where it is needed"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader says so below
                continue
            if first is not None:
                raise _Refused(f"line {line}: key {key!r} appears twice in one mapping (lines {first} and {line}); keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_undefined(self, node):
        raise _Refused(
            f"line {node.start_mark.line + 1}: tag {node.tag} is not allowed: flows hold plain data "
            "(mappings, lists, strings, numbers), never Python objects or code"
        )


FlowLoader.add_constructor(None, FlowLoader.construct_undefined)


def read_yaml(path: Path) -> tuple[Any, bytes]:
    """The parsed content of a flow file and its bytes; FlowError naming the file otherwise."""
    if not path.exists():
        raise FlowError(f"{path}: no such flow file")
    if path.is_dir():
        raise FlowError(f"{path}: is a folder; expected a flow file (YAML)")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as e:
        raise FlowError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise FlowError(f"{path}: not a text file (UTF-8): {e.reason} at byte {e.start}") from None
    try:
        return yaml.load(text, Loader=FlowLoader), raw
    except _Refused as e:
        raise FlowError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise FlowError(f"{path}: not valid YAML: {e}") from None


def load_flow(path: str | Path) -> Flow:
    """Read and validate a flow file."""
    path = Path(path)
    data, raw = read_yaml(path)
    flow = parse_flow(data, str(path))
    flow._sha256 = sha256_bytes(raw)
    return flow


# --- building and running ------------------------------------------------------------------------


def _layers(x: xr.DataArray | xr.Dataset) -> set[str]:
    if isinstance(x, xr.Dataset):
        return set().union(*(_layers(v) for v in x.data_vars.values()))
    graph = getattr(x.data, "__dask_graph__", None)
    return set(graph().layers) if graph is not None else set()


@dataclass
class BuiltFlow:
    """A flow's graph, built and not computed: the source array, the result, and which graph
    layers each part ("read" and one entry per step) added."""

    flow: Flow
    backend: str
    source: xr.DataArray | xr.Dataset  # a Dataset for a flow of Dataset ops
    result: xr.DataArray | xr.Dataset
    parts: dict[str, set[str]] = field(default_factory=dict)
    source_attrs: dict = field(default_factory=dict)  # the source store's global attributes
    open_seconds: float = 0.0  # opening the source (its metadata; nothing is read)
    from_table: tuple[str, ...] = ()  # the source's variables that the sample table gave


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
    try:
        if src.demo.kind == "genomics":
            from .demo_genomics import write_genomics_demo

            sizes = {k: v for k, v in (("samples", src.demo.samples), ("variants", src.demo.variants)) if v is not None}
            write_genomics_demo(src.path, seed=src.demo.seed, **sizes)
        else:
            from .demo import write_demo

            write_demo(src.path, src.demo.size, seed=src.demo.seed, resolution=src.demo.resolution)
    except InputError:
        if not Path(src.path).exists():  # another run may have written it meanwhile
            raise
    return True


def _check_source_path(flow: Flow) -> None:
    src = flow.source
    if not Path(src.path).exists() and "://" not in src.path:
        hint = " (add a 'demo' entry to the source to generate it)" if src.demo is None else ""
        raise FlowError(f"{flow._file}: source.path: {src.path}: no such file or directory{hint}")
    if src.samples is not None and not Path(src.samples).exists():
        raise FlowError(f"{flow._file}: source.samples: {src.samples}: no such file (expected a sample table, TSV or CSV)")


def _sample_table(flow: Flow):
    """The flow's sample table, read and checked on its own (None where it has none)."""
    from .sources.samples import read_table

    if flow.source.samples is None:
        return None
    try:
        return read_table(flow.source.samples)
    except InputError as e:
        raise FlowError(f"{flow._file}: source.samples: {e}") from None


def _with_table(flow: Flow, ds: xr.Dataset, table, existing=None) -> xr.Dataset:
    """``ds`` with the sample table's variables (the table matched to the store's samples);
    ``existing``: the store's variables, which the table may not replace (default: ``ds``'s)."""
    from .sources.samples import attach

    try:
        return attach(ds, table, existing)
    except InputError as e:
        raise FlowError(f"{flow._file}: source.samples: {e}") from None


def check_data(flow: Flow) -> dict[str, int]:
    """Check a flow against its source's metadata, as building its graph would, without building
    it (nor importing dask.array): the variable, then each step's dimensions, sizes, coordinates
    and units from its input's metadata (:mod:`pipeline.ops.shapes`); for a flow of Dataset ops,
    ``source.variables``, then the variables each step reads and adds, and ``sink.variables``
    (:func:`check_dataset_steps`). Returns the variable's (the variables') sizes; FlowError naming
    the key otherwise."""
    from .ops import shapes

    _check_source_path(flow)
    src, f = flow.source, flow._file
    if src.dataset:
        return _check_dataset(flow)
    with _open_metadata(flow) as ds:
        if src.variable not in ds.data_vars:
            raise FlowError(f"{f}: source.variable: {src.path}: no variable {src.variable!r} "
                            f"(variables: {', '.join(map(str, ds.data_vars))})")
        results = {"source": shapes.meta_of(ds, src.variable)}
    x = results["source"]
    for i, step in enumerate(flow.steps):
        op = ops_registry.get(step.op)
        x_in = x if step.input is None else results[step.input]
        if x_in is None:  # an earlier op without checks from metadata: its result is unknown
            results[step.label] = x = None
            continue
        try:
            x = shapes.check(op, x_in, op.params(**step.params).model_dump())
        except InputError as e:
            raise FlowError(f"{f}: steps[{i}] ({step.op}): {e}") from None
        results[step.label] = x
    if flow.sink.variables:
        check_one_grid(flow, {v: results[v] for v in flow.sink.variables})
    return dict(results["source"].sizes)


def _open_metadata(flow: Flow) -> xr.Dataset:
    """The source store's metadata, opened as a run opens the store (the same checks and messages)."""
    from .sources import open_metadata

    try:
        return open_metadata(flow.source.path)
    except InputError as e:
        raise FlowError(f"{flow._file}: source.path: {e}") from None


def check_one_grid(flow: Flow, results: dict) -> None:
    """Refuse results on different grids for one store: xarray would align them on the union of
    their coordinates (an outer join), padding each with NaN where another has values and turning
    integers into floats. ``results``: the steps' results by sink variable (DataArrays, or the
    Meta of their metadata checks; None where unknown); those that share a dimension must have
    the same size and coordinates along it. FlowError naming the steps and the dimension."""
    known = {v: r for v, r in results.items() if r is not None}
    ops = {s.label: s.op for s in flow.steps}
    for i, a in enumerate(known):
        for b in list(known)[i + 1:]:
            x, y = known[a], known[b]
            for dim in (d for d in x.dims if d in y.dims):
                ix, iy = x.indexes.get(dim), y.indexes.get(dim)
                if x.sizes[dim] == y.sizes[dim] and (ix is None or iy is None or ix.equals(iy)):
                    continue
                raise FlowError(
                    f"{flow._file}: sink.variables: {a!r} ({ops.get(a, a)}) and {b!r} ({ops.get(b, b)}) are on different "
                    f"grids: along dimension {dim!r}, {a} has {_along(ix, x.sizes[dim])} and {b} has "
                    f"{_along(iy, y.sizes[dim])}\n  one store holds results on one grid: write these in separate flows"
                )


def _along(index, size: int) -> str:
    """A dimension's coordinates in a few words: how many, the first and the last."""
    if index is None or not len(index):
        return f"{size} value{'s' * (size != 1)}"

    def one(v) -> str:
        return str(v).removesuffix(" 00:00:00")

    span = one(index[0]) if len(index) == 1 else f"{one(index[0])} to {one(index[-1])}"
    return f"{size} coordinate{'s' * (size != 1)} ({span})"


def _check_dataset(flow: Flow) -> dict[str, int]:
    """:func:`check_data` for a flow of Dataset ops: ``source.variables`` in the store, then each
    step's variables (:func:`check_dataset_steps`), from the store's metadata as the source opens it."""
    from .ops.genomics.variables import State

    src, f = flow.source, flow._file
    table = _sample_table(flow)
    with _open_metadata(flow) as ds:
        if table is not None:
            ds = _with_table(flow, ds, table)
        for name in src.variables:
            if name not in ds.data_vars:
                raise FlowError(f"{f}: source.variables: {src.path}: no variable {name!r} "
                                f"(variables: {', '.join(map(str, ds.data_vars))})")
        source = ds[src.variables]
        check_dataset_steps(flow, State.of(source), store=State.of(ds))
        return {str(d): int(n) for d, n in source.sizes.items()}


def check_dataset_steps(flow: Flow, source=None, store=None):
    """Walk a flow of Dataset ops through its steps by the variables each reads and adds
    (:data:`pipeline.ops.genomics.variables.DECLARED`), from ``source`` (a
    :class:`~pipeline.ops.genomics.variables.State`: the variables ``source.variables`` opens, with
    their dimensions and dtypes; by default their names alone, for a store not written yet); then
    ``sink.variables`` against the result. ``store`` (every variable of the store) lets a message
    say that a missing variable is in the store but not in ``source.variables``. FlowError naming
    the file, the key and the variable; returns the result's State (None past an op the table
    does not declare)."""
    from dataclasses import replace

    from .ops.genomics import variables as gv

    f, src = flow._file, flow.source
    source = gv.State.of_names(src.variables or ()) if source is None else source
    results = {"source": source}
    x = source
    fed = False  # whether earlier steps feed the dataset at this step
    for i, step in enumerate(flow.steps):
        where = f"steps[{i}] ({step.op})"
        if step.op not in gv.DECLARED:  # nothing known past it
            return None
        x_in, fed_in = (x, fed) if step.input is None else (results[step.input], step.input != "source")
        if x_in is None:
            return None
        params = ops_registry.get(step.op).params(**step.params).model_dump()
        try:
            x = gv.apply(step.op, params, x_in)
        except gv.Problem as e:
            key = f"steps[{i}].params.{e.param}" if e.param is not None and e.param in step.params else where
            given = "source.variables and earlier steps give" if fed_in else "source.variables give"
            whence = _whence(e.missing, e.dim, x_in, given, src, store, e.note, named=repr(e.missing) in e.core)
            raise FlowError(f"{f}: {key}: {e.core}{whence}") from None
        if x is None:
            raise FlowError(f"{f}: {where}: returns a table of pairs of variants (a Dask DataFrame), not a Dataset: "
                            "no step can follow it and a flow's sink cannot write it (ld_prune drops the variants "
                            "in LD and returns the dataset)")
        if params.get("merge") is False:
            lost = {n: f"{where} has merge: false, which keeps only the variables it adds"
                    for n in x_in.variables if n not in x.variables}
            x = replace(x, dropped={**x_in.dropped, **lost})
        results[step.label] = x
        fed = True
    if flow.sink.variables:
        for name in flow.sink.variables:
            if name not in x:
                raise FlowError(f"{f}: sink.variables: no variable {name!r} in the result of the steps"
                                f"{_whence(name, None, x, 'the source and steps give', src, store)}")
    elif not [v for v in x.data_vars() if v not in source.data_vars()]:
        raise FlowError(f"{f}: sink.variables: the steps add no variable; name the variables to write")
    return x


def _whence(missing, dim, ds, given: str, src: Source, store, note: str = "", *, named: bool = True) -> str:
    """What a message about a missing variable (or dimension) adds after saying so: what the
    dataset has (close names first), ``note``, and where the variable went or where it can be
    found."""
    import difflib

    notes = []
    if missing is not None and named:
        names = list(ds.variables)
        close = difflib.get_close_matches(missing, names, n=3, cutoff=0.6)
        ordered = close + [n for n in names if n not in close]
        listing = ", ".join(ordered[:8]) + (f", ... ({len(ordered) - 8} more)" if len(ordered) > 8 else "")
        notes.append(f" ({given}: {listing or 'none'})")
    notes.append(note)
    if missing is not None:
        if missing in ds.dropped:
            notes.append(f"; {ds.dropped[missing]}")
        elif store is not None and missing in store and missing not in (src.variables or ()):
            notes.append(f"; {'it' if named else missing} is in the store: add it to source.variables")
    elif dim is not None and store is not None:
        having = [n for n, v in store.variables.items() if v.dims and dim in v.dims and not v.coord
                  and n not in (src.variables or ())]
        if having:
            one = len(having) == 1
            notes.append(f"; {', '.join(having[:3])}{'' if len(having) <= 3 else ', ...'} {'has' if one else 'have'} it "
                         f"in the store: add {'it' if one else 'one'} to source.variables")
    return "".join(notes)


def build_flow(flow: Flow, backend: str | None = None) -> BuiltFlow:
    """Open the source and chain the steps into one graph. Computes nothing."""
    from .sources import open_dataset

    target = B.resolve(backend or flow.backend)
    src, f = flow.source, flow._file
    _check_source_path(flow)
    table = _sample_table(flow)
    names = src.variables or [src.variable]
    if table is not None:  # the table's variables come from the table, matched to the store's sample_id
        names = [v for v in names if v not in table.names] + ["sample_id"] * ("sample_id" not in names)
    t_open = time.perf_counter()
    try:
        ds = open_dataset(src.path, backend=target, chunks=src.chunks, variables=names)
    except InputError as e:
        key = ("source.variables" if src.dataset else "source.variable") if "no variable" in str(e) else "source.path"
        raise FlowError(f"{f}: {key}: {e}") from None
    if table is not None:
        with _open_metadata(flow) as store:  # the table may not replace a variable the flow does not read either
            existing = set(map(str, store.variables))
        ds = _with_table(flow, ds, table, existing)
        if "sample_id" not in src.variables:
            ds = ds.drop_vars("sample_id")
    t_open = time.perf_counter() - t_open
    if src.dataset:  # each step's variables, before a filter's statistics run over the data
        from .ops.genomics.variables import State

        check_dataset_steps(flow, State.of(ds))
    results = {"source": ds if src.dataset else ds[src.variable]}
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
    if src.dataset:
        result = _dataset_result(flow, x, results["source"])
    elif flow.sink.variables:
        check_one_grid(flow, {v: results[v] for v in flow.sink.variables})
        result = xr.Dataset({v: results[v].rename(v) for v in flow.sink.variables})
    else:  # named after what it is (the last step), not after the source variable it came from
        name = flow.sink.name or flow.steps[-1].label
        if name in x.coords:
            key = "sink.name" if flow.sink.name else f"steps[{len(flow.steps) - 1}].name"
            raise FlowError(f"{f}: {key}: the result is named {name!r}, which is also one of its coordinates "
                            f"({', '.join(map(str, x.coords))}); set sink.name (or the step's name) to another name")
        result = x.rename(name)
    return BuiltFlow(flow, target, results["source"], result, parts, dict(ds.attrs), t_open,
                     tuple(table.names) if table is not None else ())


def _dataset_result(flow: Flow, result: xr.Dataset, source: xr.Dataset) -> xr.Dataset:
    """What a flow of Dataset ops writes: ``sink.variables`` of its last step's Dataset, or the
    variables its steps added."""
    names = flow.sink.variables or [v for v in result.data_vars if v not in source.data_vars]
    missing = [v for v in names if v not in result.variables]
    if missing:
        raise FlowError(f"{flow._file}: sink.variables: the result has no variable {', '.join(map(repr, missing))} "
                        f"(its variables: {', '.join(map(str, result.data_vars))})")
    if not names:
        raise FlowError(f"{flow._file}: sink.variables: the steps add no variable; name the variables to write")
    return result[names]


def arrays_read(source: xr.DataArray | xr.Dataset) -> list[str]:
    """The stored arrays a run reads: the source variable and its coordinates (every variable of
    a Dataset source)."""
    if isinstance(source, xr.Dataset):
        return [*map(str, source.data_vars), *map(str, source.coords)]
    return [str(source.name), *map(str, source.coords)]


def source_array(source: xr.DataArray | xr.Dataset) -> xr.DataArray:
    """The array that stands for a run's input in its memory plan and report: the source variable,
    or a Dataset's largest variable (``call_genotype`` for a VCF Zarr store)."""
    if isinstance(source, xr.Dataset):
        return max(source.data_vars.values(), key=lambda v: v.nbytes)
    return source


def fingerprint(flow: Flow, arrays: list[str] | None = None) -> str:
    """A digest of what a run's result depends on: the flow (its file's bytes) and the sizes and
    modification times of the input arrays (``arrays``, by default the source variable and its
    coordinates, found from the store's metadata). Two runs with the same fingerprint compute the
    same output, so a partial output written under it can be resumed."""
    if arrays is None:
        arrays = arrays_read(build_flow(flow, "cpu").source)
    return _audit(flow, arrays)["fingerprint"]


def _audit(flow: Flow, arrays: list[str]) -> dict:
    """The report's fingerprints: of each input, of all inputs, and of the flow with its inputs."""
    inputs = [path_fingerprint(flow.source.path, arrays)]
    if flow.source.samples is not None:  # a run depends on the table's values as on the store's
        inputs.append(path_fingerprint(flow.source.samples))
    of_inputs = combined([i["fingerprint"] for i in inputs])
    return {"inputs": inputs, "inputs_fingerprint": of_inputs, "fingerprint": combined([flow._sha256, of_inputs])}


def output_attrs(flow: Flow, source_attrs: dict, command: str, when: datetime) -> dict:
    """Global attributes of a flow's output: CF ``history`` (the source's, then this run),
    ``source``, the flow's name and digest, the pipeline version, and the source's ``title``,
    ``institution`` and CF ``Conventions`` where it has them."""
    from ._version import __version__

    entry = f"{when.isoformat(timespec='seconds').replace('+00:00', 'Z')}: {command}"
    previous = str(source_attrs.get("history", "")).rstrip("\n")
    attrs = {k: source_attrs[k] for k in ("title", "institution") if k in source_attrs}
    if "CF" in str(source_attrs.get("Conventions", "")):
        attrs["Conventions"] = "CF-1.10"
    return {
        **attrs,
        "history": f"{previous}\n{entry}" if previous else entry,
        "source": flow.source.path,
        "pipeline_version": __version__,
        "pipeline_flow": flow.name,
        "pipeline_flow_sha256": flow._sha256.removeprefix("sha256:"),
    }


def _as_dataset(result: xr.DataArray | xr.Dataset, attrs: dict) -> xr.Dataset:
    ds = result if isinstance(result, xr.Dataset) else result.to_dataset()
    return ds.assign_attrs(attrs)


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _part_name(part: str) -> str:
    """A report's name for a part of the graph: the step's label ("0:clim" -> "clim"), "write"."""
    return part.split(":", 1)[1] if ":" in part else part


def _timing(t: dict) -> dict:
    return {**t, **({"fused_into": _part_name(t["fused_into"])} if "fused_into" in t else {})}


def check_sink(flow: Flow, output: str | Path | None = None) -> None:
    """Refuse, before anything runs, a sink that would destroy data: one that is, contains or lies
    inside the source, or (mode overwrite) an existing path that is not a store pipeline wrote."""
    from .sinks.zarr import check_target

    check_target(output or flow.sink.path, mode=flow.sink.mode, protect=(flow.source.path,))


def check_report(flow: Flow, report: str | Path, output: str | Path | None = None) -> None:
    """Refuse, before anything runs, a report that could not be written, or whose writing would
    overwrite the flow file, a file of the source, or the output (``output``, else the sink)."""
    check_report_path(report, inputs=(flow.source.path,), flow_file=flow._file, output=output or flow.sink.path)


def run_flow(
    flow: Flow | str | Path,
    *,
    backend: str | None = None,
    source: str | Path | None = None,
    output: str | None = None,
    client=None,
    report: str | Path | None = None,
    progress: bool = False,
    command: str | None = None,
    resume: bool = False,
    import_seconds: float | None = None,
) -> dict:
    """Run a flow: generate a missing demo source, build the graph, write the sink, report.

    ``source`` reads the source variable from that store instead of the flow's ``source.path``
    (for instance the copy ``pipeline convert`` writes); no demo is generated for it. Returns the
    report (also written as JSON to ``report`` when given: checked before anything runs by
    :func:`check_report`, written whole, and written for a failed run too, with its error and
    exit status). ``command`` is the command line recorded in the report and the output's history
    (default: this process's).
    ``resume`` continues from the partial output a killed or interrupted run of the same flow on
    the same source left, computing only the missing chunks. ``import_seconds``, the time from the
    process's start to the command (the ``pipeline`` command gives it), goes into the report's
    ``startup`` section.
    """
    from . import config

    config.check()  # a misspelt or invalid setting is refused before anything runs
    patches.check_setting()  # and a change of pipeline.patches' that is not one
    if not isinstance(flow, Flow):
        flow = load_flow(flow)
    if source is not None:
        flow = with_source(flow, source)
    if report:
        check_report(flow, report, output)
    started = time.time()
    rep: dict = {
        "flow": flow.name, "flow_file": flow._file, "flow_sha256": flow._sha256, "flow_content": flow._content,
        "started_utc": _utc(started), **who(), "versions": versions(),
    }
    if command is not None:
        rep["command"] = command
    try:
        rep |= _run(flow, rep, backend=backend, output=output, client=client, progress=progress, resume=resume,
                    import_seconds=import_seconds)
    except BaseException as e:
        rep |= {"status": "failed", "exit_status": 2 if isinstance(e, InputError) else 1,
                "error": f"{type(e).__name__}: {e}"}
        raise
    else:
        rep |= {"status": "ok", "exit_status": 0}
    finally:
        finished = time.time()
        rep |= {"finished_utc": _utc(finished), "total_seconds": round(finished - started, 3)}
        if report:
            write_report(rep, report)
    return rep


def _run(flow: Flow, rep: dict, *, backend, output, client, progress, resume, import_seconds) -> dict:
    """The body of :func:`run_flow`: what it adds to the report ``rep`` (which holds who runs what)."""
    from .exec import memory
    from .exec.compute import seconds_computed
    from .kernels.launch import compile_seconds
    from .exec.cluster import directory_bytes
    from .sinks.zarr import write_zarr

    compiled_before = compile_seconds()
    t_backend = time.perf_counter()
    target = B.resolve(backend or flow.backend)  # a backend that is not there is refused before any write
    _initialize(target)
    t_backend = time.perf_counter() - t_backend
    sink_path = output or flow.sink.path
    check_sink(flow, sink_path)
    t0 = time.perf_counter()
    generated = ensure_source(flow)
    t_source = time.perf_counter() - t0
    if generated:
        log.info("generated the demo source %s in %.1f s", flow.source.path, t_source,
                 extra={"source": flow.source.path, "seconds": round(t_source, 3)})
    t_build, computed = time.perf_counter(), seconds_computed()
    built = build_flow(flow, target)
    t_build, t_statistics = time.perf_counter() - t_build, seconds_computed() - computed
    sink_path = output or flow.sink.path
    arrays = arrays_read(built.source)
    rep |= _audit(flow, arrays)
    results = built.result.data_vars.values() if isinstance(built.result, xr.Dataset) else [built.result]
    mem_plan = None
    if client is None:  # a cluster's workers keep their own limits and spill
        mem_plan = memory.plan(source_array(built.source).data, *(r.data for r in results if hasattr(r.data, "dask")),
                               backend=built.backend)
        memory.check(mem_plan, f"{flow._file}: ")
    from .exec.spill import spilled_bytes

    out = _as_dataset(built.result, output_attrs(flow, built.source_attrs, rep["command"], datetime.now(timezone.utc)))
    log.info("flow %s (%s): %s from %s on %s -> %s", flow.name, flow._file, flow.source.label, flow.source.path,
             built.backend, sink_path, extra={"flow": flow.name, "flow_file": flow._file, "source": flow.source.path,
                                               "variable": flow.source.label, "backend": built.backend,
                                               "sink": str(sink_path), "steps": [s.label for s in flow.steps]})
    spilled_bytes(reset=True)
    # a partial output is resumed only if written from this flow, on these inputs, on this backend
    resume_token = combined([rep["fingerprint"], built.backend])
    with task_timer(client) as times:
        written = write_zarr(
            out, sink_path, mode=flow.sink.mode, name=flow.sink.name, progress=progress,
            protect=(flow.source.path,), resume=resume, fingerprint=resume_token,
            check_inputs=lambda: check_unchanged(flow, rep["inputs"], arrays),
        )
    by_part = {part: _timing(t) for part, t in attribute(times, built.parts).items()}

    stored_read = sum(_stored_bytes(flow.source.path, v) for v in (flow.source.variables or [flow.source.variable])
                      if v not in built.from_table)
    nbytes_read = int(built.source.nbytes)
    src_array = source_array(built.source)
    steps = []
    for i, step in enumerate(flow.steps):
        t = by_part[f"{i}:{step.label}"]
        steps.append({"name": step.label, "op": step.op, "params": step.params, **t})
    from .exec.cluster import describe

    done = {
        "backend": built.backend,
        "cluster": describe(client),
        "source": {
            "path": flow.source.path,
            "variable": flow.source.label,
            "generated": generated,
            "generate_seconds": round(t_source, 3),
            "shape": list(src_array.shape),
            "chunks": [list(c) for c in src_array.data.chunks],
        },
        "sink": {"path": str(sink_path), "bytes_stored": directory_bytes(sink_path), "nbytes": int(built.result.nbytes),
                 "variables": list(map(str, out.data_vars)), "attrs": out.attrs, "digests": written.digests,
                 "chunks_written": written.chunks_written, "chunks_kept": written.chunks_kept},
        "startup": _startup(import_seconds, built.open_seconds, t_build - built.open_seconds - t_statistics,
                            t_statistics, t_backend, compile_seconds() - compiled_before, times.wall),
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
    log.info("flow %s: wrote %s in %.2f s (%.3f GB read, %s GB/s); %s", flow.name, sink_path, times.wall,
             nbytes_read / 1e9, done["throughput_GBps"], step_times(steps),
             extra={"flow": flow.name, "sink": str(sink_path), "wall_seconds": done["wall_seconds"],
                    "bytes_read": nbytes_read, "throughput_GBps": done["throughput_GBps"],
                    "steps": {s["name"]: {k: s[k] for k in ("task_seconds", "tasks", "fused_into") if k in s}
                              for s in steps}})
    return done


def check_unchanged(flow: Flow, inputs: list[dict], arrays: list[str]) -> None:
    """Refuse a result computed from inputs that changed while the run read them (``inputs``:
    their fingerprints, taken before computing): zarr reads a chunk deleted meanwhile as fill
    values, so such a result may look complete and hold missing or mixed data."""
    for before in inputs:
        now = path_fingerprint(before["path"], arrays)
        if now["fingerprint"] != before["fingerprint"]:
            raise InputError(
                f"{flow._file}: source.path: {before['path']}: changed during the run (files rewritten, added or "
                f"removed: {before['files']} files of {before['bytes']} bytes before, {now['files']} of {now['bytes']} "
                "after); nothing was written: run again once the source no longer changes"
            )


def _stored_bytes(path: str, variable: str) -> int:
    """Bytes stored for one variable of a store (the whole file for NetCDF)."""
    from .exec.cluster import directory_bytes

    var = Path(path) / variable
    return directory_bytes(var) if var.is_dir() else directory_bytes(path)


def _initialize(backend: str) -> None:
    """Create the CUDA context now on the GPU (the first use of the device does), so that the
    report counts it apart from the first task that would otherwise pay for it."""
    if backend == "gpu":
        B.module("gpu").cuda.Device().synchronize()


def _startup(imports, open_source, build_graph, statistics, backend, compile_kernels, compute) -> dict:
    """The report's ``startup`` section: seconds before the data flow (importing pipeline and its
    libraries, from the process's start; opening the source; building the graph; the computations
    made while it was built, such as a filter's statistics over the data; initialising the
    backend, the CUDA context on the GPU), the seconds of compute, and of those and the
    statistics the seconds spent compiling kernels (or loading them from the disk caches)."""
    out = {"import_seconds": imports, "open_source_seconds": open_source, "build_graph_seconds": build_graph,
           "statistics_seconds": statistics, "backend_init_seconds": backend, "compile_seconds": compile_kernels,
           "compute_seconds": compute}
    return {k: None if v is None else round(max(v, 0.0), 4) for k, v in out.items()}


def step_times(steps: list[dict]) -> str:
    """``name 1.23s`` per step, or ``name fused into write`` for a step dask ran inside a later
    part's tasks (its time is counted there)."""
    def one(s):
        if "fused_into" in s:
            return f"{s['name']} fused into {s['fused_into']}"
        return f"{s['name']} {s['task_seconds']:.2f}s" if s["tasks"] else f"{s['name']} no tasks"

    return "task time: " + ", ".join(map(one, steps))
