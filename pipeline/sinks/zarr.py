"""Zarr out: all or nothing, never over data pipeline did not write, resumable, verifiable.

A store is written to a hidden sibling directory, ``.NAME.partial``, and renamed into place only
when complete, so a failed or interrupted run never leaves a store that looks finished. While it
writes, a run holds an exclusive lock (``flock``) on the sibling file ``.NAME.lock``: a second
run to the same output fails at once, and a partial store whose lock is free was left by a run
that died (SIGKILL releases the lock too), so the next run removes it, or resumes from it.

Every store pipeline writes carries a manifest, ``.pipeline.json`` in its root (zarr readers
ignore it): the version of pipeline, the kind of store, when it was made, the fingerprint of what
was written, and a sha256 digest of each data variable. ``mode="overwrite"`` replaces only a
store with such a manifest; a sink that is, holds, or lies inside an input is refused in every
mode. Chunks are written with Zarr v3's ``crc32c`` codec after the compressor, so that any zarr
reader detects a corrupted chunk instead of returning its garbage.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import dask
import numpy as np
import xarray as xr

from .. import backend as B
from ..deferred import module as _deferred
from ..errors import InputError, chunk_error
from ..exec.compute import compute, compute_threads, distributed_not_imported
from ..sources import is_url

da = _deferred("dask.array")  # imported when the first graph is built

MANIFEST = ".pipeline.json"
DIGEST_RULE = (
    "sha256 of the concatenated sha256 digests of each stored chunk's values (each shard's, where "
    "sharded) as C-ordered little-endian bytes (variable-length strings: each value's UTF-8 bytes after "
    "their count as a little-endian uint64), in C order of the chunk grid"
)


# --- what a write returns -------------------------------------------------------------------------


@dataclass
class Written:
    """A store ``write_zarr`` wrote: its path (this object stands for it where a path is expected),
    each data variable's digest, and how many chunks this run computed and kept from a partial."""

    path: Path
    digests: dict[str, str] = field(default_factory=dict)
    chunks_written: int = 0
    chunks_kept: int = 0

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, other) -> Path:
        return self.path / other

    def __getattr__(self, name):  # .exists(), .name, .parent, ... of the path
        if name.startswith("__") or name == "path":
            raise AttributeError(name)
        return getattr(self.path, name)


# --- the dataset as it is written -----------------------------------------------------------------


def _regular(data: da.Array) -> da.Array:
    """Zarr needs equal chunks (the last may be shorter): rechunk where a graph made them uneven."""
    target = []
    for c in data.chunks:
        regular = len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0])
        target.append(c if regular else max(c))
    return data if all(isinstance(t, tuple) for t in target) else data.rechunk(tuple(target))


def to_host_dataset(obj: xr.Dataset | xr.DataArray, name: str | None = None) -> xr.Dataset:
    """A Dataset whose variables are Dask arrays of NumPy chunks, ready for ``to_zarr``."""
    if isinstance(obj, xr.DataArray):
        obj = obj.to_dataset(name=name or obj.name or "result")
    out = obj.copy()
    for k, v in list(out.variables.items()):
        data = v.data
        if isinstance(data, da.Array):
            data = _regular(B.to_backend(data, "cpu"))
        elif B.is_cupy(data):
            data = B.to_numpy(data)
        out[k] = xr.Variable(v.dims, data, v.attrs)  # encodings of the source do not apply
    return out


