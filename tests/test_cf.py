"""CF decoding equals ``xarray.decode_cf`` exactly, on stores written by other tools.

Hypothesis draws encodings (storage type, ``_Unsigned``, ``_FillValue``, ``missing_value``,
``scale_factor``, ``add_offset`` and the types of each) and raw values that hit the fill values;
the store is written with zarr-python (Zarr v2 and v3) or h5py (NetCDF4/HDF5) and opened through
``pipeline.open_dataset``; the reference is ``xarray.decode_cf`` of the same store opened undecoded.
"""

from __future__ import annotations

import warnings

import h5py
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import backend as B
from pipeline.errors import InputError

from .conftest import requires_gpu

INT_TYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8"]
FLOAT_TYPES = ["f2", "f4", "f8"]
SCALE_TYPES = ["float", "f4", "f8"]  # "float": a plain Python (JSON) number
N = 24


def _typed(value, kind):
    return float(value) if kind == "float" else np.dtype(kind).type(value)


@st.composite
def encodings(draw, netcdf: bool):
    """(storage dtype, attributes, raw values): fill values in the storage type, present in the data."""
    dtype = np.dtype(draw(st.sampled_from(INT_TYPES + FLOAT_TYPES)))
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is not None:
        lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
        value = st.integers(lo, hi)
    else:
        value = st.floats(-1000, 1000, width=16 if dtype.itemsize == 2 else 32).map(lambda v: float(np.round(v, 2)))
    attrs: dict = {}
    fills = []
    if draw(st.booleans()):  # _FillValue: on NetCDF in the storage type, on Zarr a JSON number
        fv = draw(value) if info is not None or draw(st.booleans()) else float("nan")
        attrs["_FillValue"] = dtype.type(fv) if netcdf else fv
        fills.append(fv)
    if draw(st.booleans()):
        mv = draw(st.lists(value, min_size=1, max_size=3))
        attrs["missing_value"] = np.array(mv, dtype=dtype) if netcdf else (mv if len(mv) > 1 else mv[0])
        fills.extend(mv)
    if dtype.kind in "iu" and draw(st.booleans()):
        attrs["_Unsigned"] = draw(st.sampled_from(["true", "false"]))
    for key, lo, hi in (("scale_factor", 1e-4, 10.0), ("add_offset", -500.0, 500.0)):
        if draw(st.booleans()):
            kind = draw(st.sampled_from(SCALE_TYPES if netcdf else ["float"]))
            attrs[key] = _typed(draw(st.floats(lo, hi)), kind)
    values = draw(st.lists(value, min_size=N, max_size=N))
    raw = np.array(values, dtype=dtype)
    for k, fv in enumerate(fills):  # the fill values are in the data, and values near them
        if not (isinstance(fv, float) and np.isnan(fv)):
            near = [fv, fv + 1, fv - 37, fv + 100] if info is not None else [fv, fv + 0.01]
            for j, v in enumerate(near):
                if info is None or info.min <= v <= info.max:
                    raw[(k * 4 + j) % N] = dtype.type(v)
    return dtype, attrs, raw.reshape(4, N // 4)


def write_zarr(path, fmt, dtype, attrs, raw):
    group = zarr.open_group(path, mode="w", zarr_format=fmt)
    extra = {"dimension_names": ("t", "x")} if fmt == 3 else {}
    if fmt == 2:
        attrs = {**attrs, "_ARRAY_DIMENSIONS": ["t", "x"]}
    elif "_FillValue" in attrs and dtype.kind == "f":  # Zarr v3 attributes hold float fills as xarray writes them
        from xarray.backends.zarr import FillValueCoder

        attrs = {**attrs, "_FillValue": FillValueCoder.encode(attrs["_FillValue"], dtype)}
    arr = group.create_array("v", shape=raw.shape, dtype=dtype, chunks=(2, 3), attributes=attrs, **extra)
    arr[...] = raw
    return path


def write_netcdf(path, dtype, attrs, raw):
    with h5py.File(path, "w") as f:  # a plain HDF5/NetCDF4 file: dimension scales and attributes
        for name, n in zip(("t", "x"), raw.shape):
            f.create_dataset(name, data=np.arange(n, dtype="i4")).make_scale(name)
        v = f.create_dataset("v", data=raw, chunks=tuple(min(c, n) for c, n in zip((2, 3), raw.shape)))
        for k, name in enumerate(("t", "x")):
            v.dims[k].attach_scale(f[name])
        for key, value in attrs.items():
            v.attrs[key] = np.bytes_(value) if isinstance(value, str) else value
    return path


def reference(path) -> xr.DataArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if str(path).endswith(".nc"):
            raw = xr.open_dataset(path, decode_cf=False, engine="h5netcdf")
        else:
            raw = xr.open_zarr(path, decode_cf=False, consolidated=False)
        return xr.decode_cf(raw)["v"].load()


def check_equal(path, backend):
    try:
        expected = reference(path)
    except (TypeError, ValueError, OverflowError) as e:  # xarray cannot decode it: neither can pipeline
        with pytest.raises(InputError, match="variable 'v'"):
            pipeline.open_dataset(path, backend=backend)["v"].compute()
        return type(e)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = pipeline.open_dataset(path, backend=backend)["v"]
    assert B.backend_of(got) == backend
    assert got.dtype == expected.dtype
    values = B.to_numpy(got.data.compute())
    assert values.dtype == expected.dtype
    # bit for bit: the same bytes, NaN where the reference has NaN
    np.testing.assert_array_equal(np.isnan(values) if values.dtype.kind == "f" else values,
                                  np.isnan(expected.values) if values.dtype.kind == "f" else expected.values)
    same = values.view(f"u{values.dtype.itemsize}") == expected.values.view(f"u{values.dtype.itemsize}")
    assert (same | (np.isnan(values) if values.dtype.kind == "f" else False)).all(), (values, expected.values)
    for key in ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned"):
        assert key not in got.attrs
    return None


FMTS = ["zarr2", "zarr3", "netcdf"]
BACKENDS = ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, requires_gpu])]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FMTS)
def test_decoding_equals_xarray(tmp_path, fmt, backend):
    @SETTINGS
    @given(enc=encodings(netcdf=fmt == "netcdf"))
    def run(enc):
        dtype, attrs, raw = enc
        if fmt == "netcdf":
            path = write_netcdf(tmp_path / "s.nc", dtype, attrs, raw)
        else:
            path = write_zarr(tmp_path / "s.zarr", int(fmt[-1]), dtype, attrs, raw)
        check_equal(path, backend)

    run()


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsigned_satellite_bytes(tmp_path, backend):
    """int8 storage meaning uint8 (``_Unsigned = "true"``): 200 is stored as -56 and read as 200."""
    raw = np.array([[-56, 0, -1, 127]], dtype="i1")
    attrs = {"_Unsigned": "true", "_FillValue": np.int8(-1), "scale_factor": np.float32(0.5), "add_offset": np.float32(10)}
    path = write_netcdf(tmp_path / "u.nc", np.dtype("i1"), attrs, raw)
    got = pipeline.open_dataset(path, backend=backend)["v"]
    expected = np.array([[110.0, 10.0, np.nan, 73.5]], dtype=np.float32)
    np.testing.assert_array_equal(B.to_numpy(got.data.compute()), expected)
    assert got.dtype == np.float32 and got.encoding["_Unsigned"] == "true"
    check_equal(path, backend)


