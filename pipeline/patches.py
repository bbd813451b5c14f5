"""The one place where pipeline changes what another library does, and why.

xarray's methods on Dask arrays of CuPy blocks (an analyst's own ``x.resample(...)``,
``x.weighted(w).mean()``, ``x.quantile(...)`` on the arrays :func:`pipeline.open_dataset`
gives) fail where xarray or dask hand a CuPy block to code written for NumPy: xarray looks for
CuPy arrays but not for Dask arrays of them (``duck_array_ops.as_shared_dtype``), so host
constants and coordinates meet device blocks in one task, which CuPy refuses; and a few chunk
functions call NumPy or bottleneck directly. Where the library offers an extension point, that is
used (dask's ``einsum_lookup``); elsewhere a function is wrapped. Every change here:

- is scoped to CuPy blocks (and Dask arrays of them): with NumPy data each wrapper calls the
  original, unchanged;
- is applied where GPU arrays are made (:func:`pipeline.open_dataset`, ``load_dataset``), not on import;
- can be turned off: the setting ``pipeline.patches`` is true (all), false (none) or a list of the
  names in :data:`PATCHES`;
- lists, in :data:`ELSEWHERE`, the changes other modules make where they are needed (CuPy's
  compilations, dask's shuffle gathers, NumPy's ``row_stack``, distributed's import), which the
  same setting governs (one of them, dask's scheduler lookup, applies to NumPy data too: it
  changes no result, only skips an import);
- checks that its target is the function it was written against (its name and parameters) and
  leaves a different one alone; the versions it was tested with are in :data:`TESTED`
  (tests/test_patches.py checks them on the versions installed).

The device versions of xarray's chunk functions are in :mod:`pipeline.kernels.duck`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import config
from .backend import xp_of

log = logging.getLogger(__name__)

# the versions each change was tested with (the lowest supported, and the newest seen)
TESTED = {"dask": ("2025.1", "2026.8"), "xarray": ("2025.1", "2026.9"), "cupy": ("13.0", "14.2")}


@dataclass(frozen=True)
class Patch:
    """``module.attribute`` replaced by ``make(original)``, where its parameters begin with
    ``params`` (the function it was written against). ``also``: modules that imported the same
    function by name, replaced there too. ``why``: what fails without it."""

    name: str
    module: str
    attribute: str
    params: tuple[str, ...]
    make: Callable[[Callable], Callable]
    why: str
    also: tuple[str, ...] = ()


def _cupy():
    return sys.modules.get("cupy")


def on_device(x) -> bool:
    """A CuPy array, or a Dask array of CuPy blocks."""
    cp = _cupy()
    if cp is None:
        return False
    return isinstance(x, cp.ndarray) or isinstance(getattr(x, "_meta", None), cp.ndarray)


def to_device(x):
    """A host operand of a computation on the device, made one: a 0-d NumPy array becomes a NumPy
    scalar (which CuPy takes as a kernel argument), a NumPy array of numbers a CuPy array, a Dask
    array of NumPy blocks of numbers a Dask array of CuPy blocks. Anything else is left as it is:
    strings and dates have no device type, and CuPy's own error then names them."""
    cp = _cupy()
    if isinstance(x, np.ndarray):
        if x.ndim == 0:
            return x[()]
        return cp.asarray(x) if x.dtype.kind in "biufc" else x
    meta = getattr(x, "_meta", None)
    if isinstance(meta, np.ndarray) and x.dtype.kind in "biufc" and hasattr(x, "map_blocks"):
        return x.map_blocks(cp.asarray, dtype=x.dtype, meta=cp.empty((0,) * x.ndim, dtype=x.dtype))
    return x


# --- the changes ----------------------------------------------------------------------------------


def _elemwise(original):
    @functools.wraps(original)
    def elemwise(op, *args, out=None, where=True, **kwargs):
        if any(on_device(a) for a in (*args, where)):
            args = [to_device(a) for a in args]
            where = where if where is True else to_device(where)
        return original(op, *args, out=out, where=where, **kwargs)

    return elemwise


def _nan_first_last(which: str):
    def make(original):
        @functools.wraps(original)
        def wrapper(values, axis, keepdims=False):
            if on_device(values):
                from .kernels import duck

                return getattr(duck, which)(values, axis, keepdims=keepdims)
            return original(values, axis, keepdims=keepdims)

        return wrapper

    return make


