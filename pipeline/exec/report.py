"""Run reports: wall time, per-step task time, bytes read and written, throughput, and what a
scheduled job's audit trail needs (versions, host, user, command, fingerprints of the inputs).

Per-step time is the summed duration of the tasks of each step's part of the graph, read from
dask's own instrumentation (the local Profiler, or the distributed task stream). Dask fuses
chains of blockwise tasks into one task; a fused task counts towards the step whose layer ends
it, so a cheap step fused into the next one shows little time of its own.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import shlex
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable


def layer_of(key) -> str:
    return key[0] if isinstance(key, tuple) else str(key)


@dataclass
class TaskTimes:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wall: float = 0.0

    def add(self, key, duration: float) -> None:
        name = layer_of(key)
        self.seconds[name] += duration
        self.counts[name] += 1


@contextlib.contextmanager
def task_timer(client=None):
    """Time every task run inside the block, on the local scheduler or on ``client``'s cluster."""
    times = TaskTimes()
    start = time.perf_counter()
    if client is None:
        from dask.diagnostics import Profiler

        with Profiler() as prof:
            yield times
        for r in prof.results:
            times.add(r.key, r.end_time - r.start_time)
    else:
        from distributed import get_task_stream

        with get_task_stream(client) as stream:
            yield times
        for t in stream.data:
            compute = sum(s["stop"] - s["start"] for s in t.get("startstops", ()) if s.get("action") == "compute")
            times.add(t["key"], compute)
    times.wall = time.perf_counter() - start


def _prefix(layer: str) -> str:
    """A layer's name without its token, as dask writes it into the names of fused tasks."""
    from dask.utils import key_split

    return key_split(layer)


def attribute(times: TaskTimes, layers_by_part: dict[str, set[str]], rest: str = "write") -> dict[str, dict]:
    """Sum task seconds and counts per part (step) of the graph.

    Executed task names are layer names, possibly suffixed with a token when the graph was
    finalized. A task belongs to the latest part whose layer name it contains, and tasks of no
    known layer (the store itself) to ``rest``. Dask names a fused task after the layers it fused
    (their names without tokens, then the whole name of the last one): a part that ran no task of
    its own but appears in such a name gets ``fused_into``, the part that ran it, so that a report
    says where its time went instead of showing 0 s.
    """
    order = {part: i for i, part in enumerate(layers_by_part)}
    owner = [(layer, part) for part, layers in layers_by_part.items() for layer in layers]
    out = {part: {"task_seconds": 0.0, "tasks": 0} for part in [*layers_by_part, rest]}
    fused: dict[str, str] = {}
    for name, secs in times.seconds.items():
        parts = [part for layer, part in owner if layer in name]
        part = max(parts, key=order.__getitem__) if parts else rest
        out[part]["task_seconds"] += secs
        out[part]["tasks"] += times.counts[name]
        for other in _parts_named_in(name, layers_by_part):
            if other != part:
                fused.setdefault(other, part)
    for part, v in out.items():
        v["task_seconds"] = round(v["task_seconds"], 4)
        if v["tasks"] == 0 and part in fused:
            v["fused_into"] = fused[part]
    return out


def _parts_named_in(task: str, layers_by_part: dict[str, set[str]]) -> list[str]:
    """The parts with a layer of their own (no other part has one of that name) named in a task's
    name, as one of its dash-separated words or runs of words."""
    prefixes: dict[str, set[str]] = {}
    for part, layers in layers_by_part.items():
        for layer in layers:
            prefixes.setdefault(_prefix(layer), set()).add(part)
    padded = f"-{task}-"
    return [next(iter(parts)) for prefix, parts in prefixes.items() if len(parts) == 1 and f"-{prefix}-" in padded]