# where the types of the attributes change the arithmetic: NumPy computes in the wider type
CORNERS = {
    # float32 values, NaN fill: float32 kept; * float64 scale computed in float64, rounded to float32
    "f4-nan-fill-f8-scale": ("f4", {"_FillValue": np.float32("nan"), "scale_factor": np.float64(0.1)}, [1.5, 3.3, 7.7, -2.1]),
    # int32 masked in float32 (a float32 scale alone), the int32 fill compared in float64
    "i4-f4-scale-i4-fill": ("i4", {"scale_factor": np.float32(0.5), "_FillValue": np.int32(2**30 + 1)},
                            [2**30 + 1, 2**30 + 2, 2**30 + 64, 2**30]),
    # the same fill as an int16 (compared in float32): neighbours of the fill are masked too
    "i4-f4-scale-f4-fill": ("i4", {"scale_factor": np.float32(0.5), "missing_value": np.float32(2**30 + 64)},
                            [2**30 + 1, 2**30 + 2, 2**30 + 64, 2**30]),
    # float16 values with a float32 offset (computed in float32), a float16 fill
    "f2-f4-offset": ("f2", {"add_offset": np.float32(0.1), "scale_factor": np.float32(3.3), "_FillValue": np.float16(2)}, [1, 2, 3, 0.1]),
    "u1-unsigned-false": ("u1", {"_Unsigned": "false", "_FillValue": np.uint8(255), "scale_factor": np.float32(2)}, [255, 128, 127, 0]),
    "i2-unsigned-only": ("i2", {"_Unsigned": "true"}, [-1, -32768, 5, 0]),
    "i8-several-missing": ("i8", {"missing_value": np.array([-1, 7, 2**53 + 1], dtype="i8"), "add_offset": np.float64(0.25)},
                           [-1, 7, 2**53 + 1, 2**53]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CORNERS))
def test_type_corners_equal_xarray(tmp_path, case, backend):
    dtype, attrs, values = CORNERS[case]
    raw = np.array(values * 6, dtype=dtype).reshape(4, 6)
    assert check_equal(write_netcdf(tmp_path / "c.nc", np.dtype(dtype), attrs, raw), backend) is None
