"""Each op's data checks and the look of its result, from dimensions, sizes, coordinates and
attributes alone: ``pipeline validate`` checks a flow against a store's metadata without building
a graph, so without importing dask.array.

xarray imports dask.array (where it is installed) as soon as it wraps a NumPy array, so the checks
hold no xarray object of their own: a :class:`Meta` holds a variable's dimensions and sizes, the
indexes of its dimension coordinates (pandas, as xarray opened them, nothing read), the names and
attributes of its coordinates, its own attributes, and a reader of each coordinate's values (the
variable xarray opened, read only by a check that needs it: the latitudes of coslat weights).
:func:`check` runs an op's checks on its input's Meta (every op refuses an empty dimension) and
returns its result's Meta, so the steps of a flow are checked in a chain as its graph would be
built; the ops run the same checks on their input as they build their graphs, so each check and
its message live here alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..errors import InputError
from .axes import resolve, resolve_dims
from .metadata import SAME
from .params import TO_KELVIN, check_threshold, parse_quantity
from .registry import Op


@dataclass(frozen=True)
class Meta:
    """What the checks know of a variable: ``coords`` maps each coordinate's name to its
    attributes, ``indexes`` each dimension coordinate to its pandas index, ``values`` each
    coordinate to a function that reads its values (as NumPy), for the checks that need them."""

    name: str | None
    dims: tuple[str, ...]
    sizes: dict[str, int]
    coords: dict[str, dict] = field(default_factory=dict)
    indexes: dict[str, pd.Index] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Callable[[], np.ndarray]] = field(default_factory=dict)


def meta_of(ds, name: str | None = None) -> Meta:
    """The Meta of variable ``name`` of a dataset opened lazily by xarray (nothing is read), or
    of the DataArray ``ds`` itself where no name is given (an op's input, as it builds its graph)."""
    v = ds if name is None else ds[name]
    return Meta(
        v.name, tuple(map(str, v.dims)), {str(d): int(n) for d, n in v.sizes.items()},
        coords={str(k): dict(c.attrs) for k, c in v.coords.items()},
        indexes={str(k): v.indexes[k] for k in v.dims if k in v.indexes},
        attrs=dict(v.attrs),
        values={str(k): partial(_host_values, c.variable) for k, c in v.coords.items()},
    )


def _host_values(variable) -> np.ndarray:
    """A coordinate's values on the host, read only when a check asks (a 2-D latitude may be large)."""
    from ..backend import to_numpy

    return np.asarray(to_numpy(variable.data))


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
    # resampled dates keep their coordinate's attributes (as xarray's), so a later step finds the axis
    attrs = dict(x.coords.get(dim, {})) if name == dim else {}
    return replace(out, dims=dims, sizes={d: len(index) if d == name else x.sizes[d] for d in dims},
                   indexes={**out.indexes, name: index}, coords={**out.coords, name: attrs})


def _dates(x: Meta, dim: str) -> pd.Index:
    _axis(x, dim)
    index = x.indexes.get(dim)
    if index is None or not (isinstance(index, pd.DatetimeIndex) or index.dtype == object):
        kind = "no coordinate" if index is None else index.dtype
        raise InputError(f"dimension {dim!r} of {x.name!r} must hold dates (datetime64 or cftime), got {kind}")
    return index


def _listed(values, n: int = 4) -> str:
    values = list(values)
    return ", ".join(map(str, values[:n])) + (f" ... ({len(values)} in all)" if len(values) > n else "")


def _dates_in_order(x: Meta, dim: str) -> pd.Index:
    """The dates along ``dim``, which resampling bins as consecutive periods: refused where they are
    missing (NaT) or out of order, as xarray's ``resample`` refuses them (binned by position, they
    would put steps in the wrong periods)."""
    index = _dates(x, dim)
    missing = np.flatnonzero(pd.isna(index))
    if missing.size:
        raise InputError(
            f"variable {x.name!r}: time coordinate {dim!r} has missing dates (NaT) at step{'s' * (missing.size > 1)} "
            f"{_listed(missing)}; resampling, as xarray's resample, needs a date at every step: drop those steps first"
        )
    if not index.is_monotonic_increasing:
        values = np.asarray(index)
        i = int(np.flatnonzero(values[1:] < values[:-1])[0]) + 1
        raise InputError(
            f"variable {x.name!r}: time coordinate {dim!r} is not in increasing order (step {i}, {index[i]}, comes "
            f"after {index[i - 1]}); resampling, as xarray's resample, needs dates in increasing order: "
            f"sort them first (xarray: x.sortby({dim!r}))"
        )
    return index


def _standardized_anomaly(x, dim):
    _axis(x, resolve(x, dim))
    return x


def _rolling_mean(x, dim, window, **_):
    dim = resolve(x, dim)
    _axis(x, dim)
    if window > x.sizes[dim]:
        raise InputError(
            f"window: {window} steps is longer than dimension {dim!r} of variable {x.name!r} ({x.sizes[dim]} steps); "
            f"give a window of at most {x.sizes[dim]}"
        )
    return x


# CF's units of latitude (CF conventions, section 4.1), and the units of angles UDUNITS reads
DEGREES_NORTH = ("degrees_north", "degree_north", "degrees_N", "degree_N", "degreesN", "degreeN")
DEGREES = (*DEGREES_NORTH, "degrees", "degree", "deg")
RADIANS = ("radians", "radian", "rad")


def _is_latitude(name: str, attrs: dict) -> bool:
    return name in ("lat", "latitude") or attrs.get("standard_name") == "latitude" or attrs.get("units") in DEGREES_NORTH


def latitude_radians(variable, name: str, attrs: dict, values) -> np.ndarray:
    """The latitudes ``values`` of coordinate ``name`` (with ``attrs``) of ``variable`` in radians,
    as float64, from their CF units: degrees north (also where no units are given) or radians.
    InputError naming the coordinate where the units are not those of a latitude or a value is
    not one (not finite, or beyond the poles: cos(latitude) would weigh it below zero)."""
    units = attrs.get("units")
    if units is not None and units not in DEGREES + RADIANS:
        raise InputError(
            f"latitude coordinate {name!r} of {variable!r} has units {units!r}; weights='coslat' expects "
            f"latitudes in degrees_north (or {', '.join(DEGREES[1:])}) or in radians"
        )
    values = np.asarray(values)
    radians = units in RADIANS
    # the pole in the coordinate's own type: a float32 pi/2 lies a hair above float64's
    pole = np.asarray(np.pi / 2 if radians else 90.0, dtype=values.dtype if values.dtype.kind == "f" else np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (np.abs(values) > pole)
    if bad.any():
        bounds = "[-pi/2, pi/2] radians" if radians else f"[-90, 90] {units or 'degrees_north'}"
        raise InputError(
            f"latitude coordinate {name!r} of {variable!r} holds values that are not latitudes (finite, within "
            f"{bounds}): {_listed(np.unique(values[bad]))}"
        )
    values = values.astype(np.float64)
    return values if radians else np.deg2rad(values)


def _weighted_mean(x, dims, weights):
    dims = resolve_dims(x, dims)
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    for d in dims:
        _axis(x, d)
    if isinstance(weights, str) and weights == "coslat":
        lat = next((k for k, a in x.coords.items() if _is_latitude(k, a)), None)
        if lat is None:
            raise InputError(
                f"weights='coslat' needs a latitude coordinate on {x.name!r} "
                "(named lat or latitude, or with standard_name 'latitude')"
            )
        if lat in x.values:
            latitude_radians(x.name, lat, x.coords[lat], x.values[lat]())
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
    dim = resolve(x, dim)
    _axis(x, dim)
    index = x.indexes.get(dim)
    missing = np.flatnonzero(pd.isna(index)) if index is not None else ()
    if len(missing):  # the trend is fitted against the coordinate: a step without one has no place
        raise InputError(
            f"variable {x.name!r}: coordinate {dim!r} has missing values at step{'s' * (len(missing) > 1)} "
            f"{_listed(missing)}; detrend fits its trend against that coordinate (xarray's polyfit fails there too): "
            "drop those steps first"
        )
    if x.sizes[dim] <= deg:
        raise InputError(
            f"deg: a polynomial of degree {deg} needs at least {deg + 1} steps along dimension {dim!r}; "
            f"variable {x.name!r} has {x.sizes[dim]}"
        )
    return x


def _quantile(x, q, dim):
    dim = resolve(x, dim)
    _axis(x, dim)
    out = _without(x, (dim,))
    if np.ndim(q) == 0:
        return out
    qs = pd.Index(np.asarray(q, dtype=np.float64), name="quantile")
    return replace(out, dims=("quantile", *out.dims), sizes={"quantile": len(qs), **out.sizes},
                   indexes={**out.indexes, "quantile": qs})


def _saturation_vapor_pressure(x, method):
    return x


SEASONS = np.array(["DJF", "JJA", "MAM", "SON"])
"""xarray's ``time.season`` groups, in the order of its groupby (sorted by name)."""
_SEASON_OF_MONTH = np.array([0, 0, 2, 2, 2, 1, 1, 1, 3, 3, 3, 0])  # January..December -> SEASONS


def group_labels(index: pd.Index, freq: str) -> np.ndarray:
    """The month, day of year or season (its place in :data:`SEASONS`) of every date of
    ``index``, on any calendar, and -1 for a missing date (NaT): in no group, as in xarray's groupby."""
    attr = "month" if freq == "season" else freq
    attr = "day_of_year" if attr == "dayofyear" and isinstance(index, pd.DatetimeIndex) else attr  # cftime: dayofyear
    labels = np.asarray(getattr(index, attr), dtype=np.float64)  # NaN for NaT
    labels = np.where(np.isnan(labels), -1, labels).astype(np.int64)
    return np.where(labels < 0, -1, _SEASON_OF_MONTH[labels - 1]) if freq == "season" else labels


def group_values(freq: str, groups: np.ndarray) -> np.ndarray:
    """The coordinate of the groups ``groups`` (labels of :func:`group_labels`): the labels
    themselves, or the seasons' names."""
    return SEASONS[groups] if freq == "season" else groups


def _groups(x: Meta, freq: str, dim: str) -> pd.Index:
    _axis(x, dim)
    if freq not in ("month", "dayofyear", "season"):
        raise InputError(f"freq must be 'month', 'dayofyear' or 'season', got {freq!r}")
    labels = group_labels(_dates(x, dim), freq)
    if (labels < 0).all():
        raise InputError(f"variable {x.name!r}: time coordinate {dim!r} has no dates (every step is NaT)")
    return pd.Index(group_values(freq, np.unique(labels[labels >= 0])), name=freq)


def _climatology(x, freq, dim):
    dim = resolve(x, dim)
    return _new_dim(x, dim, freq, _groups(x, freq, dim))


def _anomaly(x, freq, dim):
    _groups(x, freq, resolve(x, dim))
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


def resample_bins(x, freq: str, dim: str) -> tuple[np.ndarray, pd.Index]:
    """The period of every date along ``dim`` of ``x`` (a Meta) and the label of every period
    (empty ones included), as xarray's ``resample({dim: freq})`` makes them, on any calendar:
    xarray's own binning (a pandas Grouper on dates, its CFTimeGrouper on cftime dates).
    InputError where ``freq`` is no frequency for these dates (cftime has no business days)."""
    from xarray.groupers import TimeResampler

    index = _dates_in_order(x, dim)
    resampler = TimeResampler(freq)
    try:
        # what TimeResampler.factorize does, on the index alone: factorize needs a DataArray,
        # which would import dask.array into `pipeline validate`
        resampler._init_properties(index)
        first, codes = resampler.first_items()
    except Exception as e:  # pandas' and xarray's parsers raise ValueError, KeyError, IndexError...
        calendar = getattr(index, "calendar", "standard")
        raise InputError(
            f"freq {freq!r} is not a pandas frequency for dimension {dim!r} of {x.name!r} "
            f"(dates of the {calendar} calendar): {e}"
        ) from None
    return np.asarray(codes, dtype=np.int64), first.index.rename(dim)


def _binned(x, freq, dim, threshold=None, **_):
    dim = resolve(x, dim)
    _dates_in_order(x, dim)
    if threshold is not None:
        threshold_in_units_of(x, threshold)
    return _new_dim(x, dim, dim, resample_bins(x, freq, dim)[1])


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
    empty = [d for d in x.dims if x.sizes[d] == 0]
    if empty:  # every op reduces or maps along its dimensions: on none, it has nothing to give
        sizes = ", ".join(f"{d}: {n}" for d, n in x.sizes.items())
        raise InputError(f"variable {x.name!r} is empty: its dimension {empty[0]!r} has size 0 ({sizes})")
    rule = CHECKS.get(op.name) or op.check
    if rule is None:
        return None
    out = rule(x, **params)
    units = _units(op, x, params)
    return replace(out, attrs={} if units is None else {"units": units})
