"""Zarr out: all or nothing, never over data pipeline did not write, resumable, verifiable.

A store is written to a hidden sibling directory, ``.NAME.partial``, and renamed into place only
when complete, so a failed or interrupted run never leaves a store that looks finished. While it
writes, a run holds an exclusive lock (``flock``) on the sibling file ``.NAME.lock``: a second
run to the same output fails at once. The lock file is opened without following links and must
be a regular file of its own. It records what the run creates beside the output before creating
it (the partial store, an old store moved aside, a scratch folder); a run that dies (SIGKILL
releases the lock too) leaves that record, and the next run removes what it names, or resumes
the partial store, and nothing else: a folder merely named like a leftover is left alone.

Every store pipeline writes carries a manifest, ``.pipeline.json`` in its root (zarr readers
ignore it): the versions of pipeline and its libraries, the kind of store, when it was made, the
fingerprint of what was written, every file written and its size, each array's metadata that
changes decoded values, and a sha256 digest of each array. ``mode="overwrite"`` replaces only a
complete store of the same kind whose files are all in its manifest: a file or an array a user
added is refused, untouched. A sink that is, holds, or lies inside an input, or an array an
input links to, is refused in every mode. Chunks are written with Zarr v3's ``crc32c`` codec
after the compressor, so that any zarr reader detects a corrupted chunk instead of returning its
garbage.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import dask
import numpy as np
import xarray as xr

from .. import backend as B
from ..deferred import module as _deferred
from ..errors import InputError, chunk_error
from ..exec.compute import compute, compute_threads, distributed_not_imported
from ..exec.optimize import optimized
from ..exec.order import block_bytes
from ..exec.report import versions  # recorded in every manifest: a partial store is resumed under the same ones
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
    coords: dict[str, str] = field(default_factory=dict)

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
    """Zarr needs equal chunks (the last may be shorter): rechunk where a graph made them uneven
    (a filter's kept positions, block by block). Each uneven axis gets chunks of its largest
    block; an array no larger than dask's ``array.chunk-size`` gets one chunk along it instead.

    The outputs of a filtered genomics flow are such arrays: a number or two a variant, in blocks
    of a few thousand variants. Cut to the largest block, each took a task to split and one to
    merge for each of its chunks, and one to write each chunk: in the GWAS flow's graph over
    120,000 variants x 300 samples, 208 of its 449 tasks, each a round of a cluster's scheduling.
    As one chunk, it is one task that joins the blocks and one that writes them."""
    from dask.utils import parse_bytes

    small = data.nbytes <= parse_bytes(dask.config.get("array.chunk-size"))
    target = []
    for c, n in zip(data.chunks, data.shape):
        regular = len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0])
        target.append(c if regular else (n if small else max(c)))
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


def _zarr_write(block: np.ndarray, region: tuple[slice, ...], array_dir: str) -> None:
    import zarr

    arr = zarr.open_array(array_dir, mode="r+", config={"write_empty_chunks": True})
    arr[region] = block


def store_with_zarr(block: np.ndarray, region: tuple[slice, ...], array_dir: str) -> str:
    """Store one block as its own chunk (or shard) through zarr's codecs; return its digest."""
    _zarr_write(block, region, array_dir)
    return block_sha(block)


class HostWrites:
    """Blocks stored through zarr's codecs on threads of their own, so that the threads that
    compute them go on to the next block: a ``store_block`` for :func:`write_zarr`.

    The digest is taken at once, on the calling thread, from the block as it is; only the encoding
    and the file's write wait for a writer. At most ``pending`` blocks wait or are being written
    (a caller waits for a place), so that host memory holds a bounded number of them. Used for a
    graph computed on the GPU by this process's threads, whose number the device's budget sets:
    its blocks are encoded on the host, where that budget does not reach. (On one H200, the
    monthly anomaly over 6.06 GB writes 6 GB through zarr's default zstd: under a 2 GB device
    budget its one thread took 26-35 s, most of it encoding each block; with these writers,
    10-11 s.)
    :meth:`close` waits for every write begun, and raises the first one's error."""

    def __init__(self, writers: int, pending: int | None = None, store=_zarr_write):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max(1, writers), thread_name_prefix="pipeline-write")
        self._places = threading.BoundedSemaphore(max(1, pending or writers))
        self._store = store
        self._lock = threading.Lock()
        self._closed = False
        self._error: BaseException | None = None

    def __call__(self, block: np.ndarray, region: tuple[slice, ...], array_dir: str) -> str:
        digest = block_sha(block)
        self._places.acquire()
        with self._lock:
            if self._error is not None or self._closed:  # a write failed (a full disk): fail the computation now
                self._places.release()
                raise self._error or RuntimeError("the store's writes were closed")
            self._pool.submit(self._write, block, region, array_dir)
        return digest

    def _write(self, block, region, array_dir) -> None:
        try:
            self._store(block, region, array_dir)
        except BaseException as e:
            with self._lock:
                self._error = self._error or e
            raise
        finally:
            self._places.release()

    def close(self, failed: bool = False) -> None:
        """Wait for the writes begun (the ones not yet begun are dropped where the computation
        ``failed``), then raise the first error of any."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=failed)
        if not failed and self._error is not None:
            raise self._error


def _host_writes(ds: xr.Dataset, store_block, threads: int | None = None) -> HostWrites | None:
    """A :class:`HostWrites` for ``ds``'s blocks where they are computed on the GPU by fewer of
    this process's threads (``threads``) than it has writers, and stored through zarr's codecs;
    else None (on the CPU, encoding competes with the computation for the same cores and the same
    memory budget; on a cluster, the workers write). Its writers are as many as a GPU's threads by
    default (8, or the cores), and so are the blocks waiting for them: host memory holds no more
    blocks than that many threads storing their own would, and those of the computing threads."""
    from dask.system import CPU_COUNT

    from ..exec.compute import active_client
    from ..exec.memory import graph_backend

    writers = min(8, CPU_COUNT)
    arrays = [v.data for v in ds.variables.values() if isinstance(v.data, da.Array)]
    if store_block is not store_with_zarr or not arrays or (threads or writers) >= writers or active_client() is not None:
        return None
    if dask.config.get("scheduler", None) not in (None, "threads", "threading") or graph_backend(*arrays) != "gpu":
        return None
    return HostWrites(writers)


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
    now = versions()
    data = {"pipeline": now["pipeline"], "versions": now,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **fields}
    tmp = path / f"{MANIFEST}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a killed run's (this directory is pipeline's)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1))
    os.replace(tmp, path / MANIFEST)


def _siblings(final: Path) -> tuple[Path, Path]:
    """The partial store and the lock file of ``final``."""
    return final.parent / f".{final.name}.partial", final.parent / f".{final.name}.lock"


def _entries(root: str, rel: str = ""):
    """``(relative path, os.DirEntry)`` of everything under ``root``, symbolic links not followed."""
    with os.scandir(os.path.join(root, rel) if rel else root) as it:
        for e in it:
            name = f"{rel}/{e.name}" if rel else e.name
            yield name, e
            if e.is_dir(follow_symlinks=False):
                yield from _entries(root, name)


def _files(store: Path) -> dict[str, int]:
    """The regular files of a store pipeline has just written and their sizes: what its manifest
    records, so that an overwrite later tells them from anything else."""
    return {name: e.stat(follow_symlinks=False).st_size for name, e in _entries(str(store))
            if e.is_file(follow_symlinks=False) and name not in (MANIFEST, f"{MANIFEST}.tmp")}


def _foreign(store: Path, files: Mapping[str, int]) -> list[str]:
    """What is in ``store`` and not in the manifest's ``files``: files it does not list (or lists
    with another size), links, and folders that hold none of them; sorted."""
    folders = {name.rsplit("/", i)[0] for name in files for i in range(1, name.count("/") + 1)}
    out = []

    def walk(rel: str) -> None:
        with os.scandir(store / rel if rel else store) as it:
            for e in sorted(it, key=lambda e: e.name):
                name = f"{rel}/{e.name}" if rel else e.name
                if e.is_symlink():
                    out.append(f"{name} (a link)")
                elif e.is_dir():
                    if name in folders:
                        walk(name)
                    else:
                        out.append(f"{name}/")
                elif not (rel == "" and e.name == MANIFEST):
                    if not e.is_file() or files.get(name) != e.stat(follow_symlinks=False).st_size:
                        out.append(name if name not in files else f"{name} (changed)")

    walk("")
    return out


def _not_ours(store: Path, kind: str) -> str | None:
    """Why ``store`` (which exists) may not be replaced: it is not a complete store of ``kind``
    that pipeline wrote, holding only what its manifest records. None when it may."""
    if store.is_symlink():
        return f"exists and is a symbolic link (to {os.readlink(store)}; no {MANIFEST} of its own)"
    if not store.is_dir():
        return f"exists and is a file (no {MANIFEST})"
    manifest = read_manifest(store)
    if manifest is None:
        what = "a Zarr store pipeline did not write" if (store / "zarr.json").exists() or (store / ".zgroup").exists() else (
            "a directory that is not a pipeline store")
        return f"exists and is {what} (no {MANIFEST})"
    files = manifest.get("files")
    if not manifest.get("complete") or not isinstance(files, dict):
        return (f"its {MANIFEST} does not record the files of a complete store pipeline wrote (a store of an older "
                f"version, an unfinished one, or not pipeline's)")
    if manifest.get("kind", "output") != kind:
        return f"holds a {manifest.get('kind')} store, not a {kind} store; pipeline replaces only its own kind"
    foreign = _foreign(store, files)
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        return f"holds what pipeline did not write: {', '.join(foreign[:3])}{more}"
    return None


def _overlap(target: str, other: str) -> str | None:
    """How ``target`` and ``other`` (real paths) overlap, in words, or None."""
    if target == other:
        return "is"
    if os.path.commonpath([target, other]) == other:
        return "lies inside"
    if os.path.commonpath([target, other]) == target:
        return "contains"
    return None


def _is_group(path: str) -> bool:
    if os.path.exists(os.path.join(path, ".zgroup")):
        return True
    try:
        with open(os.path.join(path, "zarr.json")) as f:
            return json.load(f).get("node_type") == "group"
    except (OSError, ValueError, AttributeError):
        return False


def _input_paths(store: str) -> list[tuple[str, str]]:
    """``(name, real path)`` of an input and of every group or array inside it that is a symbolic
    link (a "virtual" store of links into others): what reading it reads. Groups are followed,
    arrays' chunks are not walked."""
    out = [(store, os.path.realpath(store))]
    seen = set()

    def walk(folder: str, name: str) -> None:
        real = os.path.realpath(folder)
        if real in seen:
            return
        seen.add(real)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if not e.is_dir():  # follows links: a link to a folder counts
                continue
            if e.is_symlink():
                out.append((f"{name}/{e.name}", os.path.realpath(e.path)))
            if _is_group(e.path):
                walk(e.path, f"{name}/{e.name}")

    if os.path.isdir(store):
        walk(store, str(store))
    return out


