"""What each genomics op reads and adds, by variable: each Dataset op declares it where it is
defined, as the ``variables`` of its ``@register(...)`` (a :class:`Declared`), and ``pipeline
validate`` walks a flow of Dataset ops through those declarations (:func:`apply`) from a store's
metadata (names, dimensions, dtypes), nothing read and no graph built. :data:`DECLARED` is the
view of them by op name.

A declaration lists, in the order the op checks them:

- ``Read(name, dims, kind)``: a variable the op reads, which must be in the dataset with those
  dimensions (a tuple, or a list of tuples any of which will do; ``ANY`` is any one dimension,
  ``ROWS`` is ``windows`` in a windowed dataset, else ``variants``) and values of those NumPy kinds
  ("i" signed integers, "u" unsigned, "f" floats, "b" booleans, "OUST" strings);
- ``Ensure(name, by)``: sgkit's ``define_variable_if_absent``: where the dataset lacks the
  variable under its default name, the op computes it first with op ``by`` (whose own declaration
  says what that reads and adds; the computed variables are kept in the result, as sgkit merges
  them), or, with ``by=None``, does without it; under another name it must be there;
- ``Dim(name)``: a dimension the dataset must have (``unless`` a parameter gives its length);
- ``CONTIGS``: the dataset must name its contigs (a ``contigs`` dimension, a ``contig_id``
  variable or a ``contigs`` attribute);
- ``Add(name, dims, kind)``: a variable of the result (replacing one of the same name); with
  ``merge: false`` the result holds these alone (and the ``Keep`` ones, where there).

A name is a variable's, or ``"{param}"``: the variable (or list of variables) that parameter
names, none where it is None. ``when`` makes an item conditional on the parameters or the dataset
(:func:`given`, :func:`equals`, :func:`present`, :func:`absent`). Filters and ``ld_prune`` add
nothing: they keep the variables and change sizes, which validation leaves alone.

Where sgkit's specs (:mod:`.specs`) describe a variable as the op reads or gives it, the item is
made from the spec (:func:`read`, :func:`add`); where the op accepts more kinds of values than the
spec (unsigned counts and positions, strings of every kind) or gives one of the spec's kinds, or
the spec names no kind, the item is written out, with a note. A step an op runs within that is no
registered op (sgkit's ``genotype_coords``) is declared with :func:`step`.

tests/test_validate_genomics.py runs each op on a small dataset with each of its variables
removed, transposed or of another type in turn, and checks that the op fails exactly where
:func:`apply` says it does, and that where it does not, its result has the variables, dimensions
and kinds of values its declaration says.
"""


from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Callable

from ...errors import InputError
from . import specs

V, S, P, A, W = "variants", "samples", "ploidy", "alleles", "windows"
ANY = "*"  # any one dimension
ROWS = "<rows>"  # "windows" in a windowed dataset (window_start and window_stop), else "variants"
STRINGS = "OUST"


# --- what a step knows of its dataset ---------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """A variable as the checks know it: its dimensions and NumPy kind (None: not known, for a
    source checked by names alone), its dtype's name where known, and whether it is a coordinate."""

    dims: tuple[str, ...] | None
    kind: str | None
    dtype: str | None = None
    coord: bool = False


@dataclass(frozen=True)
class State:
    """The variables of the dataset at a step, and the names of its attributes (None: not known)."""

    variables: dict[str, Var]
    attrs: frozenset[str] | None = None
    # variables an earlier step dropped, and why: for messages
    dropped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, ds) -> "State":
        """From an xarray Dataset, opened lazily (its metadata: nothing is read)."""
        return cls(
            {str(k): Var(tuple(map(str, v.dims)), v.dtype.kind, str(v.dtype), str(k) in ds.coords)
             for k, v in ds.variables.items()},
            frozenset(map(str, ds.attrs)),
        )

    @classmethod
    def of_names(cls, names) -> "State":
        """Variables known by name only (a store not written yet)."""
        return cls({str(n): Var(None, None) for n in names}, None)

    def __contains__(self, name) -> bool:
        return name in self.variables

    def dims(self) -> set[str] | None:
        """The dataset's dimensions; None where any variable's are not known."""
        if any(v.dims is None for v in self.variables.values()):
            return None
        return {d for v in self.variables.values() for d in v.dims}

    @property
    def windowed(self) -> bool:
        return "window_start" in self and "window_stop" in self

    def data_vars(self) -> list[str]:
        return [k for k, v in self.variables.items() if not v.coord]


