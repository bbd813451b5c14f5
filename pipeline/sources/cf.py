"""CF decoding of values on the backend.

xarray's CF decoding is kept for times and attributes; the unpacking of values (``_FillValue`` /
``missing_value`` -> NaN, ``scale_factor``, ``add_offset``) moves to the chosen backend: on the GPU
the packed integers cross the bus and are unpacked there by one fused kernel, with the float type
xarray itself would choose.
"""

from __future__ import annotations

from typing import Mapping

import dask.array as da
import numpy as np

from .. import backend as B
from .. import kernels

PACKING_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value")


def _float_dtype_like_xarray(dtype: np.dtype, attrs: Mapping) -> np.dtype:
    """The float type xarray's CF decoding gives ``dtype`` data with these attributes."""
    try:
        from xarray.coding.variables import _choose_float_dtype
    except ImportError:  # pragma: no cover - older or newer xarray without the helper
        return np.dtype(np.float64) if dtype.itemsize > 2 or "add_offset" in attrs else np.dtype(np.float32)
    return np.dtype(_choose_float_dtype(dtype, attrs))



def decode(data: da.Array, attrs: dict, encoding: dict) -> tuple[da.Array, dict, dict]:
    """CF-unpack one variable on its backend: fill values -> NaN, then ``raw * scale + offset``."""
    if not any(k in attrs for k in PACKING_ATTRS):
        return data, attrs, encoding
    fills = []
    for key in ("_FillValue", "missing_value"):
        if key in attrs:
            fills.extend(np.atleast_1d(np.asarray(attrs[key])).tolist())
    has_scale = "scale_factor" in attrs or "add_offset" in attrs
    if has_scale or data.dtype.kind in "iu":
        out_dtype = _float_dtype_like_xarray(data.dtype, attrs)
    else:
        out_dtype = data.dtype
    scale = float(np.asarray(attrs.get("scale_factor", 1.0)))
    offset = float(np.asarray(attrs.get("add_offset", 0.0)))
    backend = B.backend_of(data)
    kernel = kernels.get("cf_decode", backend)
    decoded = data.map_blocks(
        kernel,
        fill_values=tuple(fills),
        scale=scale,
        offset=offset,
        out_dtype=out_dtype,
        dtype=out_dtype,
        meta=B.meta(backend, out_dtype, data.ndim),
    )
    encoding = {**encoding, **{k: attrs[k] for k in PACKING_ATTRS if k in attrs}}
    attrs = {k: v for k, v in attrs.items() if k not in PACKING_ATTRS}
    return decoded, attrs, encoding
