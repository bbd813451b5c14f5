"""What each op's result is, in CF terms: ``units``, ``long_name``, ``cell_methods`` and, where it
still holds, ``standard_name``.

Each op declares one :class:`Produces` when it registers (``@register(..., produces=...)``) and
the registry applies it to every result, as xclim's indicators set their output attributes: the
input's attributes are not copied, since an anomaly of air temperature is no longer an air
temperature and a count of hot days has no temperature units. ``cell_methods`` is appended to the
input's, in CF syntax (CF conventions, section 7.3; ``within years``/``over years`` for
climatologies, section 7.4).

A field of :class:`Produces` is a template, formatted with ``name`` (the input's ``long_name``,
or its variable name), ``units`` (the input's units) and the op's parameters; or a function of
the input and the parameters, where the text depends on the data (is the step one day?) or on
the kind of a parameter.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np
import pandas as pd
import xarray as xr

SAME = object()
"""As the input's (its units, its standard_name)."""

Text = Union[str, Callable[[xr.DataArray, dict], "str | None"]]


@dataclass(frozen=True)
class Produces:
    """The attributes of an op's result; see the module's docstring for the templates."""

    long_name: Text
    units: Text | object = SAME
    cell_methods: Text = ""  # appended to the input's
    standard_name: Text | object | None = SAME  # None: dropped
    extra: Callable[[xr.DataArray, dict], dict] | None = None  # further attributes, such as a threshold

    def attrs(self, x: xr.DataArray, params: dict[str, Any]) -> dict[str, Any]:
        """The result's attributes, from the input ``x`` and the op's ``params``."""
        params = _axes_found(x, params)
        out = {}
        standard_name = x.attrs.get("standard_name") if self.standard_name is SAME else _text(self.standard_name, x, params)
        if standard_name:
            out["standard_name"] = standard_name
        out["long_name"] = _text(self.long_name, x, params)
        units = x.attrs.get("units") if self.units is SAME else _text(self.units, x, params)
        if units is not None:
            out["units"] = units
        methods = " ".join(m for m in (x.attrs.get("cell_methods", ""), _text(self.cell_methods, x, params)) if m)
        if methods:
            out["cell_methods"] = methods
        if self.extra is not None:
            out.update(self.extra(x, params))
        return out


def _axes_found(x: xr.DataArray, params: dict) -> dict:
    """``params`` with the default axis names in ``dim``/``dims`` that ``x`` lacks replaced by the
    dimensions the op found for them (:func:`pipeline.ops.axes.resolve`), so that a result of
    ERA5's data says "valid_time: mean", as its op computed it."""
    from .axes import resolve_dims

    if not isinstance(x, xr.DataArray):
        return params
    return {k: resolve_dims(x, v, k) if k in ("dim", "dims") and v is not None else v for k, v in params.items()}


def _text(field: Text | None, x: xr.DataArray, params: dict) -> str | None:
    if field is None or callable(field):
        return field(x, params) if field is not None else None
    return field.format(name=input_name(x), units=x.attrs.get("units"), **params)


def input_name(x: xr.DataArray) -> str:
    """How a result's long_name refers to its input: its long_name, else its variable name."""
    return str(x.attrs.get("long_name") or x.name or "the input")


# --- helpers for the ops' rules -------------------------------------------------------------------


def is_daily(x: xr.DataArray, dim: str) -> bool:
    """Whether the steps along ``dim`` are exactly one day apart (datetime64 or cftime dates)."""
    if dim not in x.coords or x.sizes[dim] < 2:
        return False
    steps = np.diff(x[dim].values)
    try:
        steps = pd.to_timedelta(steps)
    except (TypeError, ValueError):
        return False
    return bool((steps == datetime.timedelta(days=1)).all())


_PERIODS = {"Y": "yearly", "YS": "yearly", "A": "yearly", "AS": "yearly", "Q": "quarterly", "QS": "quarterly",
            "M": "monthly", "ME": "monthly", "MS": "monthly", "W": "weekly", "D": "daily", "h": "hourly", "H": "hourly"}


def period(freq: str) -> str:
    """``"YS"`` as "yearly", ``"MS"`` as "monthly"; other frequencies as "per {freq} period"."""
    from pandas.tseries.frequencies import to_offset

    offset = to_offset(freq)
    base = offset.rule_code.split("-")[0]
    if offset.n == 1 and base in _PERIODS:
        return _PERIODS[base]
    return f"per {freq} period"


def group_name(freq: str) -> str:
    """The groups of a climatology: "monthly", "day-of-year" or "seasonal"."""
    return {"month": "monthly", "dayofyear": "day-of-year", "season": "seasonal"}.get(freq, freq)


def cell_names(dims) -> str:
    """``["lat", "lon"]`` as "lat: lon:", the names part of a CF cell method."""
    return " ".join(f"{d}:" for d in ([dims] if isinstance(dims, str) else dims))


def steps_units(days: str = "days"):
    """Units of a count of steps along ``params["dim"]``: ``days`` for daily data, "1" otherwise."""
    return lambda x, p: days if is_daily(x, p["dim"]) else "1"


def on_daily(names: dict[str, str]):
    """A standard_name by the input's, for counts of days: none unless the data are daily."""
    return lambda x, p: names.get(x.attrs.get("standard_name")) if is_daily(x, p["dim"]) else None
