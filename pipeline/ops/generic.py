"""Generic steps: xarray's own reductions by name, so that flows reach them as Python callers do.

``resample``, ``groupby``, ``rolling``, ``coarsen``, ``weighted`` and ``reduce`` each call the
xarray method of that name on the DataArray (a Dask array of NumPy or CuPy chunks) and then the
reduction ``how`` (``mean``, ``max``, ``std``, ``quantile`` with ``q``, ...): the results are
xarray's, NaN-skipping as xarray's defaults are, on the input's backend. No kernel of pipeline's
runs here.

Parameters are checked by the ops' models (``how`` against the reductions the op offers, ``q``
given exactly where ``how`` is ``quantile``), and the data by the checks below from metadata alone
(the frequency xarray would refuse, a group that is not a coordinate, a window longer than its
dimension, a factor that does not divide it): ``pipeline validate`` runs the same checks, without
building a graph.

Results say what they are in CF terms, as the other ops' do (:mod:`pipeline.ops.metadata`):
``cell_methods`` takes CF's name of the reduction where CF has one (``maximum``,
``standard_deviation``, ``variance``, ...) and ``how`` itself otherwise (``time: first``).
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from typing import Annotated, Literal

import numpy as np
import pandas as pd
import xarray as xr
from pydantic import BeforeValidator, Field, PlainValidator, StrictBool, TypeAdapter, ValidationError, ValidationInfo

from ..backend import backend_of, module, to_numpy
from ..errors import InputError
from ._common import _check
from .metadata import Produces, cell_names, input_name, period
from .params import Count, Dim, Dims, Frequency, MinPeriods, Quantiles, Weights, invalid
from .registry import register
from .shapes import (
    Meta, _axis, _dates_in_order, _is_latitude, _new_dim, _weighted_mean, _without, latitude_radians,
)

# the reductions each xarray object offers, in xarray's order
REDUCTIONS = ("mean", "sum", "min", "max", "std", "var", "median", "count", "prod", "any", "all", "first", "last",
              "quantile")
ROLLING = ("mean", "sum", "min", "max", "std", "var", "median", "count")
COARSEN = ("mean", "sum", "min", "max", "std", "var", "median", "count", "prod", "any", "all")
WEIGHTED = ("mean", "sum", "std", "var", "quantile")
PLAIN = ("mean", "sum", "min", "max", "std", "var", "median", "count", "prod", "any", "all", "quantile")

# the parts of dates a group may name, as xarray's virtual coordinates (time.month)
DATE_PARTS = ("year", "month", "day", "hour", "dayofyear", "dayofweek", "season")


def _how(names: tuple[str, ...]):
    """``how``: one of ``names``; otherwise the closest of them and the list, in one message."""

    def check(v):
        if isinstance(v, str) and v in names:
            return v
        close = difflib.get_close_matches(v, names, n=1) if isinstance(v, str) else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise invalid(f"unknown reduction {v!r}{hint} (reductions: {', '.join(names)})")

    return Annotated[Literal[names], BeforeValidator(check)]


_QUANTILES = TypeAdapter(Quantiles)


def _q(v, info: ValidationInfo):
    """``q`` where ``how`` (declared before it) is quantile, and nowhere else."""
    how = info.data.get("how")  # absent where how itself was refused
    if v is None:
        if how == "quantile":
            raise invalid("required where how is 'quantile': a quantile in [0, 1] or a list of them")
        return None
    if how is not None and how != "quantile":
        raise invalid(f"q is the quantile of how: quantile, and how is {how!r}; remove q or set how: quantile")
    try:
        return _QUANTILES.validate_python(v)
    except ValidationError as e:
        raise invalid(e.errors()[0]["msg"]) from None


Q = Annotated[float | list[float] | None, PlainValidator(_q), Field(validate_default=True)]
"""A quantile in [0, 1] or a list of them, given exactly where ``how`` is ``quantile``."""

Boundary = Literal["exact", "trim", "pad"]


def _validated(op, **params) -> dict:
    """``params`` checked by ``op``'s model, as a flow's are: a Python caller gets the same
    messages (InputError naming the key)."""
    try:
        return op.params(**params).model_dump()
    except ValidationError as e:
        raise InputError("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())) from None


def _checked(op, x: xr.DataArray, **p) -> None:
    """``op``'s checks of ``x`` (:func:`pipeline.ops._common._check`); on GPU data, also
    pipeline's changes to xarray and dask that xarray's methods need there (:mod:`pipeline.patches`),
    which ``open_dataset`` makes for its arrays, and an array moved to the GPU otherwise has not."""
    _check(op, x, **p)
    if backend_of(x) == "gpu":
        from .. import patches

        patches.apply()


def _reduced(obj, how: str, q=None, **dims):
    """``obj.<how>()`` (``obj.quantile(q)``) of an xarray object, skipna as xarray's default.

    xarray's own grouped reductions, flox installed or not (``use_flox=False``): a step then
    gives one result and one memory plan wherever it runs. With flox (xclim installs it) xarray
    hands groupby and resample reductions to it, which refuses median and quantile unless every
    group lies in one chunk ("only supported for method='blockwise'"), computes while the graph is
    built, and drops a non-index coordinate along the groups."""
    with xr.set_options(use_flox=False):
        if how == "quantile":
            return obj.quantile(q, keep_attrs=True, **dims)
        return getattr(obj, how)(keep_attrs=True, **dims)


def _whole_along(x: xr.DataArray, dims) -> xr.DataArray:
    """``x`` in chunks whole along ``dims``, as xarray's quantile over dimensions needs, and split
    along the others to keep chunks near dask's ``array.chunk-size`` (in memory: as it is)."""
    if x.chunks is None:
        return x
    dims = {dims} if isinstance(dims, str) else set(dims)
    return x.chunk({d: -1 if d in dims else "auto" for d in x.dims})


