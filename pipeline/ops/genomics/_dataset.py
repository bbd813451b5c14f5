"""What every genomics op does around its graph: find its variables, check them, pick the
backend, and merge its results as sgkit does."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import xarray as xr

from ...backend import backend_of
from ...deferred import module as _deferred
from ...errors import InputError

da = _deferred("dask.array")  # imported when the first graph is built


def variable(ds: xr.Dataset, name: str, dims: tuple[str, ...] | None = None, kind: str | None = None, *, op: str) -> xr.DataArray:
    """``ds[name]``, checked: InputError naming the op, the variable and what was expected where
    it is missing, has other dimensions, or another kind of values (``kind``: NumPy kind letters,
    "i" for integers, "iu", "f", "b"...)."""
    if not isinstance(ds, xr.Dataset):
        raise InputError(f"{op}: expected an xarray.Dataset, got {type(ds).__name__}")
    if name not in ds.variables:
        raise InputError(
            f"{op}: the dataset has no variable {name!r} "
            f"(its variables: {', '.join(map(str, ds.data_vars)) or 'none'})"
        )
    x = ds[name]
    if dims is not None and tuple(x.dims) != tuple(dims):
        raise InputError(f"{op}: variable {name!r} has dimensions {tuple(map(str, x.dims))}, expected {tuple(dims)}")
    if kind is not None and x.dtype.kind not in kind:
        raise InputError(f"{op}: variable {name!r} has values of type {x.dtype}, expected {_kinds(kind)}")
    return x


def _kinds(kind: str) -> str:
    names = {"i": "signed integers", "u": "unsigned integers", "f": "floats", "b": "booleans"}
    return " or ".join(names.get(k, k) for k in kind)


def backend_of_dataset(x: xr.DataArray) -> str:
    """The backend ("cpu" or "gpu") of a variable's data (its Dask ``_meta``, or the array)."""
    return backend_of(x.data)


def as_dask(x: xr.DataArray, chunks=None) -> "da.Array":
    """``x``'s data as a Dask array (an in-memory array becomes one block, or ``chunks``)."""
    if isinstance(x.data, da.Array):
        return x.data if chunks is None else x.data.rechunk(chunks)
    return da.from_array(x.data, chunks=-1 if chunks is None else chunks, asarray=False)


def keep_in_blocks(ds: xr.Dataset, dim: str, keep: np.ndarray, op) -> xr.Dataset | None:
    """``ds`` with the positions along ``dim`` where ``keep`` is True, selected inside each block:
    block ``i`` of every Dask variable becomes the kept part of block ``i``, one task that reads
    only it. Returns None where that would leave a block empty (the caller selects otherwise).

    ``ds.isel`` with an index array goes through dask's ``take``, which moves the kept positions
    into blocks of even size: tasks that gather from two neighbouring blocks, and on a cluster
    blocks crossing workers. Measured on two GPU workers (benchmarks/scaling.py, GWAS over 50 GB
    of genotypes): 21.6 GB moved between the workers and the run took 1.4x one worker's time; kept
    in their blocks, each worker's slab stays its own. In-memory variables are selected with isel."""
    lazy = {name: v for name, v in ds.variables.items() if dim in v.dims and isinstance(v.data, da.Array)}
    chunks = {v.chunks[v.get_axis_num(dim)] for v in lazy.values()}
    if len(chunks) > 1:  # variables chunked differently along dim: no common blocks
        return None
    out = ds.drop_vars(list(lazy)).isel({dim: np.flatnonzero(keep)}, missing_dims="ignore")
    if not lazy:
        return out
    (sizes,) = chunks
    ends = np.cumsum(sizes)
    kept = tuple(int(keep[e - n:e].sum()) for n, e in zip(sizes, ends))
    if 0 in kept:
        return None
    mask = da.from_array(np.asarray(keep, dtype=bool), chunks=(sizes,))
    for name, v in lazy.items():
        axis = v.get_axis_num(dim)
        index = tuple(range(v.ndim))
        take = op.kernel("take", backend_of(v.data))
        data = da.blockwise(_kept, index, v.data, index, mask, (axis,), take=take, axis=axis, adjust_chunks={axis: kept},
                            dtype=v.dtype, meta=v.data._meta, name=f"keep-{name}-{da.core.tokenize(v.data, keep)}")
        variable = xr.Variable(v.dims, data, v.attrs)
        out = out.assign_coords({name: variable}) if name in ds.coords else out.assign({name: variable})
    return out