def _check_writable(path: str | os.PathLike, label: str) -> None:
    """Refuse an output that could not be written where it is asked for: under a file, or in a
    folder that is not writable (tried for real, as permissions and read-only file systems say)."""
    parent = Path(os.path.abspath(path)).parent
    nearest = parent
    while not os.path.lexists(nearest):
        nearest = nearest.parent
    if not nearest.is_dir():
        raise InputError(f"{path}: the {label} cannot be written there: {nearest} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as e:
        raise InputError(f"{path}: the {label} cannot be written there: {nearest} is not writable ({e.strerror or e})") from None


def _open_lock(lock: Path, flags: int) -> int:
    """A file descriptor of the lock file (created with ``os.O_CREAT`` in ``flags``), which must be a
    regular file of its own: a link there would make pipeline write, or lock, what it points to."""
    try:
        fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ENOENT and not flags & os.O_CREAT:
            raise
        what = "a symbolic link" if e.errno == errno.ELOOP else f"not usable as a lock file ({e.strerror})"
        raise InputError(f"{lock}: pipeline's lock file for this output is {what}; remove it, or write the output elsewhere") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else "a hard link to another file"
        raise InputError(f"{lock}: pipeline's lock file for this output is {what}; remove it, or write the output elsewhere")
    return fd


def _lock_holder(lock: Path) -> dict | None:
    """What the lock file says of a run that died holding it (its lock free), else None."""
    try:
        fd = _open_lock(lock, os.O_RDONLY)
    except (OSError, InputError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # held: a live run
        return _record(fd)
    finally:
        os.close(fd)


def _record(fd: int) -> dict | None:
    """The JSON record a lock file holds; None when it is empty; InputError when it holds anything
    else (not pipeline's: it is not overwritten)."""
    text = os.pread(fd, 1 << 20, 0)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or "pid" not in data:
        raise InputError("holds something other than pipeline's lock record")
    return data


def _stale_reservation(final: Path) -> bool:
    """True when ``final`` is the empty directory a ``mode="fail"`` run reserved and then died."""
    holder = _lock_holder(_siblings(final)[1])
    return (bool(holder and holder.get("reserved")) and final.is_dir() and not final.is_symlink()
            and not any(final.iterdir()))


def check_target(path: str | os.PathLike, *, mode: str, protect: Iterable[str | os.PathLike] = (), kind: str = "output") -> None:
    """Refuse, with an InputError that says why and what to do, a sink that would destroy data.

    The sink may not be, contain, or lie inside any of ``protect`` (the inputs), nor the real
    path of any group or array in them that is a link elsewhere, in any mode. It must be
    writable: not under a file, not in a read-only folder. With ``mode="fail"`` it may not exist;
    with ``mode="overwrite"`` an existing path is replaced only when it is an empty directory or a
    complete store pipeline wrote (of the same ``kind``) holding nothing but the files its
    manifest records.
    """
    if mode not in ("overwrite", "fail"):
        raise InputError(f"mode must be 'overwrite' or 'fail', got {mode!r}")
    if is_url(path):
        raise InputError(f"{path}: writing to URLs is not supported; write to a local or shared file system path")
    target = os.path.realpath(path)
    for p in protect:
        if is_url(p):
            continue
        for name, real in _input_paths(os.fspath(p)):
            how = _overlap(target, real)
            if how:
                link = "" if name == os.fspath(p) else f" (a link to {real})"
                raise InputError(f"{path}: the output {how} the input {name}{link}; write the output somewhere else (--output)")
    _check_writable(path, "output")
    final = Path(path)
    lock = _siblings(final)[1]
    if os.path.lexists(lock) and (lock.is_symlink() or not lock.is_file()):
        what = "a symbolic link" if lock.is_symlink() else "not a regular file"
        raise InputError(f"{lock}: pipeline's lock file for this output is {what}; remove it, or write the output elsewhere")
    if not os.path.lexists(final) or _stale_reservation(final):
        return
    if mode == "fail":
        raise InputError(f"{path}: already exists; remove it, write elsewhere, or overwrite it (mode 'overwrite', --overwrite)")
    if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
        return
    why = _not_ours(final, kind)
    if why:
        raise InputError(f"{path}: {why}; pipeline replaces only what it wrote.\n  remove it yourself if it may go, or write the output elsewhere")


class _Lock:
    """The lock of an output, held by this run. ``previous``: the record a run that died holding it
    left (None if none). This run's record names what it creates beside the output before it
    creates it, so that the next run removes that, and only that, if this one dies."""

    def __init__(self, fd: int, final: Path, previous: dict | None):
        self.fd, self.final, self.previous = fd, final, previous
        self.state = {"pid": os.getpid(), "host": os.uname().nodename, "run": uuid.uuid4().hex, "created": []}
        self.note()

    def note(self, **kw) -> None:
        self.state.update(kw)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(self.state).encode(), 0)

    def creates(self, path: Path) -> Path:
        """Record that this run creates (or takes over) ``path``, a sibling of the output."""
        if path.name not in self.state["created"]:
            self.note(created=[*self.state["created"], path.name])
        return path

    def left(self) -> list[str]:
        return [n for n in self.state["created"] if os.path.lexists(self.final.parent / n)]


@contextlib.contextmanager
def _locked(final: Path):
    """Hold the exclusive lock of ``final`` for the block; yield its :class:`_Lock`. Another run
    holding it: InputError naming its pid. The lock file stays where this run leaves something
    beside the output (a partial store kept for ``resume``), as the record of what it created."""
    lock = _siblings(final)[1]
    while True:
        fd = _open_lock(lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = {}
            with contextlib.suppress(InputError):
                holder = _record(fd) or {}
            os.close(fd)
            raise InputError(
                f"{final}: another run (pid {holder.get('pid', '?')} on {holder.get('host', '?')}) is writing this output; "
                f"wait for it to finish or stop it"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.lstat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we opened it: lock the new one
    try:
        previous = _record(fd)
    except InputError as e:
        os.close(fd)
        raise InputError(f"{lock}: pipeline's lock file for this output {e}; remove it, or write the output elsewhere") from None
    held = _Lock(fd, final, previous)
    try:
        yield held
    finally:
        if not held.left():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
        os.close(fd)


def _clear_leftovers(final: Path, previous: dict | None, keep_partial: bool, kind: str) -> None:
    """Remove what a run that died left (its lock is free, we hold it now): what its lock record
    says it created (a partial store, a scratch folder, an old store moved aside: that one only
    where it still holds nothing but what its manifest records), and the empty directory a
    ``mode="fail"`` run reserved. Anything else is left alone; a partial store in the way that no
    record accounts for is refused."""
    partial = _siblings(final)[0]
    ours = re.compile(rf"\.{re.escape(final.name)}\.(partial|scratch|old-[0-9a-f]{{12}})")
    created = (previous or {}).get("created")
    for name in created if isinstance(created, list) else ():
        p = final.parent / str(name)
        if not ours.fullmatch(str(name)) or (keep_partial and p == partial) or p.is_symlink() or not p.is_dir():
            continue
        if ".old-" not in p.name or _not_ours(p, kind) is None:
            _remove(p, settle=0)
    if os.path.lexists(partial) and not keep_partial:
        raise InputError(
            f"{partial}: is in the way of this run's partial output, and no record says a run of pipeline left it; "
            f"remove it yourself if it may go"
        )
    if previous and previous.get("reserved") and final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
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
    then, now = manifest.get("versions") or {}, versions()
    changed = [f"{k} {then.get(k, 'unrecorded')}, now {now.get(k, 'not installed')}"
               for k in sorted(then.keys() | now.keys()) if then.get(k) != now.get(k)]
    if changed:
        return f"it was written by other versions ({'; '.join(changed)})"
    try:
        group = zarr.open_group(str(partial), mode="r")
        for k, v in ds.variables.items():
            if tuple(group[k].shape) != tuple(v.shape):
                return f"its variable {k!r} has another shape"
    except Exception as e:
        return f"it cannot be read ({type(e).__name__})"
    return None


def write_zarr(
    obj: xr.Dataset | xr.DataArray,
    path: str | os.PathLike,
    *,
    mode: str = "fail",
    name: str | None = None,
    zarr_format: int = 3,
    encoding: Mapping | None = None,
    progress: bool = False,
    protect: Iterable[str | os.PathLike] = (),
    resume: bool = False,
    fingerprint: str | None = None,
    kind: str = "output",
    store_block=store_with_zarr,
    check_inputs: Callable[[], None] | None = None,
) -> Written:
    """Write ``obj`` to a Zarr store at ``path``, all or nothing; return a :class:`Written`.

    The store is written to ``.NAME.partial`` beside ``path`` and renamed to ``path`` once every
    chunk is written; an exception or an interrupt removes the partial store (with ``resume``, it
    is kept for the next run to complete). ``mode="fail"`` (the default, as xarray's ``to_zarr``)
    reserves ``path`` at the start (atomically) and refuses an existing one; ``mode="overwrite"``
    replaces an existing store pipeline wrote (of the same ``kind``, holding nothing but what it
    wrote) only once the new one is complete. ``protect``: the inputs, which the output may not
    be, contain or lie inside.

    ``resume=True`` continues from the partial store a killed run left, if it was written from
    the same ``fingerprint`` (default: the dataset's dask token) by the same versions of pipeline
    and its libraries: chunks found there are read back, checked and kept, and only the missing
    ones are computed. Each variable's digest is computed by the tasks that write it
    (:data:`DIGEST_RULE`) and stored in the manifest, with the files written and each array's
    metadata.

    ``store_block(block, region, array_dir) -> digest`` stores each block in the partial store
    (default :func:`store_with_zarr`); a writer of its own chunk files passes its own.
    ``check_inputs()`` is called once everything is written, just before the store is put in
    place: if it raises (an input changed while the run read it), nothing is published and the
    partial store is removed, with ``resume`` too.
    """
    check_target(path, mode=mode, protect=protect, kind=kind)
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = _siblings(final)[0]
    threads = compute_threads(obj)
    ds = to_host_dataset(obj, name)
    fingerprint = fingerprint or default_fingerprint(ds)
    with _locked(final) as lock:
        why = _resumable(partial, fingerprint, ds) if resume and partial.is_dir() and not partial.is_symlink() else None
        if why:
            warnings.warn(f"{partial}: not resumed, starting over: {why}", stacklevel=2)
        keep = resume and why is None and partial.is_dir() and not partial.is_symlink()
        _clear_leftovers(final, lock.previous, keep_partial=keep, kind=kind)
        # with resume, what a failed run wrote stays for the next run to complete
        with _published(path, final, partial, lock, mode=mode, protect=protect, kind=kind, keep_on_failure=resume,
                        check_inputs=check_inputs):
            lock.creates(partial)
            if not keep:
                os.mkdir(partial)  # fails where anything is there, a link included: nothing is written through one
            written = _write(ds, partial, encoding, zarr_format, fingerprint, kind, progress, threads, fresh=not keep,
                             store_block=store_block)
    written.path = final
    return written


@contextlib.contextmanager
def staged(path: str | os.PathLike, *, mode: str = "fail", kind: str = "output", protect: Iterable[str | os.PathLike] = (),
           scratch: bool = False, check_inputs: Callable[[], None] | None = None, **manifest):
    """All or nothing for a store that another writer makes (bio2zarr, say): yields the hidden
    partial path beside ``path`` (``.NAME.partial``, not yet created), for the caller to write the
    whole store into; once the block ends without error, the manifest (``kind``, ``manifest``'s
    fields, the digests of the arrays read back, the files) is written into it, ``check_inputs()``
    is called, and it is renamed into place. An exception or an interrupt removes the partial
    store. ``mode`` and ``protect`` as :func:`write_zarr`'s: an existing ``path`` is replaced only
    where pipeline wrote it (``mode="overwrite"``), and a run holds the lock of ``path`` while it
    writes. ``scratch``: also create a folder for intermediate files beside ``path``
    (``.NAME.scratch``), removed at the end; the block gets ``(partial, scratch)``."""
    check_target(path, mode=mode, protect=protect, kind=kind)
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = _siblings(final)[0]
    with _locked(final) as lock:
        _clear_leftovers(final, lock.previous, keep_partial=False, kind=kind)
        lock.creates(partial)
        with _published(path, final, partial, lock, mode=mode, protect=protect, kind=kind, check_inputs=check_inputs):
            if not scratch:
                yield partial
            else:
                folder = final.parent / f".{final.name}.scratch"
                if os.path.lexists(folder):
                    raise InputError(f"{folder}: is in the way of this run's scratch folder, and no record says a run of "
                                     f"pipeline left it; remove it yourself if it may go")
                os.mkdir(lock.creates(folder))
                try:
                    yield partial, folder
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
            if partial.is_symlink() or not partial.is_dir():
                raise RuntimeError(f"{partial}: the store was not written")
            digests = _read_digests(partial)
            _write_manifest(partial, kind=kind, complete=True, digest=DIGEST_RULE, digests=digests, coords={},
                            arrays=_arrays(partial), files=_files(partial), **manifest)


@contextlib.contextmanager
def _published(path, final: Path, partial: Path, lock: _Lock, *, mode: str, protect, kind: str,
               keep_on_failure: bool = False, check_inputs: Callable[[], None] | None = None):
    """Under the lock of ``final``: check the target again, reserve ``final`` atomically where
    ``mode`` is "fail", run the block that writes ``partial``, call ``check_inputs``, then rename
    it into place; on failure or interrupt, remove ``partial`` (unless ``keep_on_failure`` and
    the failure is not ``check_inputs``'s) and the reservation. The one way :func:`write_zarr`
    and :func:`staged` put a store in place."""
    check_target(path, mode=mode, protect=protect, kind=kind)  # again, under the lock
    reserved = False
    keep = keep_on_failure
    try:
        if mode == "fail":
            try:
                os.mkdir(final)  # atomic: of two runs, one reserves the path
            except FileExistsError:
                raise InputError(f"{path}: already exists (another run created it meanwhile)") from None
            reserved = True
            lock.note(reserved=True)
        yield
        if check_inputs is not None:
            keep = False  # written from inputs that changed: worth nothing, to a rerun either
            check_inputs()
            keep = keep_on_failure
        if reserved:
            try:
                os.rename(partial, final)  # onto the empty reserved directory: atomic
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
                raise InputError(f"{path}: something else was put there while this run wrote; nothing was replaced") from None
        else:
            _replace(partial, final, lock, kind)
        lock.note(reserved=False)
    except BaseException:
        if not keep:
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
            # the metadata, and the variables held in memory: the blocks are written below
            ds.to_zarr(partial, mode="w-", zarr_format=zarr_format, consolidated=True, encoding=enc, compute=False)
        _write_manifest(partial, kind=kind, fingerprint=fingerprint, complete=False)
    group = zarr.open_group(str(partial), mode="r")
    root = os.path.abspath(partial)
    todo, kept, digests, checks = [], {}, {}, []
    for k, v in ds.variables.items():  # coordinates too: a reader reads them as well
        array_dir = os.path.join(root, str(k))
        unit = _unit(group[k])
        regions = _grid(v.shape, unit)
        if not isinstance(v.data, da.Array):
            values = np.asarray(_encoded(v, str(k), enc[k]).values)
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
    tasks, where, writes = [], [], []
    host = _host_writes(ds, store_block, threads)
    for k, array_dir, unit, v in todo:
        data = _aligned(_encoded(v, str(k), enc[k]).data, unit)
        token = dask.base.tokenize(data, array_dir)
        writes.append(data.map_blocks(
            _write_block, array_dir=array_dir, store=host or store_block, dtype="<U64", chunks=tuple((1,) * n for n in data.numblocks),
            meta=np.empty((0,) * data.ndim, "<U64"), name=f"pipeline-write-{token}",
        ))
    # The writes go to compute as Delayed objects, one a chunk, whose own optimization only culls:
    # optimized here as arrays, all together (as dask.compute would), each block's chain of steps
    # (a filter's two selections, a dosage's imputation: gt, where, truediv, ...) is one task with
    # its write, not a task a step; a step that several outputs share (a regression's beta, t and
    # p) stays one task.
    sizes = block_bytes(writes)  # before optimizing fuses the steps (pipeline.exec.order)
    for (k, *_), shas in zip(todo, optimized(writes)):
        blocks = shas.to_delayed(optimize_graph=False).ravel()
        for i, b in enumerate(blocks):
            if i not in kept.get(k, {}):
                tasks.append(b)
                where.append((k, i))
    failed = True
    try:
        new = compute(tasks, progress=progress, threads=threads, blocks=sizes) if tasks else []
        failed = False
    finally:
        if host is not None:  # every write begun has ended before the partial store is kept or removed
            host.close(failed=failed)
    per_var: dict = {k: dict(kept.get(k, {})) for k, *_ in todo}
    for (k, i), sha in zip(where, new):
        per_var[k][i] = str(np.asarray(sha).ravel()[0])
    for k, shas in per_var.items():
        digests[k] = _combine(shas[i] for i in range(len(shas)))
    written = Written(partial, {str(k): digests[k] for k in ds.data_vars}, len(tasks), sum(map(len, kept.values())),
                      {str(k): digests[k] for k in ds.coords})
    _write_manifest(
        partial, kind=kind, fingerprint=fingerprint, complete=True, digest=DIGEST_RULE, digests=written.digests,
        coords=written.coords, arrays=_arrays(partial), files=_files(partial),
        chunks={"written": written.chunks_written, "kept": written.chunks_kept},
    )
    return written


# --- verifying ------------------------------------------------------------------------------------

# attributes that change the values a reader decodes (CF), recorded for each array with its dtype,
# fill value, shape and dimensions; ``units`` only where it is a time's ("days since ...")
DECODING = ("scale_factor", "add_offset", "_FillValue", "missing_value", "valid_min", "valid_max", "valid_range", "_Unsigned",
            "dtype", "calendar")


def _plain(value):
    """A value of metadata as JSON keeps it, comparable with itself read back from a manifest."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in list(value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _describe(arr) -> dict:
    """What of an array's metadata changes the values a reader reads from it."""
    attrs = dict(arr.attrs)
    out = {"dtype": str(arr.dtype), "fill_value": arr.fill_value, "shape": arr.shape,
           "dimensions": getattr(arr.metadata, "dimension_names", None) or attrs.get("_ARRAY_DIMENSIONS")}
    out |= {k: attrs[k] for k in DECODING if k in attrs}
    if isinstance(attrs.get("units"), str) and " since " in attrs["units"]:
        out["units"] = attrs["units"]
    return _plain(out)


def _arrays(store: Path, consolidated: bool = False) -> dict[str, dict] | None:
    """Each array of ``store`` and :func:`_describe`'s account of it, as its own metadata says (or
    its consolidated metadata, what most readers read: None where there is none)."""
    import zarr

    group = zarr.open_group(str(store), mode="r", use_consolidated=None if consolidated else False)
    if consolidated and group.metadata.consolidated_metadata is None:
        return None
    return {name: _describe(node) for name, node in _members(group) if isinstance(node, zarr.Array)}


def _members(group):
    """Every node of a group, with its path (zarr warns of the manifest, which is none)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        return group.members(max_depth=None)


def _read_digests(store: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """The digest of each array of ``store`` (or of ``names``), its chunks read back in parallel."""
    import zarr

    root = os.path.abspath(store)
    group = zarr.open_group(root, mode="r", use_consolidated=False)
    if names is None:
        names = sorted(name for name, node in _members(group) if isinstance(node, zarr.Array))
    tasks = []
    for k in names:
        arr = group[k]
        tasks.append([dask.delayed(_read_sha, pure=False)(os.path.join(root, k), r, k) for r in _grid(arr.shape, _unit(arr))])
    return {k: _combine(shas) for k, shas in zip(names, compute(tasks) if tasks else [])}


def verify(path: str | os.PathLike) -> dict[str, str]:
    """Check a store against what its manifest says pipeline wrote, as a reader would read it:
    the set of arrays, the metadata that changes decoded values (dtype, fill value, scale and
    offset, missing values, a time's units and calendar; its own and the consolidated copy), and
    the digest of every array, recomputed from the stored chunks (data variables and
    coordinates). Return the data variables' digests. InputError naming each array and what
    differs, a chunk that fails its checksum, or a path that is not a complete store pipeline wrote."""
    store = Path(path)
    if not os.path.lexists(store):
        raise InputError(f"{path}: does not exist")
    if not store.is_dir():
        raise InputError(f"{path}: is a file, not a store")
    manifest = read_manifest(store)
    if manifest is None:
        raise InputError(f"{path}: no {MANIFEST}: not a store pipeline wrote, nothing to verify against")
    digests, coords, arrays = manifest.get("digests"), manifest.get("coords"), manifest.get("arrays")
    if not manifest.get("complete") or not isinstance(digests, dict) or not digests:
        raise InputError(f"{path}: the manifest records no digests (an incomplete store, or an edited manifest): nothing to verify against")
    if not isinstance(coords, dict) or not isinstance(arrays, dict) or set(arrays) != set(digests) | set(coords):
        raise InputError(f"{path}: the manifest does not account for every array written (an older pipeline's store, "
                         f"or an edited manifest): cannot verify what a reader reads")
    expected = {**coords, **digests}
    problems = {}  # each problem once: as the arrays' own metadata shows it, else as the consolidated copy does
    on_disk = _arrays(store)
    for view, found in (("", on_disk), (" in the consolidated metadata", _arrays(store, consolidated=True))):
        if found is None:
            continue
        for k in sorted(set(found) - set(arrays)):
            problems.setdefault((k, "added"), f"{k!r}: in the store{view}, but pipeline did not write it")
        for k in sorted(set(arrays) - set(found)):
            problems.setdefault((k, "missing"), f"{k!r}: written by pipeline, but missing{view}")
        for k in sorted(set(arrays) & set(found)):
            keys = sorted(set(arrays[k]) | set(found[k]))
            diff = [f"{a} {found[k].get(a, '(none)')!r}, written {arrays[k].get(a, '(none)')!r}" for a in keys
                    if found[k].get(a, "(none)") != arrays[k].get(a, "(none)")]
            if diff:
                problems.setdefault((k, *diff), f"{k!r}: {'; '.join(diff)}{view}")
    present = [k for k in expected if k in on_disk]
    actual = _read_digests(store, present)
    for k in present:
        if actual[k] != expected[k]:
            problems[k, "values"] = f"{k!r}: the values differ from those written (digest {actual[k]}, manifest {expected[k]})"
    if problems:
        raise InputError(f"{path}: differs from what pipeline wrote:\n  " + "\n  ".join(problems.values()))
    return {k: actual[k] for k in digests}


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


def _replace(new: Path, final: Path, lock: _Lock, kind: str) -> None:
    """Move a complete store into place. An old store is moved aside first and checked again
    there, where no one adds to it by its name: one that holds anything pipeline did not write
    goes back in place, untouched, and nothing is replaced; else it is deleted."""
    old = None
    if os.path.lexists(final):
        old = lock.creates(final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}")
        os.rename(final, old)
        why = None if old.is_dir() and not old.is_symlink() and not any(old.iterdir()) else _not_ours(old, kind)
        if why:
            try:
                os.rename(old, final)
            except OSError:
                lock.note(created=[n for n in lock.state["created"] if n != old.name])  # not for the next run to remove
                raise InputError(f"{final}: {why}; nothing was replaced, and the store is now at {old}") from None
            raise InputError(f"{final}: {why}; nothing was replaced.\n  remove it yourself if it may go, or write the output elsewhere")
    os.replace(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