# --- what the results are (CF) ----------------------------------------------------------------------

CF_METHODS = {"mean": "mean", "sum": "sum", "min": "minimum", "max": "maximum", "std": "standard_deviation",
              "var": "variance", "median": "median"}
WORDS = {"mean": "mean", "sum": "sum", "min": "minimum", "max": "maximum", "std": "standard deviation",
         "var": "variance", "median": "median", "count": "number of valid values", "prod": "product",
         "any": "any (logical or)", "all": "all (logical and)", "first": "first valid value",
         "last": "last valid value"}
KEEPS_STANDARD_NAME = ("mean", "sum", "min", "max", "median", "first", "last", "quantile")


def _method(p: dict) -> str:
    """CF's name of the reduction (CF conventions, Appendix E) where it has one, else ``how``'s;
    a quantile is CF's minimum, median or maximum where it is one of those, else "percentile"."""
    if p["how"] == "quantile":
        q = p["q"]
        return {0.0: "minimum", 0.5: "median", 1.0: "maximum"}.get(float(q), "percentile") if np.ndim(q) == 0 else "percentile"
    return CF_METHODS.get(p["how"], p["how"])


def _what(x: xr.DataArray, p: dict) -> str:
    if p["how"] == "quantile":
        q = p["q"]
        return f"{100 * float(q):g}th percentile" if np.ndim(q) == 0 else "percentiles"
    return WORDS[p["how"]]


def _units(x: xr.DataArray, p: dict) -> str | None:
    """The input's units; "1" for a count; their square for a variance; none for a product or a
    logical result."""
    units, how = x.attrs.get("units"), p["how"]
    if how == "count":
        return "1"
    if how in ("prod", "any", "all"):
        return None
    if how == "var" and units is not None:
        return f"{units}2" if units.isalpha() else f"({units})2"
    return units


def _standard_name(x: xr.DataArray, p: dict) -> str | None:
    """The input's, where the result is still of that quantity (its cell_methods say how)."""
    return x.attrs.get("standard_name") if p["how"] in KEEPS_STANDARD_NAME else None


def _produces(long_name, cell_methods) -> Produces:
    return Produces(long_name, units=_units, cell_methods=cell_methods, standard_name=_standard_name)


# --- checks from metadata (pipeline validate runs them too) --------------------------------------------