class Problem(InputError):
    """A step whose variables do not check: ``param`` is the step's parameter that named the
    variable (None where the op reads it by its default name), ``missing`` the variable that is
    not there, ``dim`` the dimension that is not there."""

    def __init__(self, message: str, note: str = "", *, param: str | None = None, missing: str | None = None,
                 dim: str | None = None):
        super().__init__(message + note)
        self.core, self.note = message, note  # what is wrong; then what to do, where there is more to say
        self.param, self.missing, self.dim = param, missing, dim


# --- the vocabulary of declarations -----------------------------------------------------------------

Condition = Callable[[dict, State], bool]


def given(*params: str) -> Condition:
    """Any of ``params`` is not None."""
    return lambda p, ds: any(p.get(k) is not None for k in params)


def equals(**values) -> Condition:
    """Each parameter has the given value."""
    return lambda p, ds: all(p.get(k) == v for k, v in values.items())


def present(name: str) -> Condition:
    """The variable (``"{param}"``: the one the parameter names) is in the dataset."""
    return lambda p, ds: all(n in ds for n, _ in _names(name, p))


def absent(name: str) -> Condition:
    return lambda p, ds: not present(name)(p, ds)


@dataclass(frozen=True)
class Read:
    name: str
    dims: tuple | list[tuple] | None = None
    kind: str | None = None
    when: Condition | None = None
    coord: bool = False  # must be a coordinate
    hint: str = ""  # said where it is missing


@dataclass(frozen=True)
class Ensure:
    name: str
    by: str | None
    params: dict = field(default_factory=dict)  # for ``by``: values, or "{param}" of this op's
    when: Condition | None = None


@dataclass(frozen=True)
class Dim:
    name: str
    unless: str | None = None
    when: Condition | None = None
    hint: str = ""


@dataclass(frozen=True)
class Contigs:
    when: Condition | None = None


CONTIGS = Contigs()


@dataclass(frozen=True)
class Add:
    name: str
    dims: tuple[str, ...]
    kind: str
    coord: bool = False
    when: Condition | None = None


@dataclass(frozen=True)
class Keep:
    name: str
    when: Condition | None = None


@dataclass(frozen=True)
class Declared:
    needs: tuple = ()
    adds: tuple = ()
    table: bool = False  # returns a table (a Dask DataFrame), not a Dataset
    defaults: dict = field(default_factory=dict)  # parameters of a step that is no registered op
    normalize: Callable[[dict], dict] | None = None  # parameters as the op reads them


# --- sgkit's specs as items -------------------------------------------------------------------------


def _spec_dims(spec) -> tuple[str, ...]:
    """A spec's dimensions as items name them: ``{"variants", "windows"}`` is :data:`ROWS`."""
    dims = []
    for d in spec.dims or ():
        if d == {V, W}:
            dims.append(ROWS)
        elif isinstance(d, str):
            dims.append(ANY if d == "*" else d)
        else:
            raise ValueError(f"the spec of {spec.default_name!r} has dimensions {spec.dims}, which items do not name")
    return tuple(dims)


def _spec_kind(spec) -> str:
    return "".join(sorted(spec.kind)) if isinstance(spec.kind, set) else spec.kind


def read(spec, name: str | None = None, **kw) -> Read:
    """:class:`Read` of a variable with the dimensions and kinds of values of sgkit's ``spec``
    (:mod:`.specs`), under ``name`` (a ``"{param}"``) or the spec's own."""
    return Read(name or spec.default_name, _spec_dims(spec), _spec_kind(spec), **kw)


