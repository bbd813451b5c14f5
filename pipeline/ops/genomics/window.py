"""Windows along the variants: sgkit's ``window_by_variant``, ``window_by_position``,
``window_by_interval`` and ``window_by_genome``.

A window is a range ``[window_start, window_stop)`` of variant indexes; windows never span
contigs (``window_contig``, the contig's index). The statistics of :mod:`.popgen` then sum their
per-variant values over each window (:func:`pipeline.reduce.windows.window_sums`) instead of
reporting them per variant.

The windows are small arrays in memory (NumPy), as sgkit makes them: how many there are depends on
the data, and every later graph needs their bounds. So these ops read ``variant_contig`` (and
``variant_position``), one integer per variant, when they are called; they compute nothing else.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ...backend import to_numpy
from ...errors import InputError
from ..registry import register
from . import specs
from ._dataset import merge as _merge, variable
from .variables import CONTIGS, V, WINDOW_BOUNDS, Declared, Dim, Read, add, read

COMMENTS = {  # sgkit's documentation of its variables, which it sets as their "comment"
    "window_contig": "The contig index of each window.",
    "window_start": "The index values of window start positions along the ``variants`` dimension.",
    "window_stop": "The index values of window stop positions along the ``variants`` dimension.",
}


def _positive(value, name: str, op: str, *, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise InputError(f"{op}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _values(ds: xr.Dataset, name: str, op: str) -> np.ndarray:
    """An integer variable along the variants, as NumPy."""
    return np.asarray(to_numpy(variable(ds, name, ("variants",), "iu", op=op).data)).astype(np.int64, copy=False)


def _contig_bounds(ds: xr.Dataset, variant_contig: str, op: str) -> np.ndarray:
    """Where each contig's variants start and stop: ``bounds[i]:bounds[i + 1]`` is contig ``i``
    (sgkit's ``_window_per_contig``: the contigs are those of the ``contigs`` dimension, or of
    ``contig_id`` or the ``contigs`` attribute, and the variants are sorted by contig). sgkit
    reads the variable ``variant_contig`` whatever the parameter names; the parameter is
    honoured here."""
    if "contigs" in ds.sizes:
        n_contigs = ds.sizes["contigs"]
    elif "contig_id" in ds:
        n_contigs = ds["contig_id"].size
    elif "contigs" in ds.attrs:
        n_contigs = len(ds.attrs["contigs"])
    else:
        raise InputError(f"{op}: the dataset names no contigs (no contig_id variable, contigs dimension or attribute)")
    contig = _values(ds, variant_contig, op)
    if np.any(np.diff(contig) < 0):
        raise InputError(f"{op}: variable {variant_contig!r} must be sorted (the variants in contig order)")
    if contig.size and (contig[0] < 0 or contig[-1] >= n_contigs):
        raise InputError(f"{op}: variable {variant_contig!r} has values outside 0..{n_contigs - 1} (the dataset's contigs)")
    return np.append(np.searchsorted(contig, np.arange(n_contigs)), contig.size)


def _windows(ds: xr.Dataset, bounds: np.ndarray, windows_of, merge: bool) -> xr.Dataset:
    contigs, starts, stops = [], [], []
    for i in range(len(bounds) - 1):
        s, e = windows_of(int(bounds[i]), int(bounds[i + 1]))
        starts.append(np.asarray(s, dtype=np.int64))
        stops.append(np.asarray(e, dtype=np.int64))
        contigs.append(np.full(len(starts[-1]), i, dtype=np.int64))
    new = xr.Dataset(
        {
            name: ("windows", np.concatenate(v) if v else np.zeros(0, np.int64), {"comment": COMMENTS[name]})
            for name, v in (("window_contig", contigs), ("window_start", starts), ("window_stop", stops))
        }
    )
    return _merge(ds, new, merge)


@register(kernels=(), dataset=True, variables=Declared(
    needs=(CONTIGS, read(specs.variant_contig_spec, "{variant_contig}")),
    adds=WINDOW_BOUNDS,
))
def window_by_variant(
    ds: xr.Dataset,
    *,
    size: int,
    step: int | None = None,
    variant_contig: str = "variant_contig",
    merge: bool = True,
) -> xr.Dataset:
    """Windows of ``size`` variants, one starting every ``step`` variants (default ``size``) from
    the first variant of each contig; the last windows of a contig are cut at its end.

    Returns ``window_contig``, ``window_start`` and ``window_stop`` (windows), int64, merged into
    ``ds`` (``merge=True``) or alone.
    """
    op = "window_by_variant"
    size = _positive(size, "size", op)
    step = _positive(step, "step", op, none=True) or size
    bounds = _contig_bounds(ds, variant_contig, op)

    def windows_of(start: int, stop: int):
        starts = np.arange(start, stop, step)
        return starts, np.clip(starts + size, start, stop)

    return _windows(ds, bounds, windows_of, merge)


@register(kernels=(), dataset=True, variables=Declared(
    # unsigned positions too, where sgkit's spec says signed
    needs=(CONTIGS, read(specs.variant_contig_spec, "{variant_contig}"), Read("{variant_position}", (V,), "iu"),
           Read("{window_start_position}", (V,), "iu")),
    adds=WINDOW_BOUNDS,
))
def window_by_position(
    ds: xr.Dataset,
    *,
    size: int,
    step: int | None = None,
    offset: int = 0,
    variant_contig: str = "variant_contig",
    variant_position: str = "variant_position",
    window_start_position: str | None = None,
    merge: bool = True,
) -> xr.Dataset:
    """Windows of ``size`` base pairs: starting at ``offset``, ``offset + step``, ... (``step``
    defaults to ``size``) up to the last variant's position in each contig, or, given
    ``window_start_position`` (a variable along the variants, e.g. ``"variant_position"`` for
    windows around each variant), at each of its values plus ``offset``. A window holds the
    variants whose position p satisfies ``start <= p < start + size``; positions must not
    decrease within a contig.

    Returns ``window_contig``, ``window_start`` and ``window_stop`` (windows), int64, merged into
    ``ds`` (``merge=True``) or alone.
    """
    op = "window_by_position"
    if step is not None and window_start_position is not None:
        raise InputError(f"{op}: only one of step or window_start_position may be given")
    size = _positive(size, "size", op)
    step = _positive(step, "step", op, none=True) or size
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise InputError(f"{op}: offset must be an integer, got {offset!r}")
    bounds = _contig_bounds(ds, variant_contig, op)
    positions = _values(ds, variant_position, op)
    starts_at = _values(ds, window_start_position, op) if window_start_position is not None else None
    for i in range(len(bounds) - 1):
        if np.any(np.diff(positions[bounds[i] : bounds[i + 1]]) < 0):
            raise InputError(f"{op}: variable {variant_position!r} decreases within contig {i}")

    def windows_of(start: int, stop: int):
        pos = positions[start:stop]
        if starts_at is None:
            if pos.size == 0:  # sgkit fails on a contig without variants (it reads pos[-1]); no windows
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            # as sgkit: windows start at offset + k * step while below the last position + offset
            # (positions are 1-based, so the first window with offset 0 covers 0..size-1)
            pos_starts = np.arange(offset, pos[-1] + offset, step)
        else:
            pos_starts = starts_at[start:stop] + offset
        return np.searchsorted(pos, pos_starts) + start, np.searchsorted(pos, pos_starts + size) + start

    return _windows(ds, bounds, windows_of, merge)


def window_by_interval(
    ds: xr.Dataset,
    *,
    variant_contig: str = "variant_contig",
    variant_position: str = "variant_position",
    interval_contig_name: str = "interval_contig_name",
    interval_start: str = "interval_start",
    interval_stop: str = "interval_stop",
    merge: bool = True,
) -> xr.Dataset:
    """One window for each interval ``[interval_start, interval_stop)`` of positions on the contig
    named ``interval_contig_name`` (names of ``contig_id``, else of the ``contigs`` attribute):
    the variants whose position lies in it. Intervals are taken contig by contig in the order of
    the dataset's contigs, and in their own order within a contig; an interval holding no variant
    gives no window, as sgkit. Positions must not decrease within a contig.

    Returns ``window_contig``, ``window_start`` and ``window_stop`` (windows), int64, merged into
    ``ds`` (``merge=True``) or alone.
    """
    op = "window_by_interval"
    bounds = _contig_bounds(ds, variant_contig, op)
    positions = _values(ds, variant_position, op)
    names = variable(ds, interval_contig_name, op=op)
    if names.ndim != 1 or names.dtype.kind not in "SUO":
        raise InputError(f"{op}: variable {interval_contig_name!r} must be one dimension of contig names (strings), "
                         f"got {names.ndim} dimensions of {names.dtype}")
    starts, stops = (variable(ds, n, names.dims, "i", op=op) for n in (interval_start, interval_stop))
    names = np.array(_texts(np.asarray(to_numpy(names.data))), dtype=object)
    starts, stops = (np.asarray(to_numpy(x.data)).astype(np.int64) for x in (starts, stops))
    contigs = _contig_names(ds, op)
    unknown = sorted(set(names) - set(contigs))
    if unknown:
        raise InputError(f"{op}: variable {interval_contig_name!r} names contigs the dataset does not have: "
                         f"{', '.join(unknown[:5])} (its contigs: {', '.join(contigs[:10])})")
    for i in range(len(bounds) - 1):
        if np.any(np.diff(positions[bounds[i] : bounds[i + 1]]) < 0):
            raise InputError(f"{op}: variable {variant_position!r} decreases within contig {i}")
    order = iter(contigs)

    def windows_of(start: int, stop: int):
        on = names == next(order)
        pos = positions[start:stop]
        s = np.searchsorted(pos, starts[on]) + start
        e = np.searchsorted(pos, stops[on]) + start
        return s[s != e], e[s != e]

    return _windows(ds, bounds, windows_of, merge)


def _contig_names(ds: xr.Dataset, op: str) -> list[str]:
    """The contigs' names, in the order of their indexes: ``contig_id``, else the ``contigs``
    attribute (as sgkit's ``get_contigs``)."""
    if "contig_id" in ds:
        values = np.asarray(to_numpy(ds["contig_id"].data))
    elif "contigs" in ds.attrs:
        values = np.asarray(ds.attrs["contigs"])
    else:
        raise InputError(f"{op}: the dataset names no contigs (no contig_id variable or contigs attribute)")
    return _texts(values)


def _texts(values: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values.tolist()]


@register(kernels=(), dataset=True, variables=Declared(
    needs=(Dim(V),),
    adds=(add(specs.window_start_spec), add(specs.window_stop_spec)),
))
def window_by_genome(ds: xr.Dataset, *, merge: bool = True) -> xr.Dataset:
    """One window of every variant, for statistics of the whole genome: ``window_start`` and
    ``window_stop`` (windows), int64, and no ``window_contig`` (as sgkit)."""
    if not isinstance(ds, xr.Dataset) or "variants" not in ds.sizes:
        raise InputError("window_by_genome: the dataset has no variants dimension")
    new = xr.Dataset(
        {
            name: ("windows", np.array([v], dtype=np.int64), {"comment": COMMENTS[name]})
            for name, v in (("window_start", 0), ("window_stop", ds.sizes["variants"]))
        }
    )
    return _merge(ds, new, merge)


def has_windows(ds: xr.Dataset) -> bool:
    """Whether ``ds`` holds windows (sgkit's test: ``window_start`` and ``window_stop``)."""
    return "window_start" in ds and "window_stop" in ds


__all__ = ["window_by_genome", "window_by_interval", "window_by_position", "window_by_variant"]