def _with_quantiles(x: Meta, q, first: bool) -> Meta:
    """A list ``q`` adds a "quantile" dimension, first (xarray's quantile and weighted quantile) or
    last (resample's and groupby's); one ``q`` a scalar coordinate."""
    if q is None or np.ndim(q) == 0:
        return x
    qs = pd.Index(np.asarray(q, dtype=np.float64), name="quantile")
    dims = ("quantile", *x.dims) if first else (*x.dims, "quantile")
    return replace(x, dims=dims, sizes={**x.sizes, "quantile": len(qs)}, indexes={**x.indexes, "quantile": qs})


def periods(index: pd.Index, freq: str) -> pd.Index:
    """The labels of the periods of ``freq`` that xarray's resample gives dates ``index``
    (datetime64 or cftime), empty periods included; ValueError or TypeError where it refuses."""
    if isinstance(index, pd.DatetimeIndex):
        return pd.Series(np.arange(index.size), index=index).groupby(pd.Grouper(freq=freq)).size().index
    from xarray.core.resample_cftime import CFTimeGrouper

    return CFTimeGrouper(freq=freq).first_items(index)[0].index


def _resample_check(x: Meta, freq, how, q, dim):
    index = _dates_in_order(x, dim)
    try:
        labels = periods(index, freq)
    except (ValueError, TypeError, AttributeError) as e:
        raise InputError(f"freq: {freq!r} is not a frequency xarray resamples dimension {dim!r} of {x.name!r} by "
                         f"({e})") from None
    return _with_quantiles(_new_dim(x, dim, dim, labels), q, first=False)


