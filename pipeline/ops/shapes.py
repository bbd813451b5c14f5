"""Each op's data checks and the look of its result, from dimensions, sizes, coordinates and
attributes alone: ``pipeline validate`` checks a flow against a store's metadata without building
a graph, so without importing dask.array.

xarray imports dask.array (where it is installed) as soon as it wraps a NumPy array, so the checks
hold no xarray object: a :class:`Meta` holds a variable's dimensions and sizes, the indexes of its
dimension coordinates (pandas, as xarray opened them, nothing read), the names and attributes of
its coordinates and its own attributes. :func:`check` runs an op's checks on its input's Meta
and returns its result's Meta, so the steps of a flow are checked in a chain as its graph would be
built; the ops run the same checks on their input as they build their graphs, so each check and
its message live here alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..errors import InputError
from .metadata import SAME
from .params import TO_KELVIN, check_threshold, parse_quantity
from .registry import Op


@dataclass(frozen=True)
class Meta:
    """What the checks know of a variable: ``coords`` maps each coordinate's name to its
    attributes, ``indexes`` each dimension coordinate to its pandas index."""

    name: str | None
    dims: tuple[str, ...]
    sizes: dict[str, int]
    coords: dict[str, dict] = field(default_factory=dict)
    indexes: dict[str, pd.Index] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


def meta_of(ds, name: str | None = None) -> Meta:
    """The Meta of variable ``name`` of a dataset opened lazily by xarray (nothing is read), or
    of the DataArray ``ds`` itself where no name is given (an op's input, as it builds its graph)."""
    v = ds if name is None else ds[name]
    return Meta(
        v.name, tuple(map(str, v.dims)), {str(d): int(n) for d, n in v.sizes.items()},
        coords={str(k): dict(c.attrs) for k, c in v.coords.items()},
        indexes={str(k): v.indexes[k] for k in v.dims if k in v.indexes},
        attrs=dict(v.attrs),
    )


def _axis(x: Meta, dim: str) -> None:
    if dim not in x.dims:
        raise InputError(f"variable {x.name!r} has no dimension {dim!r} (its dimensions: {', '.join(x.dims)})")


def _without(x: Meta, dims) -> Meta:
    return replace(x, dims=tuple(d for d in x.dims if d not in dims),
                   sizes={d: n for d, n in x.sizes.items() if d not in dims},
                   indexes={d: i for d, i in x.indexes.items() if d not in dims})


def _new_dim(x: Meta, dim: str, name: str, index: pd.Index) -> Meta:
    dims = tuple(name if d == dim else d for d in x.dims)
    out = _without(x, (dim,))
    return replace(out, dims=dims, sizes={d: len(index) if d == name else x.sizes[d] for d in dims},
                   indexes={**out.indexes, name: index}, coords={**out.coords, name: {}})


def _dates(x: Meta, dim: str) -> pd.Index:
    _axis(x, dim)
    index = x.indexes.get(dim)
    if index is None or not (isinstance(index, pd.DatetimeIndex) or index.dtype == object):
        kind = "no coordinate" if index is None else index.dtype
        raise InputError(f"dimension {dim!r} of {x.name!r} must hold dates (datetime64 or cftime), got {kind}")
    return index


def _standardized_anomaly(x, dim):
    _axis(x, dim)
    return x


def _rolling_mean(x, dim, window, **_):
    _axis(x, dim)
    if window > x.sizes[dim]:
        raise InputError(
            f"window: {window} steps is longer than dimension {dim!r} of variable {x.name!r} ({x.sizes[dim]} steps); "
            f"give a window of at most {x.sizes[dim]}"
        )
    return x


def _is_latitude(name: str, attrs: dict) -> bool:
    return (name in ("lat", "latitude") or attrs.get("standard_name") == "latitude"
            or attrs.get("units") in ("degrees_north", "degree_north"))


def _weighted_mean(x, dims, weights):
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    for d in dims:
        _axis(x, d)
    if isinstance(weights, str) and weights == "coslat" and not any(_is_latitude(k, a) for k, a in x.coords.items()):
        raise InputError(
            f"weights='coslat' needs a latitude coordinate on {x.name!r} "
            "(named lat or latitude, or with standard_name 'latitude')"
        )
    if isinstance(weights, str) and weights != "coslat" and weights not in x.coords:
        raise InputError(
            f"weights must be 'coslat', the name of a coordinate of {x.name!r}, a DataArray or None; got {weights!r}"
        )
    return _without(x, dims)


def _coarsen_mean(x, factors):
    sizes = dict(x.sizes)
    for dim, f in factors.items():
        _axis(x, dim)
        if f > x.sizes[dim]:
            raise InputError(f"coarsening factor of dimension {dim!r} ({f}) exceeds its size ({x.sizes[dim]})")
        sizes[dim] = x.sizes[dim] // f
    return replace(x, sizes=sizes, indexes={d: i for d, i in x.indexes.items() if d not in factors})


def _detrend(x, dim, deg):
    _axis(x, dim)
    if x.sizes[dim] <= deg:
        raise InputError(
            f"deg: a polynomial of degree {deg} needs at least {deg + 1} steps along dimension {dim!r}; "
            f"variable {x.name!r} has {x.sizes[dim]}"
        )
    return x


def _quantile(x, q, dim):
    _axis(x, dim)
    out = _without(x, (dim,))
    if np.ndim(q) == 0:
        return out
    qs = pd.Index(np.asarray(q, dtype=np.float64), name="quantile")
    return replace(out, dims=("quantile", *out.dims), sizes={"quantile": len(qs), **out.sizes},
                   indexes={**out.indexes, "quantile": qs})


def _saturation_vapor_pressure(x, method):
    return x


def _groups(x: Meta, freq: str, dim: str) -> pd.Index:
    _axis(x, dim)
    if freq not in ("month", "dayofyear"):
        raise InputError(f"freq must be 'month' or 'dayofyear', got {freq!r}")
    index = _dates(x, dim)
    attr = "day_of_year" if freq == "dayofyear" and isinstance(index, pd.DatetimeIndex) else freq  # cftime: dayofyear
    return pd.Index(np.unique(np.asarray(getattr(index, attr), dtype=np.int64)), name=freq)


def _climatology(x, freq, dim):
    return _new_dim(x, dim, freq, _groups(x, freq, dim))


def _anomaly(x, freq, dim):
    _groups(x, freq, dim)
    return x


def threshold_in_units_of(x, threshold: float | str) -> float:
    """A threshold in the units of ``x`` (a DataArray or a Meta): a number is taken as is;
    ``"25 degC"`` is converted, as xclim's quantities are, for temperatures in K, degC or degF."""
    try:
        threshold = check_threshold(threshold)
        if not isinstance(threshold, str):
            return threshold
        value, units = parse_quantity(threshold)
    except ValueError:
        raise InputError(f"threshold must be a number or a temperature such as '25 degC', got {threshold!r}") from None
    data_units = x.attrs.get("units")
    if data_units not in TO_KELVIN:
        raise InputError(f"threshold {threshold!r} has units but {x.name!r} has units {data_units!r} (expected K, degC or degF)")
    scale, offset = TO_KELVIN[units]
    kelvin = value * scale + offset
    scale, offset = TO_KELVIN[data_units]
    return (kelvin - offset) / scale


def _binned(x, freq, dim, threshold=None, **_):
    index = _dates(x, dim)
    if threshold is not None:
        threshold_in_units_of(x, threshold)
    try:
        bins = pd.Series(np.arange(index.size), index=index).groupby(pd.Grouper(freq=freq)).size().index
    except (ValueError, TypeError) as e:
        raise InputError(f"freq {freq!r} is not a pandas frequency for dimension {dim!r} of {x.name!r}: {e}") from None
    return _new_dim(x, dim, dim, bins)


CHECKS: dict[str, Callable[..., Meta]] = {
    "standardized_anomaly": _standardized_anomaly,
    "weighted_mean": _weighted_mean,
    "rolling_mean": _rolling_mean,
    "coarsen_mean": _coarsen_mean,
    "detrend": _detrend,
    "quantile": _quantile,
    "saturation_vapor_pressure": _saturation_vapor_pressure,
    "climatology": _climatology,
    "anomaly": _anomaly,
    "resample_mean": _binned,
    "count_above": _binned,
    "max_spell_length": _binned,
}


def _units(op: Op, x: Meta, params: dict):
    """The result's units where the op declares them as text (a threshold's check needs them)."""
    units = op.produces.units if op.produces is not None else SAME
    if units is SAME:
        return x.attrs.get("units")
    return units.format(**params) if isinstance(units, str) else None


def check(op: Op, x: Meta, params: dict) -> Meta | None:
    """The Meta of ``op``'s result on ``x``, after the op's data checks (InputError as the op
    raises it while building its graph); None where the op has no checks from metadata."""
    rule = CHECKS.get(op.name)
    if rule is None:
        return None
    out = rule(x, **params)
    units = _units(op, x, params)
    return replace(out, attrs={} if units is None else {"units": units})
