"""CF decoding of values on the backend, exactly as xarray decodes them.

Stores are opened twice by xarray: once undecoded (metadata only), to see each variable's storage
type and attributes, then with xarray's own ``mask_and_scale`` switched off for the variables whose
values pipeline unpacks on the backend (:func:`xarray_masks`). Those are unpacked by the
``cf_decode`` kernel: on the GPU the packed integers cross the bus and one fused kernel unpacks
them. The rest are xarray's: times and timedeltas (their fill values become NaT, not NaN) and
variables with a ``dtype`` attribute (booleans), decoded by xarray on the host; and values that
are not numbers (strings, bytes), which pass through unchanged and stay on the host.

:func:`plan` follows xarray's coders (``CFMaskCoder``, ``CFScaleOffsetCoder`` in
``xarray/coding/variables.py``) step by step: ``_Unsigned``, the fill values of ``_FillValue`` and
``missing_value`` (NaN ones dropped, ``_FillValue`` re-expressed in the unsigned type), the float
type of the result, and the type NumPy's promotion gives each comparison and each of
``* scale_factor`` and ``+ add_offset``, so the result equals ``xarray.decode_cf`` bit for bit.
"""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np

from .. import backend as B
from .. import kernels
from ..deferred import module as _deferred
from ..errors import InputError
from ..kernels.elementwise import CFPlan

da = _deferred("dask.array")  # imported when the first graph is built

FILL_ATTRS = ("missing_value", "_FillValue")  # in xarray's order
PACKING_ATTRS = ("scale_factor", "add_offset", *FILL_ATTRS, "_Unsigned")


def is_numeric(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "iuf"


def decoded_by_xarray(dtype: np.dtype, attrs: Mapping) -> bool:
    """True for the variables xarray decodes itself: times and timedeltas (``units`` that xarray
    reads as time, where a fill value becomes NaT) and those with a ``dtype`` attribute (booleans
    stored as integers), whose decoding pipeline does not repeat."""
    from xarray.coding.variables import _is_time_like

    return is_numeric(dtype) and ("dtype" in attrs or bool(_is_time_like(attrs.get("units"))))


def xarray_masks(raw) -> dict[str, bool]:
    """xarray's ``mask_and_scale`` for each variable of ``raw`` (the store opened undecoded): on
    only for the variables xarray decodes itself (:func:`decoded_by_xarray`)."""
    return {str(k): decoded_by_xarray(v.dtype, v.attrs) for k, v in raw.variables.items()}


def _fill_values(dtype: np.dtype, attrs: Mapping) -> tuple[dict, set]:
    """xarray's ``_check_fill_values``: the fill attributes kept, and the set of fill values (NaN
    left out; an integer variable's attribute that holds only NaN is dropped)."""
    import pandas as pd

    raw = {k: attrs[k] for k in FILL_ATTRS if k in attrs}
    encoded: set = set()
    for key, value in list(raw.items()):
        kfill = {fv for fv in np.ravel(value) if not pd.isnull(fv)}
        if not kfill and dtype.kind in "iu":
            del raw[key]
        else:
            encoded |= kfill
    return raw, encoded


def _unsigned(dtype: np.dtype, flag, raw_fill, encoded: set) -> np.dtype:
    """xarray's ``_convert_unsigned_fill_value``: the storage type ``_Unsigned`` makes of
    ``dtype``, with ``_FillValue`` re-expressed in it (in ``encoded``)."""
    if dtype.kind == "i" and flag == "true":
        to = np.dtype(f"u{dtype.itemsize}")
        if raw_fill is not None:
            encoded.remove(raw_fill)
            encoded.add(np.array(raw_fill, dtype=dtype).view(to).item())
        return to
    if dtype.kind == "u" and flag == "false":
        to = np.dtype(f"i{dtype.itemsize}")
        if raw_fill is not None:
            encoded.remove(raw_fill)
            encoded.add(to.type(raw_fill))
        return to
    return dtype


def _typed(dtype: np.dtype, value):
    """``value`` in the type NumPy computes ``array_of_dtype (op) value`` in (Python numbers are
    weak: they take the array's type)."""
    return np.result_type(dtype, value).type(value)


def plan(name: str, dtype, attrs: Mapping) -> CFPlan | None:
    """The decoding of a numeric variable stored as ``dtype`` with ``attrs``, as xarray's
    ``decode_cf`` does it; None when there is nothing to decode. Raises InputError naming the
    variable where xarray's decoding fails too."""
    dtype = np.dtype(dtype)
    try:
        return _plan(dtype, attrs)
    except (TypeError, ValueError, KeyError, OverflowError) as e:
        raise InputError(
            f"variable {name!r}: its CF attributes cannot be decoded for {dtype} values "
            f"({', '.join(f'{k}={attrs[k]!r}' for k in PACKING_ATTRS if k in attrs)}): {e}"
        ) from e


def _plan(dtype: np.dtype, attrs: Mapping) -> CFPlan | None:
    from xarray.coding.variables import _choose_float_dtype
    from xarray.core.dtypes import maybe_promote

    raw_fills, encoded = _fill_values(dtype, attrs)
    packed = "scale_factor" in attrs or "add_offset" in attrs
    if not packed and not raw_fills and "_Unsigned" not in attrs:
        return None
    values = _unsigned(dtype, attrs.get("_Unsigned"), raw_fills.get("_FillValue"), encoded)
    mask = fills = None
    current = values
    if encoded:
        mask = np.dtype(_choose_float_dtype(values, attrs) if packed else maybe_promote(values)[0])
        if mask.kind != "f":
            raise TypeError(f"fill values would be NaN in {mask} values")
        fills = tuple(_typed(mask, fv) for fv in encoded)
        current = mask
    scale = offset = None
    if packed:
        if not raw_fills:
            current = np.dtype(_choose_float_dtype(current, attrs))
        sf, ao = attrs.get("scale_factor"), attrs.get("add_offset")
        scale = None if sf is None else _typed(current, np.asarray(sf).item() if np.ndim(sf) else sf)
        offset = None if ao is None else _typed(current, np.asarray(ao).item() if np.ndim(ao) else ao)
        for v in (scale, offset):
            if v is not None and not np.can_cast(v.dtype, current, "same_kind"):
                raise TypeError(f"{v.dtype} scale_factor/add_offset on {current} values")
    return CFPlan(values, mask, fills or (), scale, offset, current)


def decode(data: da.Array, attrs: dict, encoding: dict, name: str = "") -> tuple[da.Array, dict, dict]:
    """CF-unpack one variable on its backend, as :func:`plan` says; the CF attributes move to the
    encoding, as xarray moves them. Values that are not numbers pass through unchanged."""
    moved = {k: attrs[k] for k in PACKING_ATTRS if k in attrs}
    attrs = {k: v for k, v in attrs.items() if k not in moved}
    encoding = {**encoding, **moved}
    if not is_numeric(data.dtype):
        return data, attrs, encoding
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = plan(name, data.dtype, moved)
    if p is None:
        return data, attrs, encoding
    backend = B.backend_of(data)
    decoded = data.map_blocks(
        kernels.get("cf_decode", backend), plan=p, dtype=p.out, meta=B.meta(backend, p.out, data.ndim),
    )
    return decoded, attrs, encoding
