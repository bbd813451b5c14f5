"""Field ops: coarsening, detrending, quantiles and multi-term formulas (see the ops below).

As in :mod:`pipeline.ops.climate`, each op takes a ``DataArray`` of Dask (or in-memory) NumPy or
CuPy data and returns one on the same backend; the kernels are reached through the registry
(:mod:`pipeline.kernels`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import dask
import numpy as np
import xarray as xr
from pydantic import Field

from ..backend import backend_of, memory_budget, meta, out_of_core as is_out_of_core, to_backend, to_numpy
from ..deferred import module as _deferred
from ..errors import InputError
from ..exec import spill
from ..reduce import aggregation as agg
from ..reduce.declare import declare, declared
from ._common import _as_dask, _axis_of, _check, _finish, _is_int, float_dtype
from .metadata import Produces, cell_names, input_name as _name
from .params import Count, Degree, Dim, Quantiles
from .registry import register

da = _deferred("dask.array")  # imported when the first graph is built


# --- coarsen -------------------------------------------------------------------------------------


def _multiple_chunks(chunks: tuple[int, ...], f: int) -> tuple[int, ...]:
    """Chunks of the same total (a multiple of ``f``) whose sizes are multiples of ``f``, with each
    boundary moved to the nearest multiple of ``f``, so that little data moves between chunks."""
    n = sum(chunks)
    bounds = {min(n, (int(b) + f // 2) // f * f) for b in np.cumsum(chunks)} | {n}
    bounds.discard(0)
    return tuple(int(c) for c in np.diff([0, *sorted(bounds)]))


@register(
    kernels=("coarsen_mean",),
    produces=Produces(
        lambda x, p: f"{_name(x)}, mean over blocks of "
        + " x ".join(f"{f} {d}" for d, f in p["factors"].items()),
        cell_methods=lambda x, p: f"{cell_names(list(p['factors']))} mean",
    ),
)
def coarsen_mean(x: xr.DataArray, factors: Annotated[dict[Dim, Count], Field(min_length=1)]) -> xr.DataArray:
    """Mean over non-overlapping blocks, NaN-skipping, as x.coarsen(factors, boundary="trim").mean().

    Each dimension in ``factors`` is trimmed to a multiple of its factor and rechunked so that
    no window straddles two chunks; each chunk is then reduced on its own. Coordinates along the
    coarsened dimensions are the means of each window's values (xarray's ``coord_func="mean"``).
    """
    if not isinstance(factors, dict) or not factors:
        raise InputError(f"factors must be a non-empty mapping of dimension to factor, got {factors!r}")
    for dim, f in factors.items():
        if not _is_int(f) or f < 1:
            raise InputError(f"coarsening factor of dimension {dim!r} must be a positive integer, got {f!r}")
    data, eager = _as_dask(x)
    _check(coarsen_mean.op, x, factors=factors)
    axes = {x.get_axis_num(dim): int(f) for dim, f in factors.items()}
    data = data[tuple(slice(0, n - n % axes[i]) if i in axes else slice(None) for i, n in enumerate(data.shape))]
    data = data.rechunk({i: _multiple_chunks(data.chunks[i], f) for i, f in axes.items()})
    out_dtype = float_dtype(x.dtype)
    chunks = tuple(tuple(c // axes[i] for c in cs) if i in axes else cs for i, cs in enumerate(data.chunks))
    result = data.map_blocks(
        coarsen_mean.op.kernel("coarsen_mean", backend_of(data)),
        factors=axes,
        out_dtype=out_dtype,
        chunks=chunks,
        dtype=out_dtype,
        meta=meta(backend_of(data), out_dtype, x.ndim),
    )
    # the coordinates alone, coarsened by xarray itself: small, and exactly xarray's labels
    coords = x.coords.to_dataset().coarsen(factors, boundary="trim").mean().coords
    return _finish(x, result, eager, dims=x.dims, coords=coords, name=x.name)


# --- detrend -------------------------------------------------------------------------------------


def _trend_coordinate(x: xr.DataArray, dim: str) -> np.ndarray:
    """The coordinate along ``dim`` as float64, mapped affinely onto [-1, 1].

    The fitted values do not change under an affine change of the abscissa, and on [-1, 1] the
    normal equations stay well conditioned (on nanoseconds since 1970 they would not be). Dates
    of cftime calendars count the days of their own calendar, as xarray's polyfit counts them.
    """
    from xarray.core.common import _contains_cftime_datetimes
    from xarray.core.duck_array_ops import datetime_to_numeric

    v = to_numpy(x[dim].data)
    if v.dtype.kind in "mM":
        v = (v - v.min()) / np.timedelta64(1, "s")
    elif v.dtype.kind == "O" and _contains_cftime_datetimes(v):
        # as xarray's polyfit numbers cftime dates (computation._ensure_numeric): time since a
        # date, through xarray's own conversion; the date it counts from changes no fitted value
        v = datetime_to_numeric(v, offset=min(v), datetime_unit="s")
    elif v.dtype.kind in "iuf":
        v = v.astype(np.float64)
    else:
        raise InputError(f"detrend needs a numeric, datetime64 or cftime coordinate along {dim!r}, got dtype {v.dtype}")
    lo, hi = v.min(), v.max()
    half = (hi - lo) / 2 if hi > lo else 1.0
    return (v - (lo + hi) / 2) / half


# on the GPU, where ``dim`` is one chunk, one kernel detrends each block (detrend_block)
@register(
    kernels={"cpu": ("polyfit", "polyval_subtract"), "gpu": ("polyfit", "polyval_subtract", "detrend_block")},
    produces=Produces("{name} with its degree-{deg} polynomial trend along {dim} removed", standard_name=None),
)
def detrend(x: xr.DataArray, dim: Dim = "time", deg: Degree = 1) -> xr.DataArray:
    """Remove a least-squares polynomial trend along a dimension from every grid point, NaN-skipping.

    As ``x - xr.polyval(x[dim], x.polyfit(dim, deg).polyfit_coefficients)``: one tree
    reduction accumulates the normal equations of each point (sums of u^k and u^k x over its
    valid samples, u the coordinate scaled to [-1, 1]), a batched solve gives the
    coefficients, and one pass per chunk subtracts the trend. On the GPU, where ``dim`` is one
    chunk, one kernel per chunk does all three, one thread per grid point.

    A point with fewer than ``deg + 1`` valid samples has no unique fit and comes out all NaN
    (xarray's least squares would return a minimum-norm fit there).
    """
    if not _is_int(deg) or deg < 0:
        raise InputError(f"deg must be a non-negative integer, got {deg!r}")
    deg = int(deg)
    data, eager = _as_dask(x)
    dim = _axis_of(x, dim)
    _check(detrend.op, x, dim=dim, deg=deg)
    axis = x.get_axis_num(dim)
    backend = backend_of(data)
    u = _trend_coordinate(x, dim).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    u_chunks = tuple(c if i == axis else (1,) for i, c in enumerate(data.chunks))
    u = to_backend(da.from_array(u, chunks=u_chunks), backend)
    out_dtype = float_dtype(x.dtype)
    op = detrend.op
    if backend == "gpu" and len(data.chunks[axis]) == 1:
        result = da.map_blocks(
            op.kernel("detrend_block", backend), data, u, axis=axis, deg=deg, out_dtype=out_dtype, dtype=out_dtype,
            meta=meta(backend, out_dtype, x.ndim),
        )
        return _finish(x, result, eager)
    # coefficients c_0..c_deg stacked along dim, as the output of one tree reduction
    fit = agg.polyfit(axis, deg)
    coefs = agg.reduce(
        data, fit, (axis,), kernel=op.kernel(fit.chunk, backend), dtype=np.float64, weights=u, keepdims=True,
        output_size=deg + 1,
    )
    coefs = [coefs[tuple(slice(k, k + 1) if i == axis else slice(None) for i in range(x.ndim))] for k in range(deg + 1)]
    kernel = op.kernel("polyval_subtract", backend)
    result = da.map_blocks(
        kernel, spill.second_pass(data, *coefs), u, *coefs, axis=axis, out_dtype=out_dtype, dtype=out_dtype, meta=meta(backend, out_dtype, x.ndim)
    )
    return _finish(x, result, eager)


# --- quantile ------------------------------------------------------------------------------------

QUANTILE_CHUNK_BYTES = 256 * 2**20  # per input chunk, in core (the kernel's temporaries are a few slabs)
# out of core, a chunk is at most this share of the memory budget: one slab of the grid is held
# while it is gathered, and a thread holds the chunk and the input block it is cut from
QUANTILE_BUDGET_SHARE = 16


def _shared_layers(data: da.Array, axis: int) -> list:
    """The layers of ``data``'s graph that its copies may share, as collections for
    :func:`dask.graph_manipulation.clone` to omit: arrays shorter than ``data`` along ``axis``
    (a reduction's steps and results, as a detrend's coefficients) and what is not an array
    (a store's handle, the checkpoint a second pass waits on), as dask records them on each layer."""
    from dask.delayed import Delayed

    graph = data.__dask_graph__()
    shared = []
    for name, layer in graph.layers.items():
        shape = (getattr(layer, "collection_annotations", None) or {}).get("shape")
        if not shape or len(shape) != data.ndim or shape[axis] < data.shape[axis]:
            shared.append(Delayed(name, graph, layer=name))
    return shared


def _cut_copy(block, axis: int, start: int, stop: int):
    """A copy of ``block`` from ``start`` to ``stop`` along ``axis`` (a view would keep the
    whole block alive)."""
    return block[(slice(None),) * axis + (slice(start, stop),)].copy()


def _after(value, _):
    """``value``, once the task named by the second argument is done."""
    return value


def _fused_after(part: da.Array, before: da.Array | None) -> da.Array:
    """``part`` with each block's chain of tasks (read, map, cut) fused into one task, started
    only once ``before`` is computed: fused, a block is read and cut in one go (left apart, dask
    reads every block of the slab before cutting any); the declarations of its layers for the
    memory plan are kept on the fused layer (the most of each)."""
    from dask._task_spec import Task, TaskRef
    from dask.graph_manipulation import checkpoint
    from dask.highlevelgraph import HighLevelGraph

    found = [declared(layer) for layer in part.__dask_graph__().layers.values()]
    with dask.config.set({"optimization.fuse.active": True}):
        (part,) = dask.optimize(part)
    keep = {k: max(d[k] for d in found if k in d) for k in ("partial_bytes", "extra_blocks") if any(k in d for d in found)}
    if before is not None:
        done = checkpoint(before)
        dsk = dict(part.__dask_graph__())
        for key in list(_keys(part)):
            dsk[key] = Task(key, _after, dsk[key], TaskRef(done.key))
        graph = HighLevelGraph.from_collections(part.name, dsk, dependencies=[done])
        part = da.Array(graph, part.name, part.chunks, meta=part._meta)
    return declare(part, **keep) if keep else part


def _keys(a: da.Array):
    from dask.core import flatten

    return flatten(a.__dask_keys__())


def _by_slabs(data: da.Array, axis: int, chunks, apply, cut: int, out_axis: int) -> da.Array:
    """``apply`` over ``data`` rechunked to ``chunks`` (``axis`` whole), one slab of the grid (a
    chunk along ``cut``, the one axis ``chunks`` split) after another, concatenated along
    ``out_axis`` of the results.

    A plain rechunk computes each input block once and keeps its pieces for every slab until the
    last slab is gathered: the whole input. Here each slab comes from its own copy of ``data``'s
    graph (:func:`pipeline.exec.clone.clone`), computed again from the source and cut to the
    slab block by block, and started once the slab before it is done (:func:`_fused_after`), so
    that one slab is held at a time. What the copies share (:func:`_shared_layers`: a detrend's coefficients) is
    computed once."""
    from ..exec.clone import clone

    if len(chunks[cut]) == 1:  # nothing to cut along: one chunk holds the input
        return apply(declare(data.rechunk(chunks), held_bytes=int(data.nbytes)))
    keep = _shared_layers(data, axis)
    results, start = [], 0
    for n in chunks[cut]:
        copy = clone(data, omit=keep, seed=("quantile-slab", start))
        if len(data.chunks[cut]) == 1:  # cut block by block, in the tasks that compute the blocks
            slab_chunks = tuple((n,) if i == cut else c for i, c in enumerate(data.chunks))
            part = copy.map_blocks(_cut_copy, cut, start, start + n, chunks=slab_chunks, dtype=data.dtype)
            # one fused task reads a block, detrends it and cuts the slab: measured at about five
            # blocks alive at its peak (303 MB blocks), two more than BLOCKS_PER_THREAD
            declare(part, extra_blocks=2)
        else:
            index = tuple(slice(start, start + n) if i == cut else slice(None) for i in range(data.ndim))
            part = copy[index].map_blocks(np.copy, dtype=data.dtype)
        part = _fused_after(part, results[-1] if results else None)
        part = part.rechunk(tuple(c if i != cut else (n,) for i, c in enumerate(chunks)))
        if not results:  # held one at a time: counted once, the first (the largest)
            declare(part, held_bytes=int(part.nbytes))
        results.append(apply(part))
        start += n
    return da.concatenate(results, axis=out_axis)


def _quantile_cell_method(x: xr.DataArray, p: dict) -> str:
    """CF's median, minimum or maximum where ``q`` is one of those; "percentile" otherwise, as CF
    Appendix E has no method for other quantiles (their values are in the "quantile" coordinate)."""
    named = {0.0: "minimum", 0.5: "median", 1.0: "maximum"}
    method = named.get(float(p["q"]), "percentile") if np.ndim(p["q"]) == 0 else "percentile"
    return f"{p['dim']}: {method}"


def _quantile_long_name(x: xr.DataArray, p: dict) -> str:
    if np.ndim(p["q"]) == 0:
        return f"{100 * float(p['q']):g}th percentile of {_name(x)} along {p['dim']}"
    return f"percentiles of {_name(x)} along {p['dim']}"


@register(
    kernels=("quantile",),
    produces=Produces(_quantile_long_name, cell_methods=_quantile_cell_method),
)
def quantile(x: xr.DataArray, q: Quantiles, dim: Dim = "time") -> xr.DataArray:
    """Quantiles along a dimension, NaN-skipping, as x.quantile(q, dim) (linear interpolation).

    ``dim`` becomes one chunk (the other dimensions are split to keep chunks near 256 MiB), and
    each chunk is sorted and interpolated on its own. A list ``q`` gives a leading "quantile"
    dimension; a scalar ``q`` gives a scalar "quantile" coordinate, as in xarray.
    """
    scalar = np.ndim(q) == 0
    qs = tuple(float(v) for v in np.atleast_1d(np.asarray(q, dtype=np.float64)))
    if not qs or not all(0.0 <= v <= 1.0 for v in qs):
        raise InputError(f"quantiles q must lie in [0, 1], got {q!r}")
    data, eager = _as_dask(x)
    dim = _axis_of(x, dim)
    _check(quantile.op, x, q=q, dim=dim)
    axis = x.get_axis_num(dim)
    budget = memory_budget(backend_of(data))
    out_of_core = len(data.chunks[axis]) > 1 and is_out_of_core(data.nbytes, backend_of(data))
    # out of core, slabs of the grid cut along one axis only (the outermost): a chunk is a slab
    cut = next((i for i in range(x.ndim) if i != axis), None) if out_of_core else None
    chunks = da.core.normalize_chunks(
        tuple(-1 if i == axis or cut not in (None, i) else "auto" for i in range(x.ndim)),
        data.shape,
        limit=min(QUANTILE_CHUNK_BYTES, budget // QUANTILE_BUDGET_SHARE) if out_of_core else QUANTILE_CHUNK_BYTES,
        dtype=data.dtype,
        previous_chunks=data.chunks,
    )
    out_dtype = float_dtype(x.dtype)
    backend = backend_of(data)

    def apply(gathered):
        return gathered.map_blocks(
            quantile.op.kernel("quantile", backend),
            q=qs,
            axis=axis,
            out_dtype=out_dtype,
            drop_axis=axis,
            new_axis=0,
            chunks=((len(qs),), *(c for i, c in enumerate(gathered.chunks) if i != axis)),
            dtype=out_dtype,
            meta=meta(backend, out_dtype, x.ndim),
        )

    if len(data.chunks[axis]) == 1:
        result = apply(data.rechunk(chunks))
    elif out_of_core:  # one slab of the grid at a time, each computed again
        result = _by_slabs(data, axis, chunks, apply, cut, out_axis=cut + 1 if cut < axis else cut)
    else:  # every output chunk takes a piece of every input block: the whole input stays alive
        result = apply(declare(data.rechunk(chunks), held_bytes=int(data.nbytes)))
    dims = [d for d in x.dims if d != dim]
    # as xarray: coordinates along dim go, and so do scalar ones
    coords = {k: v for k, v in x.coords.items() if v.dims and dim not in v.dims}
    if scalar:
        result, coords["quantile"] = result[0], qs[0]
    else:
        dims, coords["quantile"] = ["quantile", *dims], np.array(qs)
    return _finish(x, result, eager, dims=dims, coords=coords, name=x.name)


# --- saturation vapour pressure ------------------------------------------------------------------

_SVP_METHODS = ("sonntag90", "tetens30")
_KELVIN = {"K", "kelvin", "Kelvin", "degK", "deg_K", "degree_K", "degrees_K"}
_CELSIUS = {
    "degC", "°C", "C", "celsius", "Celsius", "deg_C", "degree_C", "degrees_C", "degree_Celsius", "degrees_Celsius"
}


@register(
    kernels=("saturation_vapor_pressure",),
    produces=Produces('saturation vapour pressure over water ("{method}" method)', units="Pa", standard_name=None),
)
def saturation_vapor_pressure(
    x: xr.DataArray, method: Literal["sonntag90", "tetens30"] = "sonntag90"
) -> xr.DataArray:
    """Saturation vapour pressure over water (Pa) from temperature, as xclim.indices.saturation_vapor_pressure.

    ``x`` is in K or degC (its ``units`` attribute says which). The formula is xclim's for
    ``method`` with its defaults (all water, no ice threshold), evaluated in float64 in one
    pass per chunk (one fused kernel on the GPU).
    """
    if method not in _SVP_METHODS:
        raise InputError(f"method must be one of {', '.join(_SVP_METHODS)}; got {method!r}")
    units = x.attrs.get("units")
    if units in _KELVIN:
        offset = 0.0
    elif units in _CELSIUS:
        offset = 273.15
    else:
        raise InputError(
            f"saturation_vapor_pressure needs a temperature in K or degC; {x.name!r} has units {units!r}"
        )
    data, eager = _as_dask(x)
    _check(saturation_vapor_pressure.op, x, method=method)
    backend = backend_of(data)
    out_dtype = float_dtype(x.dtype)
    result = data.map_blocks(
        saturation_vapor_pressure.op.kernel("saturation_vapor_pressure", backend),
        offset=offset,
        method=method,
        out_dtype=out_dtype,
        dtype=out_dtype,
        meta=meta(backend, out_dtype, x.ndim),
    )
    return _finish(x, result, eager)