def _push(original):
    @functools.wraps(original)
    def push(array, n=None, axis=-1):
        if on_device(array):
            from .kernels import duck

            return duck.push(array, n, axis)
        return original(array, n, axis)

    return push


def _nanquantile(original):
    @functools.wraps(original)
    def nanquantile(a, q, axis=None, method="linear", keepdims=False, weights=None, **kwargs):
        if on_device(a):
            from .errors import NotImplementedInputError
            from .kernels import duck

            if weights is not None:
                raise NotImplementedInputError("a weighted quantile is not available on the GPU backend")
            return duck.nanquantile(a, q, axis, method=method, keepdims=keepdims)
        return original(a, q, axis=axis, method=method, keepdims=keepdims, weights=weights, **kwargs)

    return nanquantile


def _least_squares(original):
    @functools.wraps(original)
    def least_squares(lhs, rhs, rcond=None, skipna=False):
        if not on_device(rhs):
            return original(lhs, rhs, rcond=rcond, skipna=skipna)
        return _device_least_squares(lhs, rhs)

    return least_squares


LSTSQ_BLOCK = 256 << 20


def _lstsq_columns(rows: int, columns: int) -> int:
    """Columns of a block of the device fit: ``rows`` float64 values each, about LSTSQ_BLOCK."""
    return max(1, min(columns, LSTSQ_BLOCK // (8 * max(1, rows))))


def _device_least_squares(lhs, rhs):
    """xarray's ``dask_array_ops.least_squares`` on CuPy blocks: each block of columns of ``rhs``
    (all of its rows in one block) fitted by :func:`pipeline.kernels.duck.masked_lstsq`, which
    skips the NaN of each column as xarray's ``skipna`` does (with no NaN, the same fit)."""
    import dask.array as da

    from .kernels import duck

    cp = _cupy()
    shape = rhs.shape
    flat = rhs.reshape(shape[0], -1) if rhs.ndim != 2 else rhs
    # all the rows of a block of columns; the columns in blocks whose float64 copies (the fit holds
    # a few) stay near LSTSQ_BLOCK bytes: a (time, lat, lon) store's grid reshapes to one block of
    # every column, 6 GB of float32 at 1460 x 721 x 1440, where the fit held several of 12 GB
    flat = flat.rechunk({0: -1, 1: _lstsq_columns(*flat.shape)})
    lhs = cp.asarray(lhs, dtype=np.float64)
    out = da.map_blocks(
        lambda block: duck.masked_lstsq(lhs, block), flat, dtype=np.float64,
        chunks=((lhs.shape[1] + 1,), flat.chunks[1]), meta=cp.empty((0, 0), dtype=np.float64),
    )
    coeffs, residuals = out[:-1], out[-1]
    if rhs.ndim != 2:
        coeffs = coeffs.reshape((lhs.shape[1], *shape[1:]))
        residuals = residuals.reshape(shape[1:])
    return coeffs, residuals


def _idxminmax(original):
    @functools.wraps(original)
    def calc_idxminmax(*, array, func, dim=None, skipna=None, fill_value=None, keep_attrs=None, **kwargs):
        if fill_value is None:
            from xarray.core import dtypes

            fill_value = dtypes.NA
        args = dict(array=array, func=func, dim=dim, skipna=skipna, fill_value=fill_value, keep_attrs=keep_attrs, **kwargs)
        if not on_device(array.data) or dim is None or dim not in array.coords or kwargs:
            return original(**args)
        return _device_idxminmax(**args)

    return calc_idxminmax


def _device_idxminmax(*, array, func, dim, skipna, fill_value, keep_attrs):
    """xarray's ``_calc_idxminmax`` on a Dask array of CuPy blocks: the positions are found on the
    device, and the coordinate's labels taken there where they are numbers; dates and strings,
    which only the host holds, are taken on the host from the positions (one per cell of the
    result, moved explicitly), as xarray does for NumPy."""
    import dask.array as da

    cp = _cupy()
    labels = np.asarray(array[dim].values)
    missing = skipna or (skipna is None and array.dtype.kind in "cfO")
    if missing:
        allna = array.isnull().all(dim)
        array = array.where(~allna, 0)
    index = func(array, dim=dim, axis=None, keep_attrs=keep_attrs, skipna=skipna)
    positions = index.data
    if labels.dtype.kind in "biuf":
        coord = da.from_array(cp.asarray(labels), chunks=-1)
    else:
        coord = da.from_array(labels, chunks=-1)
        positions = positions.map_blocks(cp.asnumpy, dtype=positions.dtype,
                                         meta=np.empty((0,) * positions.ndim, dtype=positions.dtype))
    taken = coord[positions.ravel()].reshape(positions.shape)
    res = index.copy(data=taken).rename(dim)
    if missing:
        if labels.dtype.kind not in "biuf":  # the mask of the cells without a value joins the dates
            allna = allna.copy(data=allna.data.map_blocks(cp.asnumpy, dtype=bool,
                                                          meta=np.empty((0,) * allna.ndim, dtype=bool)))
        res = res.where(~allna, fill_value)
    res.attrs = index.attrs
    return res


def _device_meta(out, like):
    """``out``, a Dask array of CuPy blocks where ``like`` is on the device, given CuPy's meta where
    dask inferred NumPy's (a later step looks at the meta to choose how to treat its blocks,
    :func:`on_device` among them)."""
    if on_device(like) and hasattr(out, "_meta") and not on_device(out) and out.dtype.kind in "biufc":
        out._meta = _cupy().empty((0,) * out.ndim, dtype=out.dtype)
    return out


def _values_on_host(original):
    """xarray's ``_as_array_or_item`` (``DataArray.values``, ``Variable.values``, and through them
    ``np.asarray``, ``float`` and ``int`` of a DataArray), giving device data to the host by
    :func:`pipeline.backend.to_numpy` (a Dask array computed where its blocks are, then copied),
    as ``DataArray.to_numpy()`` does; NumPy data as it is."""

    @functools.wraps(original)
    def as_array_or_item(data):
        if on_device(data):
            from .backend import to_numpy

            data = to_numpy(data)
        return original(data)

    return as_array_or_item


def _keeps_device_meta(original):
    """``original(a, ...)``, whose result's meta dask infers as NumPy whatever ``a``'s blocks are,
    with the meta of ``a``'s backend (:func:`_device_meta`)."""

    @functools.wraps(original)
    def wrapper(a, *args, **kwargs):
        return _device_meta(original(a, *args, **kwargs), a)

    return wrapper


DEVICE_INTERP_METHODS = ("linear", "nearest")


def _interp_na(original):
    @functools.wraps(original)
    def interp_na(self, dim=None, use_coordinate=True, method="linear", limit=None, max_gap=None, keep_attrs=None,
                  **kwargs):
        args = dict(dim=dim, use_coordinate=use_coordinate, method=method, limit=limit, max_gap=max_gap,
                    keep_attrs=keep_attrs, **kwargs)
        if not on_device(self.data) or dim is None or method not in _interp_methods():
            return original(self, **args)  # xarray's, or its refusal of a dim not given or a method not one
        if method not in DEVICE_INTERP_METHODS or kwargs:
            from .errors import NotImplementedInputError

            raise NotImplementedInputError(
                f"interpolate_na with method={method!r}" + (f", {', '.join(kwargs)}" if kwargs else "")
                + " is not available on the GPU backend (methods 'linear' and 'nearest', with limit and max_gap, are)"
            )
        return _device_interp_na(self, dim, use_coordinate, method, limit, max_gap, keep_attrs)

    return interp_na


def _interp_methods() -> tuple[str, ...]:
    from typing import get_args

    from xarray.core.types import InterpOptions

    return tuple(m for options in get_args(InterpOptions) for m in get_args(options))


def _device_interp_na(self, dim, use_coordinate, method, limit, max_gap, keep_attrs):
    """xarray's ``interp_na`` for ``method="linear"`` or ``"nearest"`` on device data, step for step:
    :func:`pipeline.kernels.duck.interp_na` on blocks holding all of ``dim`` (xarray asks the same),
    where xarray runs NumPy's interp or SciPy's interp1d on each row through ``numpy.vectorize``,
    and ``max_gap``'s lengths of the gaps by :func:`pipeline.kernels.duck.nan_block_lengths` in the
    same blocks, where xarray chains a dozen operations on the array."""
    from numbers import Number

    import pandas as pd
    from xarray.coding.cftimeindex import CFTimeIndex
    from xarray.computation.apply_ufunc import apply_ufunc
    from xarray.core import missing
    from xarray.core.duck_array_ops import timedelta_to_numeric
    from xarray.core.options import _get_keep_attrs
    from xarray.core.utils import is_scalar

    from .kernels import duck

    valids = missing._get_valid_fill_mask(self, dim, limit) if limit is not None else None
    if max_gap is not None:
        max_type = type(max_gap).__name__
        if not is_scalar(max_gap):
            raise ValueError("max_gap must be a scalar.")
        if (dim in self._indexes and use_coordinate
                and isinstance(self._indexes[dim].to_pandas_index(), pd.DatetimeIndex | CFTimeIndex)):
            max_gap = timedelta_to_numeric(max_gap)
        if not use_coordinate and not isinstance(max_gap, Number | np.number):
            raise TypeError(
                f"Expected integer or floating point max_gap since use_coordinate=False. Received {max_type}."
            )
    index = missing.get_clean_interp_index(self, dim, use_coordinate=use_coordinate)

    def rows(function, dtype):
        out = apply_ufunc(
            lambda y, x: function(y, _cupy().asarray(x)), self, index, input_core_dims=[[dim], [dim]],
            output_core_dims=[[dim]], output_dtypes=[dtype], dask="parallelized",
            keep_attrs=_get_keep_attrs(default=True) if keep_attrs is None else keep_attrs,
        ).transpose(*self.dims)
        return out if out.chunks is None else out.copy(data=_device_meta(out.data, self.data))

    out = rows(functools.partial(duck.interp_na, method=method), self.dtype)
    if valids is not None:
        out = out.where(valids)
    if max_gap is not None:
        if dim not in self.coords:
            raise NotImplementedError("max_gap not implemented for unlabeled coordinates yet.")
        out = out.where(rows(duck.nan_block_lengths, np.float64) <= max_gap)
    return out


def _holds_device_data(obj) -> bool:
    """A DataArray, or a Dataset with a data variable, of device data."""
    variables = obj.data_vars.values() if hasattr(obj, "data_vars") else (obj,)
    return any(on_device(v.data) for v in variables)


def _rolling_exp_init(original):
    @functools.wraps(original)
    def __init__(self, obj, windows, window_type="span", min_weight=0.0):
        if not _holds_device_data(obj):
            return original(self, obj, windows, window_type=window_type, min_weight=min_weight)
        # xarray's __init__ without its check for numbagg, which has no part in the device's path
        from xarray.computation.rolling_exp import _get_alpha

        self.obj = obj
        self.dim, window = next(iter(windows.items()))
        self.alpha = _get_alpha(**{window_type: window})
        self.min_weight = min_weight
        self.kwargs = dict(alpha=self.alpha, axis=-1, **({"min_weight": min_weight} if min_weight > 0 else {}))

    return __init__


def _rolling_exp(how: str):
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def method(self, *args, **kwargs):
            if not _holds_device_data(self.obj):
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            return _device_rolling_exp(self, how, **{k: v for k, v in bound.arguments.items() if k != "self"})

        return method

    return make


def _device_rolling_exp(self, how, other=None, keep_attrs=None):
    """xarray's ``RollingExp.{how}`` on device data: the same ``apply_ufunc`` (one block along the
    window's dimension, as xarray asks), each block by :func:`pipeline.kernels.ewm.move_exp` where
    xarray calls numbagg's ``move_exp_nan{how}``."""
    from xarray.computation.apply_ufunc import apply_ufunc
    from xarray.core.options import _get_keep_attrs

    if keep_attrs is None:  # mean and sum take it; the others keep the attributes
        keep_attrs = _get_keep_attrs(default=True) if how in ("mean", "sum") else True
    objs = (self.obj,) if other is None else (self.obj, other)
    return apply_ufunc(
        functools.partial(_move_exp_block, how=how, alpha=self.alpha, min_weight=self.min_weight),
        *objs, input_core_dims=[[self.dim]] * len(objs), output_core_dims=[[self.dim]], output_dtypes=[np.float64],
        keep_attrs=keep_attrs, on_missing_core_dim="copy", dask="parallelized",
    ).transpose(*self.obj.dims)  # dask takes the result's meta from self.obj's: CuPy's


def _move_exp_block(*arrays, how, alpha, min_weight):
    if any(on_device(a) for a in arrays):
        from .kernels import ewm

        arrays = [to_device(a) for a in arrays]
        return ewm.move_exp(arrays[0], alpha, min_weight, how, *arrays[1:], axis=-1)
    import numbagg  # NumPy data of a Dataset that also holds device data: xarray's own function

    return getattr(numbagg, f"move_exp_nan{how}")(
        *arrays, alpha=alpha, axis=-1, **({"min_weight": min_weight} if min_weight > 0 else {})
    )


def _weighted_quantile(original):
    @functools.wraps(original)
    def weighted_quantile(self, da, q, dim=None, skipna=None):
        if on_device(da.data) or on_device(self.weights.data):
            return _device_weighted_quantile(self, da, q, dim, skipna)
        return original(self, da, q, dim=dim, skipna=skipna)

    return weighted_quantile


def _device_weighted_quantile(self, da, q, dim, skipna):
    """xarray's ``Weighted._weighted_quantile`` on CuPy blocks: the same checks and alignment,
    then :func:`pipeline.kernels.duck.weighted_quantile` on whole blocks, where xarray runs its
    NumPy function row by row through ``numpy.vectorize``."""
    from xarray.computation.apply_ufunc import apply_ufunc
    from xarray.core import utils
    from xarray.structure.alignment import align, broadcast

    from .kernels import duck

    if skipna is None and da.dtype.kind in "cfO":
        skipna = True
    q = np.atleast_1d(np.asarray(q, dtype=np.float64))
    if q.ndim > 1:
        raise ValueError("q must be a scalar or 1d")
    if np.any((q < 0) | (q > 1)):
        raise ValueError("q values must be between 0 and 1")
    dim = list(da.dims) if dim is None else [dim] if utils.is_scalar(dim) else list(dim)
    da, weights = align(da, self.weights, join="inner")
    da, weights = broadcast(da, weights)
    result = apply_ufunc(
        lambda d, w: duck.weighted_quantile(d, w, q, bool(skipna), core=len(dim)),
        da, weights, input_core_dims=[dim, dim], output_core_dims=[["quantile"]], output_dtypes=[np.float64],
        dask_gufunc_kwargs=dict(output_sizes={"quantile": len(q)}), dask="parallelized",
    )
    if result.chunks is not None:
        result = result.copy(data=_device_meta(result.data, da.data))
    return result.transpose("quantile", ...).assign_coords(quantile=q).squeeze()


def _groupby_binary_op(original):
    @functools.wraps(original)
    def binary_op(self, other, f, reflexive=False):
        if on_device(getattr(self._original_obj, "data", None)) and _aligned_applies(self, other):
            return _aligned_groupby_binary_op(self, other, f, reflexive)
        return original(self, other, f, reflexive=reflexive)

    return binary_op


def _aligned_applies(self, other) -> bool:
    """Whether :func:`_aligned_groupby_binary_op` gives xarray's result: a DataArray grouped by one
    1-D group whose every element is in a group, and a DataArray ``other`` along the groups."""
    from xarray.core.dataarray import DataArray
    from xarray.core.groupby import _DummyGroup
    from xarray.core.resample import Resample

    obj = self._original_obj
    if isinstance(self, Resample) or not isinstance(obj, DataArray) or obj.chunks is None:
        return False
    if not isinstance(other, DataArray) or len(self.groupers) != 1:
        return False
    (grouper,) = self.groupers
    name, group, codes = grouper.name, grouper.group, self.encoded.codes
    if isinstance(group, _DummyGroup) or group.ndim != 1 or codes.chunks is not None:
        return False
    (dim,) = group.dims
    return (
        dim in obj.dims and name not in obj.dims and name in other.dims and dim not in other.dims
        and codes.dims == (dim,) and not bool((codes.values == -1).any())
        and all(other.sizes[d] == obj.sizes[d] for d in other.dims if d in obj.dims)
    )


def _aligned_groupby_binary_op(self, other, f, reflexive):
    """xarray's ``GroupBy._binary_op`` for the cases of :func:`_aligned_applies`, with ``other``
    expanded along the grouped dimension in the chunks of the grouped array. xarray expands it by
    ``other.isel({name: codes})``, whose dask ``take`` chunks the result like ``other`` along the
    groups, one step a chunk, and the grouped array is then rechunked to match: thousands of tiny
    tasks where the grouped array has a few chunks. Here each block of the expansion is ``take``
    of ``other`` (one block along the groups) by the codes of one block of the grouped array."""
    import dask.array as da
    from xarray.core.dataarray import DataArray
    from xarray.structure.alignment import align

    g = f if not reflexive else lambda x, y: f(y, x)
    obj = self._original_obj
    (grouper,) = self.groupers
    name, codes = grouper.name, self.encoded.codes
    (dim,) = codes.dims
    coord = grouper.unique_coord
    if not isinstance(coord, DataArray):
        (coord_dim,) = coord.dims
        coord = DataArray(coord, coords={coord_dim: coord.data})
    other = other.copy(deep=False)  # xarray broadcasts scalar coordinates in place; not here
    for var in other.coords:
        if other[var].ndim == 0:
            other[var] = other[var].drop_vars(var).expand_dims({name: other.sizes[name]})
    other, _ = align(other, coord, join="right", copy=False)

    obj_chunks = dict(zip(obj.dims, obj.data.chunks))
    chunks = tuple(-1 if d == name else obj_chunks.get(d, -1 if other.chunks is None else other.chunksizes[d])
                   for d in other.dims)
    data = other.data
    if on_device(obj.data) and not on_device(data):
        data = to_device(data)
    data = (data if hasattr(data, "__dask_graph__") else da.from_array(data, chunks=chunks)).rechunk(chunks)
    axis = other.dims.index(name)
    index = {d: f"i{k}" for k, d in enumerate((*other.dims, dim))}
    out_dims = tuple(dim if d == name else d for d in other.dims)
    taken = da.blockwise(
        _take, tuple(index[d] for d in out_dims),
        data, tuple(index[d] for d in other.dims),
        da.from_array(np.asarray(codes.values), chunks=(obj_chunks[dim],)), (index[dim],),
        axis=axis, dtype=data.dtype, meta=data._meta, concatenate=True,
    )
    coords = other.coords.to_dataset().isel({name: codes}).coords  # the coordinates isel gives
    expanded = DataArray(taken, dims=out_dims, coords=coords, name=other.name, attrs=other.attrs)
    return g(obj, expanded)


def _take(block, codes, axis):
    xp = xp_of(block)
    return xp.take(block, xp.asarray(codes), axis=axis)


def _without_flox_on_device(original):
    @functools.wraps(original)
    def contains_only_chunked_or_numpy(obj) -> bool:
        from xarray.core.dataarray import DataArray

        variables = (obj._to_temp_dataset() if isinstance(obj, DataArray) else obj)._variables.values()
        if any(on_device(v._data) for v in variables):
            return False
        return original(obj)

    return contains_only_chunked_or_numpy


def _einsum_lookup():
    """dask's ``einsum_lookup`` for CuPy blocks: ``cupy.einsum`` with host operands (xarray's
    ``dot`` of a device array and host weights, as ``weighted`` makes) moved to the device."""
    cp = _cupy()
    from dask.array.dispatch import einsum_lookup

    einsum_lookup.dispatch(cp.ndarray)  # dask's own registration for CuPy, made now

    def einsum(subscripts, *operands, **kwargs):
        return cp.einsum(subscripts, *(to_device(o) if isinstance(o, np.ndarray) else o for o in operands), **kwargs)

    einsum_lookup.register(cp.ndarray, einsum)


PATCHES: dict[str, Patch] = {
    p.name: p
    for p in (
        Patch(
            "xarray-values-on-host", "xarray.core.variable", "_as_array_or_item", ("data",), _values_on_host,
            "DataArray.values (how sgkit scripts read every result) calls numpy.asarray, which CuPy refuses "
            "(TypeError: Implicit conversion to a NumPy array is not allowed); to_numpy() and pipeline.to_numpy "
            "give the same array",
        ),
        Patch(
            "dask-elemwise", "dask.array.core", "elemwise", ("op",), _elemwise,
            "xarray's where/fillna/weights and coordinate arithmetic put 0-d NumPy fill values and "
            "NumPy coordinates in the same task as CuPy blocks (xarray's as_shared_dtype sees no "
            "CuPy inside a Dask array); CuPy refuses them (TypeError: Unsupported type numpy.ndarray)",
            also=("dask.array.routines",),
        ),
        Patch(
            "xarray-nanfirst", "xarray.core.nputils", "nanfirst", ("values", "axis"), _nan_first_last("nanfirst"),
            "groupby/resample first() and ffill call pandas.isnull and np.ix_ on a CuPy block",
        ),
        Patch(
            "xarray-nanlast", "xarray.core.nputils", "nanlast", ("values", "axis"), _nan_first_last("nanlast"),
            "groupby/resample last() and ffill call pandas.isnull and np.ix_ on a CuPy block",
        ),
        Patch(
            "xarray-push", "xarray.core.duck_array_ops", "_push", ("array", "n", "axis"), _push,
            "ffill/bfill call bottleneck.push (or numbagg) on a CuPy block",
        ),
        Patch(
            "dask-nanquantile", "dask.array.reductions", "_custom_nanquantile", ("a", "q", "axis"), _nanquantile,
            "quantile mixes a NumPy q and NumPy index arithmetic with a CuPy block",
        ),
        Patch(
            "xarray-idxminmax", "xarray.computation.computation", "_calc_idxminmax",
            ("array", "func", "dim", "skipna", "fill_value", "keep_attrs"), _idxminmax,
            "idxmin/idxmax index a NumPy coordinate with CuPy positions",
        ),
        Patch(
            "xarray-interpolate-na", "xarray.core.missing", "interp_na",
            ("self", "dim", "use_coordinate", "method", "limit", "max_gap", "keep_attrs"), _interp_na,
            "interpolate_na runs NumPy's interp (SciPy's interp1d for 'nearest') on each row of a CuPy block "
            "through numpy.vectorize, and max_gap's lengths of the gaps by a dozen operations",
        ),
        Patch(
            "xarray-rolling-exp", "xarray.computation.rolling_exp", "RollingExp.__init__",
            ("self", "obj", "windows", "window_type", "min_weight"), _rolling_exp_init,
            "rolling_exp refuses any data without numbagg, which is NumPy-only: device data need none",
        ),
        *(
            Patch(
                f"xarray-rolling-exp-{how}", "xarray.computation.rolling_exp", f"RollingExp.{how}", params,
                _rolling_exp(how), f"rolling_exp's {how} runs numbagg's move_exp_nan{how}, NumPy-only, on each block",
            )
            for how, params in (
                ("mean", ("self", "keep_attrs")), ("sum", ("self", "keep_attrs")), ("std", ("self",)),
                ("var", ("self",)), ("cov", ("self", "other")), ("corr", ("self", "other")),
            )
        ),
        Patch(
            "xarray-weighted-quantile", "xarray.computation.weighted", "Weighted._weighted_quantile",
            ("self", "da", "q", "dim", "skipna"), _weighted_quantile,
            "weighted quantile runs NumPy's sort and cumsum on each row through numpy.vectorize",
        ),
        *(
            Patch(
                f"dask-{name}-meta", module, name, first, _keeps_device_meta,
                f"dask's {name} gives a result of CuPy blocks a NumPy meta, so later steps take its "
                "blocks for NumPy's", also=("dask.array",),
            )
            for module, name, first in (
                ("dask.array.reductions", "nanmedian", ("a",)),
                ("dask.array.reductions", "median", ("a",)),
                ("dask.array.reductions", "nanquantile", ("a",)),
                ("dask.array.reductions", "quantile", ("a",)),
                ("dask.array.routines", "gradient", ("f",)),
            )
        ),
        Patch(
            "xarray-push-meta", "xarray.compat.dask_array_ops", "push", ("array", "n", "axis"), _keeps_device_meta,
            "ffill/bfill's scan gives a result of CuPy blocks a NumPy meta",
        ),
        Patch(
            "xarray-no-flox-on-device", "xarray.core._aggregations", "contains_only_chunked_or_numpy", ("obj",),
            _without_flox_on_device,
            "with flox installed (xclim depends on it) xarray hands groupby and resample reductions of Dask "
            "arrays to flox, whose engines run NumPy's ufunc.reduceat and numpy_groupies on each block "
            "(NotImplementedError: cupy_maximum.reduceat); on CuPy blocks xarray's own grouped reductions "
            "run instead, which the other changes here make work on the device",
            also=("xarray.core.groupby",),
        ),
        Patch(
            "xarray-groupby-binary-op", "xarray.core.groupby", "GroupBy._binary_op",
            ("self", "other", "f", "reflexive"), _groupby_binary_op,
            "x.groupby('time.month') - clim expands clim by dask's take, which chunks it one time step "
            "a chunk, and rechunks x to match: thousands of tiny device tasks where x has a few chunks",
        ),
        Patch(
            "xarray-polyfit", "xarray.compat.dask_array_ops", "least_squares", ("lhs", "rhs", "rcond", "skipna"),
            _least_squares,
            "polyfit fits each column by numpy.linalg.lstsq through apply_along_axis (skipna), "
            "converting every CuPy column to NumPy",
        ),
    )
}
# changes made through a library's extension point rather than by replacing a function
REGISTRATIONS: dict[str, tuple[Callable[[], None], str]] = {
    "dask-einsum": (_einsum_lookup, "xarray's dot (weighted means) gives cupy.einsum host weights"),
}


# changes made where they are needed, by the modules named, under the same rule and setting
ELSEWHERE: dict[str, tuple[str, str]] = {
    "cupy-compile-once": (
        "pipeline.kernels.launch.share_cupy_compiles",
        "CuPy compiles a kernel once per thread that asks for it at the same time (no lock): "
        "7.1 s of compilation in a 3.1 s first run on the GPU machine",
    ),
    "numpy-row-stack": (
        "pipeline.kernels.launch.numba_cuda",
        "numba-cuda 0.30 overloads np.row_stack, which NumPy 2.5 removed: its first compilation fails",
    ),
    "dask-shuffle-getitem": (
        "pipeline.kernels.copies.register_with_dask",
        "dask's shuffle gathers CuPy blocks by CuPy's gather kernel, compiled per dtype on a fresh machine",
    ),
    "distributed-shuffle-import": (
        "pipeline.exec.compute.distributed_not_imported",
        "dask imports all of distributed (0.65-1.0 s) to look for its tasks in a graph that cannot hold any",
    ),
    "dask-client-lookup": (
        "pipeline.exec.compute.skip_client_lookup",
        "dask imports all of distributed in a first .values, .compute() or rechunk to look for a client that "
        "cannot exist before distributed is imported",
    ),
}


enabled = config.patched  # whether the setting pipeline.patches lets a change be made


def check_setting() -> None:
    """InputError where the setting ``pipeline.patches`` names a change there is not (with the
    closest name); called with :func:`pipeline.config.check`."""
    import difflib

    setting = config.get("patches", True)
    known = [*PATCHES, *REGISTRATIONS, *ELSEWHERE]
    for name in setting if isinstance(setting, list) else ():
        if name not in known:
            from .errors import InputError

            close = difflib.get_close_matches(str(name), known, n=1)
            raise InputError(
                f"setting pipeline.patches names {name!r}, which is not one of pipeline's changes"
                + (f"; did you mean {close[0]!r}?" if close else "") + f" (they are: {', '.join(known)})"
            )


def _matches(func, params: tuple[str, ...]) -> bool:
    try:
        names = tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return False
    return names[: len(params)] == params


_applied: dict[str, tuple[object, Callable]] = {}  # name -> (module, original)


def _get(holder, attribute: str):
    """``holder.attribute``, where ``attribute`` may name a class's method (``"Class.method"``)."""
    *owners, name = attribute.split(".")
    for owner in owners:
        holder = getattr(holder, owner, None)
    return getattr(holder, name, None)


def _set(holder, attribute: str, value) -> None:
    *owners, name = attribute.split(".")
    for owner in owners:
        holder = getattr(holder, owner)
    setattr(holder, name, value)


def apply() -> list[str]:
    """Make the enabled changes not made yet (where CuPy is imported); returns their names."""
    if _cupy() is None:
        return []
    done = []
    for patch in PATCHES.values():
        if patch.name in _applied or not enabled(patch.name):
            continue
        try:
            module = importlib.import_module(patch.module)
        except ImportError:
            continue
        original = _get(module, patch.attribute)
        if original is None or not _matches(original, patch.params):
            log.debug("not changing %s.%s: not the function %s was written for", patch.module, patch.attribute, patch.name)
            continue
        replacement = patch.make(original)
        replacement.__pipeline_original__ = original
        for name in (patch.module, *patch.also):
            holder = sys.modules.get(name) or importlib.import_module(name)
            if _get(holder, patch.attribute) is original:
                _set(holder, patch.attribute, replacement)
        _applied[patch.name] = (module, original)
        done.append(patch.name)
    for name, (register, _why) in REGISTRATIONS.items():
        if name not in _applied and enabled(name):
            register()
            _applied[name] = (None, None)
            done.append(name)
    return done


def undo() -> None:
    """Put back every function :func:`apply` replaced (a registration stays: dask's registry has no
    removal)."""
    for name, (module, original) in list(_applied.items()):
        if module is None:
            continue
        patch = PATCHES[name]
        for holder_name in (patch.module, *patch.also):
            holder = sys.modules.get(holder_name)
            current = _get(holder, patch.attribute)
            if getattr(current, "__pipeline_original__", None) is original:
                _set(holder, patch.attribute, original)
        del _applied[name]