def _encodings(ds: xr.Dataset, encoding: Mapping | None, zarr_format: int) -> dict:
    """Each variable's encoding: the caller's, and by default (Zarr v3, no codecs or shards given)
    the default compressor followed by ``crc32c``; a Dask variable's chunks are its blocks, so
    that each block is one chunk (or shard) written by one task, and resumed one by one."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    out = {}
    for k, v in ds.variables.items():
        enc = dict((encoding or {}).get(k, {}))
        if zarr_format == 3 and not {"compressors", "shards"} & set(enc):
            enc["compressors"] = [ZstdCodec(), Crc32cCodec()]
        if isinstance(v.data, da.Array) and "chunks" not in enc and "shards" not in enc:
            enc["chunks"] = tuple(c[0] for c in v.data.chunks)
        out[k] = enc
    return out


def _aligned(data: da.Array, unit: tuple[int, ...]) -> da.Array:
    """``data`` with one block per stored chunk (or shard): no two tasks write into one file."""
    target = da.core.normalize_chunks(unit, data.shape)
    return data if data.chunks == target else data.rechunk(unit)


def _encoded(var: xr.Variable, name: str, enc: dict) -> xr.Variable:
    """The variable as xarray stores it (CF encodings applied: the values the digest covers)."""
    from xarray.backends.zarr import encode_zarr_variable

    var = var.copy(deep=False)
    var.encoding = {k: v for k, v in enc.items() if k in ("_FillValue", "dtype", "scale_factor", "add_offset", "units", "calendar")}
    return encode_zarr_variable(var, name=name, zarr_format=3)


# --- digests ----------------------------------------------------------------------------------


def block_sha(values: np.ndarray) -> str:
    """The digest of one stored chunk's values (:data:`DIGEST_RULE`), hashed where they lie: a
    copy of a 300 MB block costs as much as the hash. Variable-length strings (object arrays, NumPy's
    StringDType: the sample and variant names of VCF Zarr stores) are hashed by value, not by the
    pointers their arrays hold."""
    if values.dtype.kind in "OT":
        h = hashlib.sha256()
        for v in np.asarray(values).reshape(-1).tolist():
            b = v if isinstance(v, bytes) else str(v).encode()
            h.update(len(b).to_bytes(8, "little") + b)
        return h.hexdigest()
    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return hashlib.sha256(values.reshape(-1).view(np.uint8)).hexdigest()


def _combine(block_digests: Iterable[str]) -> str:
    h = hashlib.sha256()
    for d in block_digests:
        h.update(bytes.fromhex(d))
    return "sha256:" + h.hexdigest()


def _grid(shape: tuple[int, ...], unit: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """The regions of the chunk grid, in C order."""
    counts = [-(-n // u) if n else 0 for n, u in zip(shape, unit)]
    return [tuple(slice(i * u, min((i + 1) * u, n)) for i, u, n in zip(idx, unit, shape)) for idx in np.ndindex(*counts)]


def _unit(arr) -> tuple[int, ...]:
    """The stored write unit of a zarr array: its shard, or its chunk."""
    return tuple(arr.shards or arr.chunks)


def _read_sha(array_dir: str, region: tuple[slice, ...], variable: str) -> str:
    """The digest of one stored chunk, read back and decoded (a corrupt chunk fails its checksum)."""
    import zarr

    arr = zarr.open_array(array_dir, mode="r")
    try:
        values = arr[region]
    except Exception as e:  # named as reading names it: the store, the variable, the chunk and its file
        raise chunk_error(os.path.dirname(array_dir), variable, region, e, arr) from None
    return block_sha(np.asarray(values))


def store_with_zarr(block: np.ndarray, region: tuple[slice, ...], array_dir: str) -> str:
    """Store one block as its own chunk (or shard) through zarr's codecs; return its digest."""
    import zarr

    arr = zarr.open_array(array_dir, mode="r+", config={"write_empty_chunks": True})
    arr[region] = block
    return block_sha(block)


def _write_block(block: np.ndarray, block_info=None, *, array_dir: str, store=store_with_zarr) -> np.ndarray:
    """Write one block as its own chunk (or shard) by ``store``; return its digest, shaped as one
    block of the grid of digests."""
    region = tuple(slice(a, b) for a, b in block_info[0]["array-location"])
    return np.full((1,) * block.ndim, store(block, region, array_dir), dtype="<U64")


