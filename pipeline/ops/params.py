"""Parameter types of the ops: what a flow's ``steps[i].params`` may hold, checked before any data
is read.

The ops' signatures use these annotations, and :mod:`pipeline.ops.registry` builds each op's
pydantic model from them, so ``pipeline validate`` refuses a zero window, a quantile of 1.5 or a
threshold that does not parse, naming the key. Counts and sizes are strict integers (``true`` is not
a window of 1, ``2.0`` is not a degree); NumPy integers from Python callers are taken as ints.
What only the data can tell (a window longer than the series) is checked by the op itself when it
builds its graph.
"""

from __future__ import annotations

import re
from typing import Annotated

import numpy as np
import xarray as xr
from pydantic import (
    AfterValidator, BeforeValidator, Field, PlainSerializer, PlainValidator, TypeAdapter, ValidationError, ValidationInfo,
)
from pydantic_core import PydanticCustomError


def invalid(message: str) -> PydanticCustomError:
    """A ValueError that pydantic reports as ``message`` alone (no "Value error, " before it)."""
    return PydanticCustomError("value_error", "{message}", {"message": message})


def _numpy_scalar(v):
    """NumPy integer and float scalars as Python ones, so that strict types take them."""
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


Count = Annotated[int, BeforeValidator(_numpy_scalar), Field(gt=0, strict=True)]
"""A positive number of steps, points or a factor: window, min_periods, coarsening factors."""


def _within_window(v, info: ValidationInfo):
    window = info.data.get("window")
    if v is not None and window is not None and v > window:
        raise invalid(f"expected at most window ({window}) valid values, got {v}")
    return v


MinPeriods = Annotated[Count | None, AfterValidator(_within_window)]
"""The fewest valid values in a window that give a result: a count not above ``window``, which the
op's parameters list before it; None: the whole window."""

Degree = Annotated[int, BeforeValidator(_numpy_scalar), Field(ge=0, strict=True)]
"""A non-negative integer: a polynomial degree."""

Fraction = Annotated[float, BeforeValidator(_numpy_scalar), Field(ge=0.0, le=1.0, strict=True, allow_inf_nan=False)]
"""A probability in [0, 1]: a quantile."""

def _dim(name: str) -> str:
    if not name.strip():
        raise invalid(f"expected the name of a dimension, got {name!r}")
    return name


Dim = Annotated[str, Field(strict=True), AfterValidator(_dim)]
"""The name of a dimension: a string with at least one visible character."""


def _one_or_list(item, what: str):
    """A validator of one ``item`` or a non-empty list of distinct ones, with a single message
    saying what was expected (rather than one per branch of the union)."""
    adapter = TypeAdapter(item)

    def check(v):
        try:
            if not isinstance(v, (list, tuple)):
                return adapter.validate_python(v)
            values = [adapter.validate_python(i) for i in v]
            if values and len(set(values)) == len(values):
                return values
        except ValidationError:
            pass
        raise invalid(f"expected {what}, got {v!r}")

    return PlainValidator(check)


Dims = Annotated[
    str | list[str],
    _one_or_list(Dim, "a dimension name or a non-empty list of distinct ones"),
    # a default given as a tuple (weighted_mean's ("lat", "lon")) dumps as a list, without
    # pydantic's warning that it is not one
    PlainSerializer(lambda v: v if isinstance(v, str) else list(v)),
]
"""One dimension name, or a non-empty list of distinct ones."""

Quantiles = Annotated[float | list[float], _one_or_list(Fraction, "a quantile in [0, 1] or a non-empty list of distinct ones")]
"""One quantile in [0, 1], or a non-empty list of distinct ones."""


def _weights(v):
    if v is None or isinstance(v, xr.DataArray) or (isinstance(v, str) and v.strip()):
        return v
    raise invalid(f"expected 'coslat', the name of a coordinate, a DataArray or null (no weights), got {v!r}")


Weights = Annotated[str | xr.DataArray | None, PlainValidator(_weights)]
"""Weights of a mean: ``"coslat"``, the name of a coordinate, a DataArray, or None (a plain mean)."""


def check_frequency(freq: str) -> str:
    """``freq`` if pandas reads it as a positive frequency (``"YS"``, ``"MS"``, ``"1D"``), as
    ``resample`` needs; ValueError saying what was expected otherwise."""
    from pandas.tseries.frequencies import to_offset

    try:
        offset = to_offset(freq)
    except (ValueError, TypeError) as e:
        suggestion = re.search(r"Did you mean (\S+?)\?", str(e))  # pandas' hint for a renamed alias
        hint = f" (did you mean {suggestion.group(1)!r}?)" if suggestion else ""
        raise invalid(f"expected a pandas frequency such as 'YS', 'MS' or '1D', got {freq!r}{hint}") from None
    if offset.n <= 0:
        raise invalid(f"expected a positive frequency such as 'YS', 'MS' or '1D', got {freq!r}")
    return freq


Frequency = Annotated[str, Field(strict=True), AfterValidator(check_frequency)]
"""A pandas frequency string (``"YS"``, ``"MS"``, ``"1D"``): the periods of a resampling."""


# --- thresholds with units ----------------------------------------------------------------------

# temperature units -> (scale, offset) to kelvin
TO_KELVIN = {"K": (1.0, 0.0), "degC": (1.0, 273.15), "°C": (1.0, 273.15), "C": (1.0, 273.15),
             "celsius": (1.0, 273.15), "degF": (5 / 9, 273.15 - 32 * 5 / 9), "°F": (5 / 9, 273.15 - 32 * 5 / 9)}


def parse_quantity(text: str) -> tuple[float, str]:
    """``"25 degC"`` as (25.0, "degC"): a finite number and one of the temperature units of
    :data:`TO_KELVIN`; ValueError saying what was expected otherwise."""
    m = re.fullmatch(r"\s*(\S+?)\s*(°[CF]|[A-Za-z]+)\s*", text)
    try:
        value = float(m.group(1)) if m else float("nan")
    except ValueError:
        value = float("nan")
    if not m or not np.isfinite(value) or m.group(2) not in TO_KELVIN:
        raise invalid(
            f"expected a number or a temperature such as '25 degC' (units: {', '.join(TO_KELVIN)}), got {text!r}"
        )
    return value, m.group(2)


def check_threshold(v):
    """A finite number (not a bool) or a string that :func:`parse_quantity` reads, unchanged."""
    if isinstance(v, str):
        parse_quantity(v)
        return v
    v = _numpy_scalar(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        raise invalid(f"expected a finite number or a temperature such as '25 degC', got {v!r}")
    return float(v)


Threshold = Annotated[float | str, PlainValidator(check_threshold)]
"""A threshold: a number in the data's units, or a temperature with its units (``"25 degC"``)."""