def add(spec, **kw) -> Add:
    """:class:`Add` of sgkit's ``spec``: its name, dimensions and kind of values (one, as the
    result holds one; the checks of a later step read it as the dataset's dtype)."""
    kind = _spec_kind(spec)
    if kind is None or len(kind) != 1:
        raise ValueError(f"the spec of {spec.default_name!r} gives kinds {spec.kind!r}: an added variable has one")
    return Add(spec.default_name, _spec_dims(spec), kind, **kw)


# --- the items the ops share ------------------------------------------------------------------------

GENOTYPES = read(specs.call_genotype_spec, "{call_genotype}")
DOSAGE = (V, S)
SAMPLE_COLUMNS = [(S,), (S, ANY)]  # 1-D (samples) or 2-D (samples, columns), as sgkit's concat_2d
WINDOWED = "the dataset must be windowed first: window_by_variant or window_by_position add window_start and window_stop"
# unsigned bounds too, where sgkit's specs say signed
WINDOWS = (Read("window_start", (W,), "iu", hint=WINDOWED), Read("window_stop", (W,), "iu", hint=WINDOWED))
WINDOW_BOUNDS = (add(specs.window_contig_spec), add(specs.window_start_spec), add(specs.window_stop_spec))
ALT = "call_alternate_allele_count"
ALT_COUNTED = Ensure("{variable}", "count_call_alternate_alleles")  # pca's and sample_distance's


# --- the declarations, read from the ops ------------------------------------------------------------

_STEPS: dict[str, Declared] = {}  # steps within ops that are no registered op, by name


def step(name: str, declared: Declared) -> Declared:
    """Declare ``name``, a step an op runs within that is no registered op (sgkit's
    ``genotype_coords``), for :class:`Ensure` items to name."""
    if name in _STEPS:
        raise ValueError(f"step {name!r} is declared twice")
    _STEPS[name] = declared
    return declared


class _Declarations(Mapping):
    """Op (or step) name -> its :class:`Declared`: the ``variables`` of each registered Dataset op
    (:func:`pipeline.ops.registry.register`), and the steps of :func:`step`."""

    def _all(self) -> dict[str, Declared]:
        from ... import ops  # importing the ops registers them

        return {**{o.name: o.variables for o in ops.all_ops() if o.variables is not None}, **_STEPS}

    def __getitem__(self, name: str) -> Declared:
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


DECLARED: Mapping[str, Declared] = _Declarations()


# --- applying it ------------------------------------------------------------------------------------


def _names(template: str, params: dict) -> list[tuple[str, str | None]]:
    """The variables a name stands for, each with the parameter that gave it (None: a fixed name)."""
    if not (template.startswith("{") and template.endswith("}")):
        return [(template, None)]
    param = template[1:-1]
    value = params.get(param)
    if value is None:
        return []
    return [(n, param) for n in ([value] if isinstance(value, str) else list(value))]


def _resolve(value, params: dict):
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return params.get(value[1:-1])
    return value


def _holds(item, params: dict, ds: State) -> bool:
    return item.when is None or item.when(params, ds)