def _kept(block, mask, *, take, axis: int):
    """The positions of ``block`` along ``axis`` where ``mask`` (host booleans) is True, gathered by
    the kernel ``take``."""
    if mask.all():
        return block
    return take(block, np.flatnonzero(mask), axis)


def keep_positions(ds: xr.Dataset, dim: str, keep: np.ndarray, op) -> xr.Dataset:
    """``ds`` with the positions along ``dim`` where ``keep`` is True: inside each block where
    none is left empty (:func:`keep_in_blocks`), else by ``isel`` and blocks of the input's size
    along ``dim``, not shrunken pieces of them. ``op``: the registered op that selects (its
    kernel ``take``)."""
    if not keep.any():
        raise InputError(f"{op.name}: no {dim} remain after the filters (all {keep.size} removed)")
    blocks = keep_in_blocks(ds, dim, keep, op)
    if blocks is not None:  # each block keeps its own: no task gathers from two blocks
        return blocks
    out = ds.isel({dim: np.flatnonzero(keep)})
    sizes = [max(v.chunksizes[dim]) for v in ds.data_vars.values() if dim in v.dims and v.chunks is not None]
    return _chunked_along(out, dim, max(sizes)) if sizes else out


def _chunked_along(ds: xr.Dataset, dim: str, size: int) -> xr.Dataset:
    """``ds.chunk({dim: size})`` without computing anything: xarray's ``chunk`` reads the first
    element of each array of objects to look for cftime dates (a block of a VCF's alleles and IDs
    read from the store while the graph is built)."""
    new = {}
    for name, v in ds.variables.items():
        if dim not in v.dims or name in ds.xindexes:
            continue
        if isinstance(v.data, da.Array):
            new[name] = v.copy(data=v.data.rechunk({v.get_axis_num(dim): size}))
        else:  # held in memory: nothing to read
            new[name] = v.chunk({dim: size})
    coords = {k: v for k, v in new.items() if k in ds.coords}
    return ds.assign_coords(coords).assign({k: v for k, v in new.items() if k not in coords})


def even_chunks(n: int, most: int) -> tuple[int, ...]:
    """``n`` split into the fewest chunks of at most ``most``, as even as can be (sizes differ by
    at most one): the tiles of an axis that an op works through at a bounded size."""
    parts = max(1, -(-n // max(1, most)))
    size, extra = divmod(n, parts)
    return tuple(size + 1 if i < extra else size for i in range(parts)) if n else (0,)


def upper_mirrored(r: "da.Array") -> "da.Array":
    """A square matrix of square tiles made symmetric from its tiles on and above the diagonal:
    tile (i, j) is ``r``'s for i <= j, else the transpose of ``r``'s tile (j, i). The tiles of
    ``r`` below the diagonal are never computed (for a symmetric product, half the work)."""
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    if r.ndim != 2 or r.chunks[0] != r.chunks[1]:
        raise ValueError(f"upper_mirrored needs square tiles, got chunks {r.chunks}")
    name = "upper-mirrored-" + tokenize(r.name)
    n = r.numblocks[0]
    dsk = {(name, i, j): (r.name, i, j) if i <= j else (_transposed, (r.name, j, i)) for i in range(n) for j in range(n)}
    return da.Array(HighLevelGraph.from_collections(name, dsk, dependencies=[r]), name, r.chunks, meta=r._meta)


def _transposed(block):
    return block.T


def merge(ds: xr.Dataset, new: xr.Dataset, merge: bool = True) -> xr.Dataset:
    """sgkit's ``conditional_merge_datasets``: the input with ``new``'s variables (replacing any of
    the same name) when ``merge``, else ``new`` alone."""
    if not merge:
        return new
    return ds.drop_vars([v for v in new.variables if v in ds.variables and v not in ds.dims], errors="ignore").merge(new)


def ensure_variables(ds: xr.Dataset, names: Iterable[str], compute) -> xr.Dataset:
    """``ds`` with the variables ``names``, computed by ``compute(ds)`` (another op) where any is
    missing: sgkit's ``define_variable_if_absent``."""
    names = list(names)
    if all(n in ds.variables for n in names):
        return ds
    return compute(ds)


__all__ = ["as_dask", "backend_of_dataset", "ensure_variables", "even_chunks", "keep_positions", "merge", "upper_mirrored", "variable"]