def _check_block(array_dir: str, region: tuple[slice, ...], variable: str) -> str | None:
    """The digest of a chunk a previous run wrote, or None when it is not there or not sound."""
    import zarr

    arr = zarr.open_array(array_dir, mode="r")
    idx = tuple(s.start // u for s, u in zip(region, _unit(arr)))
    if not os.path.exists(os.path.join(array_dir, *arr.metadata.encode_chunk_key(idx).split("/"))):
        return None
    try:
        return _read_sha(array_dir, region, variable)
    except InputError:
        return None


# --- the target: marks, inputs, locks, leftovers --------------------------------------------------


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The manifest of a store pipeline wrote, or None."""
    try:
        with open(Path(path) / MANIFEST) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "pipeline" in data else None


def _write_manifest(path: Path, **fields) -> None:
    from .._version import __version__

    data = {"pipeline": __version__, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **fields}
    tmp = path / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path / MANIFEST)


def _siblings(final: Path) -> tuple[Path, Path]:
    """The partial store and the lock file of ``final``."""
    return final.parent / f".{final.name}.partial", final.parent / f".{final.name}.lock"


def _overlap(target: str, other: str) -> str | None:
    """How ``target`` and ``other`` (real paths) overlap, in words, or None."""
    if target == other:
        return "is"
    if os.path.commonpath([target, other]) == other:
        return "lies inside"
    if os.path.commonpath([target, other]) == target:
        return "contains"
    return None


def _lock_holder(lock: Path) -> dict | None:
    """What the lock file says of a run that died holding it (its lock free), else None."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return None  # held: a live run
    finally:
        os.close(fd)
    try:
        return json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _stale_reservation(final: Path) -> bool:
    """True when ``final`` is the empty directory a ``mode="fail"`` run reserved and then died."""
    holder = _lock_holder(_siblings(final)[1])
    return bool(holder and holder.get("reserved")) and final.is_dir() and not any(final.iterdir())


def check_target(path: str | os.PathLike, *, mode: str, protect: Iterable[str | os.PathLike] = (), kind: str = "output") -> None:
    """Refuse, with an InputError that says why and what to do, a sink that would destroy data.

    The sink may not be, contain, or lie inside any of ``protect`` (the inputs), in any mode.
    With ``mode="fail"`` it may not exist; with ``mode="overwrite"`` an existing path is replaced
    only when it is a store pipeline wrote (its manifest) of the same ``kind``, or an empty
    directory.
    """
    if mode not in ("overwrite", "fail"):
        raise InputError(f"mode must be 'overwrite' or 'fail', got {mode!r}")
    if is_url(path):
        raise InputError(f"{path}: writing to URLs is not supported; write to a local or shared file system path")
    target = os.path.realpath(path)
    for p in protect:
        if is_url(p):
            continue
        how = _overlap(target, os.path.realpath(p))
        if how:
            raise InputError(f"{path}: the output {how} the input {p}; write the output somewhere else (--output)")
    final = Path(path)
    if not os.path.lexists(final) or _stale_reservation(final):
        return
    if mode == "fail":
        raise InputError(f"{path}: already exists; remove it, write elsewhere, or overwrite it (mode 'overwrite', --overwrite)")
    if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
        return
    manifest = read_manifest(final) if final.is_dir() and not final.is_symlink() else None
    if manifest is None:
        what = "a Zarr store pipeline did not write" if (final / "zarr.json").exists() or (final / ".zgroup").exists() else (
            "a directory that is not a pipeline store" if final.is_dir() else "a file")
        raise InputError(
            f"{path}: exists and is {what} (no {MANIFEST}); pipeline replaces only stores it wrote.\n"
            f"  remove it yourself if it may go, or write the output elsewhere"
        )
    if manifest.get("kind", "output") != kind:
        raise InputError(
            f"{path}: holds a {manifest.get('kind')} store, not a {kind} store; pipeline replaces only its own kind.\n"
            f"  remove it yourself if it may go, or write elsewhere"
        )


@contextlib.contextmanager
def _locked(final: Path):
    """Hold the exclusive lock of ``final`` for the block; yield what the last holder (a run that
    died) left in the lock file, or None. Another run holding it: InputError naming its pid."""
    lock = _siblings(final)[1]
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = {}
            with contextlib.suppress(OSError, ValueError):
                holder = json.loads(lock.read_text() or "{}")
            raise InputError(
                f"{final}: another run (pid {holder.get('pid', '?')} on {holder.get('host', '?')}) is writing this output; "
                f"wait for it to finish or stop it"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we opened it: lock the new one
    previous = None
    with contextlib.suppress(ValueError):
        previous = json.loads(os.pread(fd, 1 << 16, 0).decode() or "null")
    state = {"pid": os.getpid(), "host": os.uname().nodename}
    _note(fd, state)
    try:
        yield previous, lambda **kw: _note(fd, {**state, **kw})
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def _note(fd: int, state: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(state).encode(), 0)


def _clear_leftovers(final: Path, previous: dict | None, keep_partial: bool) -> None:
    """Remove what runs that died left (their lock is free, we hold it now): partial stores,
    old stores moved aside, and the empty directory a ``mode="fail"`` run reserved."""
    partial = _siblings(final)[0]
    for p in final.parent.glob(f".{final.name}.partial-*"):
        _remove(p, settle=0)
    for p in final.parent.glob(f".{final.name}.old-*"):
        _remove(p, settle=0)
    if partial.exists() and not keep_partial:
        _remove(partial, settle=0)
    if previous and previous.get("reserved") and final.is_dir() and not any(final.iterdir()):
        final.rmdir()


# --- writing --------------------------------------------------------------------------------------


def default_fingerprint(ds: xr.Dataset) -> str:
    """What a partial store must have been written from to be resumed: the dataset's token."""
    return dask.base.tokenize(ds)


def _resumable(partial: Path, fingerprint: str, ds: xr.Dataset) -> str | None:
    """Why the partial store cannot be resumed, or None when it can."""
    import zarr

    manifest = read_manifest(partial)
    if manifest is None:
        return "it has no manifest"
    if manifest.get("fingerprint") != fingerprint:
        return "it was written from another flow or source (fingerprint differs)"
    try:
        group = zarr.open_group(str(partial), mode="r")
        for k, v in ds.data_vars.items():
            if tuple(group[k].shape) != tuple(v.shape):
                return f"its variable {k!r} has another shape"
    except Exception as e:
        return f"it cannot be read ({type(e).__name__})"
    return None


def write_zarr(
    obj: xr.Dataset | xr.DataArray,
    path: str | os.PathLike,
    *,
    mode: str = "overwrite",
    name: str | None = None,
    zarr_format: int = 3,
    encoding: Mapping | None = None,
    progress: bool = False,
    protect: Iterable[str | os.PathLike] = (),
    resume: bool = False,
    fingerprint: str | None = None,
    kind: str = "output",
    store_block=store_with_zarr,
) -> Written:
    """Write ``obj`` to a Zarr store at ``path``, all or nothing; return a :class:`Written`.

    The store is written to ``.NAME.partial`` beside ``path`` and renamed to ``path`` once every
    chunk is written; an exception or an interrupt removes the partial store (with ``resume``, it
    is kept for the next run to complete). ``mode="overwrite"``
    replaces an existing store pipeline wrote (of the same ``kind``) only once the new one is
    complete; ``mode="fail"`` reserves ``path`` at the start (atomically) and refuses an existing
    one. ``protect``: the inputs, which the output may not be, contain or lie inside.

    ``resume=True`` continues from the partial store a killed run left, if it was written from
    the same ``fingerprint`` (default: the dataset's dask token): chunks found there are read
    back, checked and kept, and only the missing ones are computed. Each data variable's digest
    is computed by the tasks that write it (:data:`DIGEST_RULE`) and stored in the manifest.

    ``store_block(block, region, array_dir) -> digest`` stores each block in the partial store
    (default :func:`store_with_zarr`); a writer of its own chunk files passes its own.
    """
    check_target(path, mode=mode, protect=protect, kind=kind)
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = _siblings(final)[0]
    threads = compute_threads(obj)
    ds = to_host_dataset(obj, name)
    fingerprint = fingerprint or default_fingerprint(ds)
    with _locked(final) as (previous, note):
        why = _resumable(partial, fingerprint, ds) if resume and partial.exists() else None
        if why:
            warnings.warn(f"{partial}: not resumed, starting over: {why}", stacklevel=2)
        _clear_leftovers(final, previous, keep_partial=resume and why is None)
        # with resume, what a failed run wrote stays for the next run to complete
        with _published(path, final, partial, note, mode=mode, protect=protect, kind=kind, keep_on_failure=resume):
            written = _write(ds, partial, encoding, zarr_format, fingerprint, kind, progress, threads, fresh=not partial.exists(),
                             store_block=store_block)
    written.path = final
    return written


@contextlib.contextmanager
def staged(path: str | os.PathLike, *, mode: str = "fail", kind: str = "output", protect: Iterable[str | os.PathLike] = (), **manifest):
    """All or nothing for a store that another writer makes (bio2zarr, say): yields the hidden
    partial path beside ``path`` (``.NAME.partial``, not yet created), for the caller to write the
    whole store into; once the block ends without error, the manifest (``kind``, ``manifest``'s
    fields) is written into it and it is renamed into place. An exception or an interrupt
    removes the partial store. ``mode`` and ``protect`` as :func:`write_zarr`'s: an existing
    ``path`` is replaced only where pipeline wrote it (``mode="overwrite"``), and a run holds the
    lock of ``path`` while it writes."""
    check_target(path, mode=mode, protect=protect, kind=kind)
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = _siblings(final)[0]
    with _locked(final) as (previous, note):
        _clear_leftovers(final, previous, keep_partial=False)
        with _published(path, final, partial, note, mode=mode, protect=protect, kind=kind):
            yield partial
            if not partial.is_dir():
                raise RuntimeError(f"{partial}: the store was not written")
            _write_manifest(partial, kind=kind, complete=True, **manifest)


@contextlib.contextmanager
def _published(path, final: Path, partial: Path, note, *, mode: str, protect, kind: str, keep_on_failure: bool = False):
    """Under the lock of ``final`` (``note`` from :func:`_locked`): check the target again,
    reserve ``final`` atomically where ``mode`` is "fail", run the block that writes ``partial``,
    then rename it into place; on failure or interrupt, remove ``partial`` (unless
    ``keep_on_failure``) and the reservation. The one way :func:`write_zarr` and :func:`staged`
    put a store in place."""
    check_target(path, mode=mode, protect=protect, kind=kind)  # again, under the lock
    reserved = False
    try:
        if mode == "fail":
            try:
                os.mkdir(final)  # atomic: of two runs, one reserves the path
            except FileExistsError:
                raise InputError(f"{path}: already exists (another run created it meanwhile)") from None
            reserved = True
            note(reserved=True)
        yield
        if reserved:
            os.rename(partial, final)  # onto the empty reserved directory: atomic
        else:
            _replace(partial, final)
        note()
    except BaseException:
        if not keep_on_failure:
            _remove(partial)
        if reserved:
            with contextlib.suppress(OSError):
                final.rmdir()
        raise


def _write(ds, partial: Path, encoding, zarr_format, fingerprint, kind, progress, threads, fresh: bool, store_block=store_with_zarr) -> Written:
    """Write (or complete) the partial store and its manifest."""
    import zarr

    enc = _encodings(ds, encoding, zarr_format)
    if fresh:
        with warnings.catch_warnings(), distributed_not_imported():
            warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
            # the metadata only: the blocks are written below
            ds.to_zarr(partial, mode="w-", zarr_format=zarr_format, consolidated=True, encoding=enc, compute=False)
        _write_manifest(partial, kind=kind, fingerprint=fingerprint, complete=False)
    group = zarr.open_group(str(partial), mode="r")
    root = os.path.abspath(partial)
    todo, kept, digests, checks = [], {}, {}, []
    for k, v in ds.data_vars.items():
        array_dir = os.path.join(root, str(k))
        unit = _unit(group[k])
        regions = _grid(v.shape, unit)
        if not isinstance(v.data, da.Array):
            values = np.asarray(_encoded(v.variable, str(k), enc[k]).values)
            digests[k] = _combine(block_sha(values[r]) for r in regions)
            continue
        if not fresh:
            checks += [(k, i, dask.delayed(_check_block, pure=False)(array_dir, r, str(k))) for i, r in enumerate(regions)]
        todo.append((k, array_dir, unit, v))
    if checks:  # chunks a killed run wrote: read back and checked, in parallel
        found = compute([c for _, _, c in checks], threads=threads)
        for (k, i, _), sha in zip(checks, found):
            if sha is not None:
                kept.setdefault(k, {})[i] = sha
    tasks, where = [], []
    for k, array_dir, unit, v in todo:
        data = _aligned(_encoded(v.variable, str(k), enc[k]).data, unit)
        token = dask.base.tokenize(data, array_dir)
        shas = data.map_blocks(
            _write_block, array_dir=array_dir, store=store_block, dtype="<U64", chunks=tuple((1,) * n for n in data.numblocks),
            meta=np.empty((0,) * data.ndim, "<U64"), name=f"pipeline-write-{token}",
        )
        blocks = shas.to_delayed(optimize_graph=False).ravel()
        for i, b in enumerate(blocks):
            if i not in kept.get(k, {}):
                tasks.append(b)
                where.append((k, i))
    new = compute(tasks, progress=progress, threads=threads) if tasks else []
    per_var: dict = {k: dict(kept.get(k, {})) for k, *_ in todo}
    for (k, i), sha in zip(where, new):
        per_var[k][i] = str(np.asarray(sha).ravel()[0])
    for k, shas in per_var.items():
        digests[k] = _combine(shas[i] for i in range(len(shas)))
    written = Written(partial, {str(k): digests[k] for k in ds.data_vars}, len(tasks), sum(map(len, kept.values())))
    _write_manifest(
        partial, kind=kind, fingerprint=fingerprint, complete=True, digest=DIGEST_RULE, digests=written.digests,
        chunks={"written": written.chunks_written, "kept": written.chunks_kept},
    )
    return written


# --- verifying ------------------------------------------------------------------------------------


def verify(path: str | os.PathLike) -> dict[str, str]:
    """Recompute each variable's digest from the stored chunks and compare it with the manifest;
    return the digests. InputError naming the variable (and the chunk) when they differ or a
    chunk fails its checksum, or when ``path`` is not a complete store pipeline wrote."""
    import zarr

    manifest = read_manifest(path)
    if manifest is None:
        raise InputError(f"{path}: no {MANIFEST}: not a store pipeline wrote, nothing to verify against")
    if not manifest.get("complete") or "digests" not in manifest:
        raise InputError(f"{path}: the manifest records no digests (an incomplete store)")
    root = os.path.abspath(path)
    tasks, names = [], []
    for k in manifest["digests"]:
        array_dir = os.path.join(root, k)
        try:
            arr = zarr.open_array(array_dir, mode="r")
        except Exception as e:
            raise InputError(f"{path}: variable {k!r} is missing or unreadable: {e}") from None
        tasks.append([dask.delayed(_read_sha, pure=False)(array_dir, r, k) for r in _grid(arr.shape, _unit(arr))])
        names.append(k)
    found = compute(tasks)
    actual = {k: _combine(shas) for k, shas in zip(names, found)}
    bad = [k for k in names if actual[k] != manifest["digests"][k]]
    if bad:
        raise InputError(
            f"{path}: the values of {', '.join(map(repr, bad))} differ from those written "
            f"(digest {actual[bad[0]]}, manifest {manifest['digests'][bad[0]]})"
        )
    return actual


def directory_bytes(path: str | os.PathLike) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _remove(path: Path, settle: float = 3.0) -> None:
    """Delete a partial store for good. A write still in flight re-creates the directory it writes
    into; so delete, then watch for a moment and delete again what comes back."""
    import time

    shutil.rmtree(path, ignore_errors=True)
    deadline = time.monotonic() + settle
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < 0.5:
        time.sleep(0.05)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            quiet_since = time.monotonic()


def _replace(new: Path, final: Path) -> None:
    """Move a complete store into place; an old store is moved aside first, then deleted."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