def _show(dims) -> str:
    return "(" + ", ".join("<any>" if d == ANY else d for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _dims_match(have: tuple, want: tuple) -> bool:
    return len(have) == len(want) and all(w == ANY or h == w for h, w in zip(have, want))


def defaults(op: str) -> dict:
    """A declared op's parameters with nothing given: the registered op's defaults."""
    entry = DECLARED[op]
    if entry.defaults:
        return dict(entry.defaults)
    from ..registry import get

    model = get(op).params
    return {k: f.default for k, f in model.model_fields.items() if not f.is_required()}


def apply(op: str, params: dict, ds: State, *, via: str = "") -> State | None:
    """The dataset after op ``op`` with ``params`` (all of them, defaults included) on ``ds``,
    from its declaration: :class:`Problem` where a variable it reads is missing or not as it must be.
    None for an op that returns a table, not a Dataset."""
    entry = DECLARED[op]
    if entry.normalize is not None:
        params = entry.normalize(params)
    defaults_ = None
    work = ds
    for item in entry.needs:
        if not _holds(item, params, work):
            continue
        if isinstance(item, Read):
            for name, param in _names(item.name, params):
                _check(work, name, item, param, op, via)
        elif isinstance(item, Ensure):
            for name, param in _names(item.name, params):
                if name in work:
                    continue
                if defaults_ is None:
                    defaults_ = defaults(op) if entry.normalize is None else entry.normalize(defaults(op))
                default = _resolve(item.name, defaults_)
                if param is not None and name != default:
                    raise Problem(f"no variable {name!r} in the dataset at this step{via}",
                                  f"; {op} computes it where missing only under its default name, {default!r}",
                                  param=param, missing=name)
                if item.by is None:
                    continue
                inner = {**defaults(item.by), **{k: _resolve(v, params) for k, v in item.params.items()}, "merge": True}
                passed = {k: v[1:-1] for k, v in item.params.items() if isinstance(v, str) and v.startswith("{")}
                try:
                    work = apply(item.by, inner, work, via=f", needed by {item.by} to compute {name} for {op}{via}")
                except Problem as e:
                    e.param = passed.get(e.param) if e.param is not None else None
                    raise
        elif isinstance(item, Dim):
            if item.unless is not None and params.get(item.unless) is not None:
                continue
            dims = work.dims()
            if dims is not None and item.name not in dims:
                given_by = f" (or give {item.unless})" if item.unless else ""
                raise Problem(f"the dataset has no {item.name!r} dimension at this step{via}{given_by}", dim=item.name)
        elif isinstance(item, Contigs):
            dims = work.dims()
            if "contig_id" in work or (dims is not None and "contigs" in dims) or (work.attrs is not None and "contigs" in work.attrs):
                continue
            if dims is not None and work.attrs is not None:
                raise Problem(f"the dataset names no contigs at this step{via}",
                              "; window ops need a contig_id variable, a contigs dimension or a contigs attribute",
                              missing="contig_id")
    if entry.table:
        return None
    rows = W if work.windowed else V
    new: dict[str, Var] = {}
    for item in entry.adds:
        if not _holds(item, params, work):
            continue
        if isinstance(item, Keep):
            if item.name in work and params.get("merge", True) is False:
                new[item.name] = work.variables[item.name]
            continue
        dims = tuple(rows if d == ROWS else d for d in item.dims)
        for name, _ in _names(item.name, params):
            new[name] = Var(dims, item.kind, None, item.coord)
    if params.get("merge", True) is False:
        return State(new, frozenset(), dict(ds.dropped))
    return replace(work, variables={**work.variables, **new})


def _check(ds: State, name: str, item: Read, param: str | None, op: str, via: str) -> None:
    hint = f"; {item.hint}" if item.hint else ""
    if name not in ds:
        raise Problem(f"no variable {name!r} in the dataset at this step{via}", hint, param=param, missing=name)
    v = ds.variables[name]
    if item.coord and not v.coord:
        raise Problem(f"{name!r} is not a coordinate of the dataset at this step{via}", hint, param=param)
    if item.dims is not None and v.dims is not None:
        rows = W if ds.windowed else V
        options = [item.dims] if isinstance(item.dims, tuple) else item.dims
        options = [tuple(rows if d == ROWS else d for d in o) for o in options]
        if not any(_dims_match(v.dims, o) for o in options):
            raise Problem(f"variable {name!r} has dimensions {_show(v.dims)}, expected "
                          f"{' or '.join(map(_show, options))}{via}", param=param)
    if item.kind is not None and v.kind is not None and v.kind not in item.kind:
        have = v.dtype or _kinds(v.kind)
        raise Problem(f"variable {name!r} has values of type {have}, expected {_kinds(item.kind)}{via}", param=param)


def _kinds(kind: str) -> str:
    names = {"i": "signed integers", "u": "unsigned integers", "f": "floats", "b": "booleans"}
    return " or ".join(dict.fromkeys(names.get(k, "strings") for k in kind))


def undeclared(ops) -> list[str]:
    """The names of Dataset ops among ``ops`` (registered :class:`~pipeline.ops.registry.Op`) that
    declare no variables."""
    return [o.name for o in ops if o.dataset and o.variables is None]