def gbps(nbytes: float, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 else None


# --- audit trail ---------------------------------------------------------------------------------

VERSIONED = ("dask", "distributed", "dask-cuda", "numpy", "cupy-cuda12x", "cupy-cuda13x", "numba", "numba-cuda",
             "zarr", "xarray", "numcodecs")


def versions() -> dict:
    """Versions of pipeline, Python and the installed libraries a result depends on."""
    from importlib.metadata import PackageNotFoundError, version

    from .._version import __version__

    out = {"pipeline": __version__, "python": sys.version.split()[0]}
    for pkg in VERSIONED:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def who() -> dict:
    """Host, user and command line of this process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = str(os.getuid()) if hasattr(os, "getuid") else None
    return {"host": socket.gethostname(), "user": user, "command": shlex.join(sys.orig_argv)}


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _stat(path: str | os.PathLike) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _tree_stats(top: str, prefix: str, entries: dict[str, list[int]]) -> None:
    """Size and mtime of every file under ``top``, keyed ``prefix`` + its path below ``top``, as
    ``os.walk`` finds them (links to folders are not followed). Plain strings and ``os.scandir``
    rather than ``pathlib`` objects: on a store of one chunk a time step (12,410 files), 0.09 s a
    walk against 0.22 s (2-core machine), and a run walks its input twice."""
    with os.scandir(top) as it:
        for e in it:
            if e.is_dir():
                if not e.is_symlink():
                    _tree_stats(e.path, prefix + e.name + "/", entries)
            else:
                entries[prefix + e.name] = _stat(e.path)


def path_fingerprint(path: str | os.PathLike, arrays: list[str] | None = None) -> dict:
    """Sizes and modification times of what a run reads from ``path``, and their digest.

    For a Zarr store: the files of ``arrays`` (every file under ``store/<array>``) and the store's
    own metadata files at its top; for a file (NetCDF): its size and mtime. Any rewrite of those
    files changes the digest, without reading their bytes. A URL cannot be listed: its digest
    covers the URL only.
    """
    p = Path(path)
    entries: dict[str, list[int]] = {}
    if "://" in str(path):
        kind = "url"
    elif p.is_dir():
        kind = "zarr"
        for f in sorted(p.iterdir()):
            if f.is_file():
                entries[f.name] = _stat(f)
        for name in arrays or ():
            if os.path.isdir(p / name):
                _tree_stats(str(p / name), name + "/", entries)
    else:
        kind = "file"
        entries[p.name] = _stat(p)
    digest = sha256_bytes(json.dumps([str(path), sorted(entries.items())]).encode())
    summary = {"path": str(path), "kind": kind, "files": len(entries),
               "bytes": sum(size for size, _ in entries.values()),
               "mtime_max_ns": max((m for _, m in entries.values()), default=None)}
    if arrays is not None:
        summary["arrays"] = list(arrays)
    return {**summary, "fingerprint": digest}


def combined(digests: list[str]) -> str:
    """One digest for several (order matters: the flow's, then each input's)."""
    return sha256_bytes("\n".join(digests).encode())


def check_report_path(
    path: str | os.PathLike,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    flow_file: str | os.PathLike | None = None,
    output: str | os.PathLike | None = None,
    option: str = "--report",
) -> Path:
    """Refuse, before anything runs, a report path that could not be written at the end (a folder,
    or a place whose nearest existing parent is not a writable folder), or whose writing would
    destroy what the run reads or writes: the flow file, a file in (or the whole of) an input, or
    the output or a file in it. Paths are compared as real paths, symbolic links resolved.
    ``option`` names the path in messages."""
    from ..errors import InputError

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {path}: is a folder; expected the path of a JSON file to write")
    _check_report_place(path, inputs=inputs, flow_file=flow_file, output=output, option=option)
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{option} {path}: {parent} is a file, not a folder; the report cannot be written there")
    try:
        if p.parent.exists():  # try it for real: permissions, read-only file systems
            with tempfile.TemporaryFile(dir=p.parent):
                pass
        elif not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"{parent}: not writable")
        if p.exists() and not os.access(p, os.W_OK):
            raise PermissionError(f"{p}: not writable")
    except OSError as e:
        raise InputError(f"{option} {path}: cannot be written ({e.strerror or e})") from None
    return p


def _check_report_place(path, *, inputs, flow_file, output, option: str) -> None:
    from ..errors import InputError

    report = os.path.realpath(path)

    def within(other) -> bool:
        other = os.path.realpath(other)
        return os.path.commonpath([report, other]) == other

    if flow_file is not None and os.path.exists(flow_file) and report == os.path.realpath(flow_file):
        raise InputError(f"{option} {path}: is the flow file {flow_file}; write the report elsewhere")
    for source in inputs:
        if "://" not in str(source) and within(source):
            how = "is" if report == os.path.realpath(source) else "lies inside"
            raise InputError(f"{option} {path}: {how} the input {source}; write the report elsewhere")
    if output is not None and "://" not in str(output) and within(output):
        how = "is" if report == os.path.realpath(output) else "lies inside"
        raise InputError(f"{option} {path}: {how} the output {output}; write the report elsewhere")


def write_report(report: dict, path: str | os.PathLike) -> Path:
    """Write a report as JSON, atomically: a reader sees the previous report or the new one whole."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.parent / f".{p.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tmp.write_text(json.dumps(report, indent=2, default=str))
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