def group_labels(x: Meta, group: str) -> tuple[str, str, np.ndarray]:
    """The dimension ``group`` runs along, the name of the result's dimension, and the label of
    every step along it (NaN or None where a step is in no group, as a missing date is in none)."""
    if group in x.coords:
        if group in x.indexes:
            return group, group, np.asarray(x.indexes[group])
        values = np.asarray(x.values[group]()) if group in x.values else None
        along = [d for d in x.dims if values is not None and values.ndim == 1 and x.sizes[d] == values.size]
        if not along:
            raise InputError(f"group: coordinate {group!r} of {x.name!r} does not run along one of its dimensions "
                             f"({', '.join(x.dims)}); groupby takes a 1-D coordinate")
        return along[0], group, values
    dim, _, part = group.partition(".")
    index = x.indexes.get(dim)
    if part and index is not None and (isinstance(index, pd.DatetimeIndex) or index.dtype == object):
        if part not in DATE_PARTS:
            close = difflib.get_close_matches(part, DATE_PARTS, n=1)
            hint = f"; did you mean {dim}.{close[0]}?" if close else ""
            raise InputError(f"group: {group!r}: dates have no part {part!r}{hint} "
                             f"(parts: {', '.join(f'{dim}.{p}' for p in DATE_PARTS)})")
        months = part == "season"
        attr = "month" if months else part
        if isinstance(index, pd.DatetimeIndex):  # pandas' names (cftime's are xarray's)
            attr = {"dayofyear": "day_of_year", "dayofweek": "day_of_week"}.get(attr, attr)
        labels = np.asarray(getattr(index, attr), dtype=np.float64)
        if months:  # as xarray's time.season
            seasons = np.array(["DJF", "MAM", "JJA", "SON"], dtype=object)
            return dim, part, np.where(np.isnan(labels), None, seasons[np.nan_to_num(labels).astype(int) // 3 % 4])
        return dim, part, labels
    dates = [d for d, i in x.indexes.items() if isinstance(i, pd.DatetimeIndex) or i.dtype == object]
    parts = f"{dates[0]}.month, {dates[0]}.season, {dates[0]}.dayofyear" if dates else "none: no dimension of dates"
    raise InputError(f"group: {group!r} is neither a coordinate of {x.name!r} ({', '.join(sorted(x.coords)) or 'none'}) nor "
                     f"a part of its dates ({parts}, ...)")


def _groupby_check(x: Meta, group, how, q):
    dim, name, labels = group_labels(x, group)
    present = pd.Index(labels).dropna().unique().sort_values()
    if not len(present):
        raise InputError(f"group: {group!r}: every step of {x.name!r} is in no group (missing dates or labels)")
    return _with_quantiles(_new_dim(x, dim, name, present.rename(name)), q, first=False)


def _rolling_check(x: Meta, window, how, dim, center, min_periods):
    _axis(x, dim)
    if window > x.sizes[dim]:
        raise InputError(f"window: {window} steps is longer than dimension {dim!r} of variable {x.name!r} "
                         f"({x.sizes[dim]} steps); give a window of at most {x.sizes[dim]}")
    return x


def _coarsen_check(x: Meta, factors, how, boundary):
    sizes = dict(x.sizes)
    for dim, f in factors.items():
        _axis(x, dim)
        n = x.sizes[dim]
        if f > n:
            raise InputError(f"factors.{dim}: {f} exceeds the size of dimension {dim!r} of {x.name!r} ({n})")
        if boundary == "exact" and n % f:
            raise InputError(f"factors.{dim}: {f} does not divide dimension {dim!r} of {x.name!r} ({n} steps); "
                             "set boundary: trim (drop the last steps) or pad (a last, partial block)")
        sizes[dim] = -(-n // f) if boundary == "pad" else n // f
    return replace(x, sizes=sizes, indexes={d: i for d, i in x.indexes.items() if d not in factors})


def _weights_check(x: Meta, weights) -> None:
    if isinstance(weights, str) and weights != "coslat" and weights in x.values:
        w = np.asarray(x.values[weights](), dtype=np.float64)
        if np.isnan(w).any():
            raise InputError(f"weights: coordinate {weights!r} of {x.name!r} has missing values (NaN); "
                             "xarray's weighted refuses them")


def _weighted_check(x: Meta, how, q, weights, dims):
    out = _weighted_mean(x, dims, weights)
    _weights_check(x, weights)
    return _with_quantiles(out, q, first=True)


def _reduce_check(x: Meta, dims, how, q):
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    for d in dims:
        _axis(x, d)
    return _with_quantiles(_without(x, dims), q, first=True)


def _data_array(x) -> xr.DataArray:
    """``x``, float16 data as float32: as every op computes them (NumPy's float16 reductions
    accumulate in float32, and xarray's would give float16 results)."""
    if not isinstance(x, xr.DataArray):
        raise InputError(f"expected an xarray.DataArray, got {type(x).__name__}")
    return x.astype(np.float32) if x.dtype == np.float16 else x


# --- resample ---------------------------------------------------------------------------------------


@register(
    kernels=(),
    produces=_produces(lambda x, p: f"{period(p['freq'])} {_what(x, p)} of {input_name(x)}",
                       lambda x, p: f"{p['dim']}: {_method(p)}"),
    check=_resample_check,
)
def resample(x: xr.DataArray, freq: Frequency, how: _how(REDUCTIONS), q: Q = None, dim: Dim = "time") -> xr.DataArray:
    """A reduction over each period of a frequency, as x.resample({dim: freq}).<how>() (xarray's).

    ``freq`` is any frequency xarray's resample takes (``MS``, ``YS``, ``QS-DEC``, ``7D``), on
    datetime64 or cftime dates; ``how`` one of mean, sum, min, max, std, var, median, count,
    prod, any, all, first, last, quantile (with ``q``).
    """
    x = _data_array(x)
    p = _validated(resample.op, freq=freq, how=how, q=q, dim=dim)
    _checked(resample.op, x, **p)
    return _reduced(x.resample({dim: freq}), how, p["q"])


# --- groupby ----------------------------------------------------------------------------------------


def _group_dim(x: xr.DataArray, group: str) -> str:
    return str(x[group].dims[0]) if group in x.coords else group.partition(".")[0]


@register(
    kernels=(),
    produces=_produces(lambda x, p: f"{_what(x, p)} of {input_name(x)} by {p['group']}",
                       lambda x, p: f"{_group_dim(x, p['group'])}: {_method(p)} (comment: grouped by {p['group']})"),
    check=_groupby_check,
)
def groupby(x: xr.DataArray, group: Dim, how: _how(REDUCTIONS), q: Q = None) -> xr.DataArray:
    """A reduction over each group, as x.groupby(group).<how>() (xarray's).

    ``group`` is a part of the dates (``time.month``, ``time.season``, ``time.dayofyear``,
    ``time.year``) or a coordinate's name; ``how`` as for resample. The groups become a
    dimension named after the part or the coordinate, labelled in order.
    """
    x = _data_array(x)
    p = _validated(groupby.op, group=group, how=how, q=q)
    _checked(groupby.op, x, **p)
    if group in x.coords and group not in x.indexes:
        # labels, not data: xarray finds the groups on the host, and refuses a lazy coordinate
        x = x.assign_coords({group: x[group].copy(data=to_numpy(x[group].data))})
    return _reduced(x.groupby(group), how, p["q"])


# --- rolling ----------------------------------------------------------------------------------------


@register(
    kernels=(),
    produces=_produces(
        lambda x, p: f"{p['window']}-step moving {_what(x, p)} of {input_name(x)} along {p['dim']}",
        lambda x, p: f"{p['dim']}: {_method(p)} (comment: moving window of {p['window']} steps, "
        f"{'centred' if p['center'] else 'ending at each step'})",
    ),
    check=_rolling_check,
)
def rolling(
    x: xr.DataArray, window: Count, how: _how(ROLLING), dim: Dim = "time", center: StrictBool = False,
    min_periods: MinPeriods = None,
) -> xr.DataArray:
    """A moving-window reduction, as x.rolling({dim: window}, center, min_periods).<how>() (xarray's).

    ``how``: mean, sum, min, max, std, var, median or count; a result needs ``min_periods``
    valid values in its window (default: the whole window), as in xarray.
    """
    x = _data_array(x)
    p = _validated(rolling.op, window=window, how=how, dim=dim, center=center, min_periods=min_periods)
    _checked(rolling.op, x, **p)
    return _reduced(x.rolling({dim: window}, center=center, min_periods=min_periods), how)


# --- coarsen ----------------------------------------------------------------------------------------


@register(
    kernels=(),
    produces=_produces(
        lambda x, p: f"{_what(x, p)} of {input_name(x)} over blocks of "
        + " x ".join(f"{f} {d}" for d, f in p["factors"].items()),
        lambda x, p: f"{cell_names(list(p['factors']))} {_method(p)}",
    ),
    check=_coarsen_check,
)
def coarsen(
    x: xr.DataArray, factors: Annotated[dict[Dim, Count], Field(min_length=1)], how: _how(COARSEN),
    boundary: Boundary = "exact",
) -> xr.DataArray:
    """A reduction over blocks of ``factors`` steps, as x.coarsen(factors, boundary=...).<how>() (xarray's).

    ``boundary``: ``exact`` (each factor divides its dimension), ``trim`` (the last steps that
    fill no block are dropped) or ``pad`` (a last, partial block); ``how``: mean, sum, min, max,
    std, var, median, count, prod, any or all.
    """
    x = _data_array(x)
    p = _validated(coarsen.op, factors=factors, how=how, boundary=boundary)
    _checked(coarsen.op, x, **p)
    return _reduced(x.coarsen(factors, boundary=boundary), how)


# --- weighted ---------------------------------------------------------------------------------------


def _is_area(x: xr.DataArray, p: dict) -> bool:
    """Whether the reduction is over latitude and longitude by cos(latitude): CF's "area"."""
    dims = [p["dims"]] if isinstance(p["dims"], str) else list(p["dims"])
    if not (isinstance(p["weights"], str) and p["weights"] == "coslat") or len(dims) != 2:
        return False
    lat = [d for d in dims if _is_latitude(d, x.coords[d].attrs if d in x.coords else {})]
    lon = [d for d in dims if d not in lat and (d in ("lon", "longitude") or (
        d in x.coords and x.coords[d].attrs.get("standard_name") == "longitude"))]
    return len(lat) == 1 and len(lon) == 1


def _weighted_cell_methods(x: xr.DataArray, p: dict) -> str:
    if _is_area(x, p):
        return f"area: {_method(p)}"
    w = p["weights"]
    comment = "" if w is None else " (comment: weighted by " + (
        "cos(latitude))" if isinstance(w, str) and w == "coslat" else f"{w if isinstance(w, str) else w.name or 'the given weights'})")
    return f"{cell_names(p['dims'])} {_method(p)}{comment}"


def _weighted_long_name(x: xr.DataArray, p: dict) -> str:
    if _is_area(x, p):
        return f"area-weighted {_what(x, p)} of {input_name(x)}"
    dims = [p["dims"]] if isinstance(p["dims"], str) else p["dims"]
    return f"{'weighted ' if p['weights'] is not None else ''}{_what(x, p)} of {input_name(x)} over {', '.join(dims)}"


def _weights_of(x: xr.DataArray, weights) -> xr.DataArray:
    """The weights as a DataArray on ``x``'s backend: cos(latitude) from the latitude coordinate
    (its CF units), a coordinate, the given DataArray, or one for None (equal weights); small, so
    read on the host to refuse missing values, as xarray does."""
    if weights is None:  # equal weights
        w = xr.DataArray(np.float64(1.0))
    elif isinstance(weights, str) and weights == "coslat":
        lat = next(c for n, c in x.coords.items() if _is_latitude(str(n), c.attrs))  # the checks found one
        radians = latitude_radians(x.name, lat.name, lat.attrs, to_numpy(lat.data))
        # a latitude rounded past a pole gives a cosine a hair below zero
        w = xr.DataArray(np.maximum(np.cos(radians), 0.0), dims=lat.dims)
    else:
        w = x.coords[weights] if isinstance(weights, str) else weights
        w = xr.DataArray(np.asarray(to_numpy(w.data), dtype=np.float64), dims=w.dims)
    if np.isnan(w.values).any():
        raise InputError("weights contain missing values (NaN); fill them first, as xarray requires")
    # in the data's precision, as weighted_mean's: float64 weights would make float32 data's results float64
    dtype = x.dtype if x.dtype.kind == "f" else np.float64
    return w.copy(data=module(backend_of(x)).asarray(w.values, dtype=dtype))


@register(
    kernels=(),
    produces=_produces(_weighted_long_name, _weighted_cell_methods),
    check=_weighted_check,
)
def weighted(
    x: xr.DataArray, how: _how(WEIGHTED), q: Q = None, weights: Weights = "coslat", dims: Dims = ("lat", "lon"),
) -> xr.DataArray:
    """A weighted reduction over dimensions, as x.weighted(w).<how>(dims) (xarray's).

    ``weights``: ``coslat`` (cos(latitude) of the latitude coordinate), a coordinate's name, a
    DataArray, or None (equal weights); ``how``: mean, sum, std, var or quantile (with ``q``).
    """
    x = _data_array(x)
    p = _validated(weighted.op, how=how, q=q, weights=weights, dims=dims)
    _checked(weighted.op, x, **p)
    w = _weights_of(x, weights)
    if how == "quantile":
        x = _whole_along(x, p["dims"])
    return _reduced(x.weighted(w), how, p["q"], dim=p["dims"])


# --- reduce -----------------------------------------------------------------------------------------


@register(
    kernels=(),
    produces=_produces(
        lambda x, p: f"{_what(x, p)} of {input_name(x)} over "
        + ", ".join([p["dims"]] if isinstance(p["dims"], str) else p["dims"]),
        lambda x, p: f"{cell_names(p['dims'])} {_method(p)}",
    ),
    check=_reduce_check,
)
def reduce(x: xr.DataArray, dims: Dims, how: _how(PLAIN), q: Q = None) -> xr.DataArray:
    """A reduction over dimensions, as x.<how>(dims) (xarray's).

    ``how``: mean, sum, min, max, std, var, median, count, prod, any, all or quantile (with ``q``).
    """
    x = _data_array(x)
    p = _validated(reduce.op, dims=dims, how=how, q=q)
    _checked(reduce.op, x, **p)
    if how == "quantile":
        x = _whole_along(x, p["dims"])
    return _reduced(x, how, p["q"], dim=p["dims"])
