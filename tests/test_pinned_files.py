"""Chunk files pinned where they lie in the page cache (pipeline.gpu.pinned): kept while unchanged,
dropped once their file changes or goes, bounded by pipeline.gpu.pinned-files. The registration
with the driver is replaced by a record here, so that the bookkeeping runs on every machine; the
GPU tests read stores through it (tests/test_gpu_reader.py)."""

from __future__ import annotations

import os
import time

import dask
import numpy as np
import pytest

from pipeline import state
from pipeline.errors import InputError
from pipeline.gpu import pinned
from pipeline.gpu import reader


@pytest.fixture
def registry(monkeypatch):
    """Registered ranges, as the driver would hold them; a fresh cache for each test."""
    held: dict[int, int] = {}

    def register(ptr, nbytes):
        assert ptr not in held, "a range registered twice"
        held[ptr] = nbytes

    def unregister(ptr):
        del held[ptr]

    monkeypatch.setattr(pinned, "_register", register)
    monkeypatch.setattr(pinned, "_unregister", unregister)
    monkeypatch.setattr(state, "pinned", state.PinnedState())
    with dask.config.set({"pipeline.gpu.pinned-files": "1MB", "pipeline.gpu.pin-min-file": 0}):
        yield held
    pinned.release_files()
    assert not held, "ranges left registered"


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_a_pinned_file_is_lent_until_given_back_and_kept(tmp_path, registry):
    p = str(write(tmp_path / "a", b"abcdef" * 1000))
    f = pinned.pin_file(p, os.stat(p))
    assert f is not None and bytes(f.bytes) == b"abcdef" * 1000 and registry == {f.ptr: 6000}
    assert pinned.lookup(p, os.stat(p)) is f and f.users == 2
    pinned.unpin_file(f)
    pinned.unpin_file(f)
    assert f.users == 0 and not f.closed and pinned.pinned_files_bytes() == 6000
    assert pinned.pin_file(p, os.stat(p)) is f  # pinned once, lent again
    pinned.unpin_file(f)


def test_a_changed_file_is_dropped_and_closed_once_unused(tmp_path, registry):
    path = write(tmp_path / "a", b"x" * 4000)
    p = str(path)
    f = pinned.pin_file(p, os.stat(p))
    time.sleep(0.01)
    path.write_bytes(b"y" * 5000)  # another size and modification time
    assert pinned.lookup(p, os.stat(p)) is None
    assert not f.closed and f.ptr in registry  # still lent: a copy may be reading it
    pinned.unpin_file(f)
    assert f.closed and f.ptr not in registry
    g = pinned.pin_file(p, os.stat(p))
    assert bytes(g.bytes) == b"y" * 5000 and pinned.pinned_files_bytes() == 5000
    pinned.unpin_file(g)
    os.replace(write(tmp_path / "b", b"z" * 5000), p)  # replaced by another file: another inode
    assert pinned.lookup(p, os.stat(p)) is None and g.closed


def test_the_limit_keeps_recent_files_and_frees_idle_or_changed_ones(tmp_path, registry, monkeypatch):
    paths = [str(write(tmp_path / f"f{k}", bytes([k]) * 400_000)) for k in range(3)]  # 1 MB holds two
    first, second = (pinned.pin_file(p, os.stat(p)) for p in paths[:2])
    for f in (first, second):
        pinned.unpin_file(f)
    assert not pinned.may_pin(400_000)  # both read just now: the third is read into a buffer
    assert pinned.pin_file(paths[2], os.stat(paths[2])) is None and len(registry) == 2
    os.remove(paths[0])  # the least recently read went away: it makes room
    third = pinned.pin_file(paths[2], os.stat(paths[2]))
    assert third is not None and first.closed and not second.closed
    pinned.unpin_file(third)
    monkeypatch.setattr(pinned, "IDLE", 0.0)  # now every file is idle: the oldest makes room
    p0 = str(write(tmp_path / "f0", b"\0" * 400_000))
    again = pinned.pin_file(p0, os.stat(p0))
    assert again is not None and second.closed and not third.closed
    pinned.unpin_file(again)
    assert not pinned.may_pin(2_000_000)  # larger than the limit itself
    with dask.config.set({"pipeline.gpu.pinned-files": 0}):
        assert not pinned.may_pin(1)


def test_a_refused_registration_stops_pinning_in_the_process(tmp_path, registry, monkeypatch):
    p = str(write(tmp_path / "a", b"a" * 1000))

    def refuse(ptr, nbytes):
        raise RuntimeError("cudaErrorNotSupported")

    monkeypatch.setattr(pinned, "_register", refuse)
    assert pinned.pin_file(p, os.stat(p)) is None
    assert "cudaErrorNotSupported" in pinned.pin_failure() and pinned.pinned_files_bytes() == 0
    assert not pinned.may_pin(10)


def test_a_file_that_changes_while_pinned_is_no_reason_to_stop(tmp_path, registry, monkeypatch):
    path = write(tmp_path / "a", b"a" * 1000)
    st = os.stat(path)
    time.sleep(0.01)
    path.write_bytes(b"b" * 10)  # shorter than the size pinning maps: that fails
    assert pinned.pin_file(str(path), st) is None
    assert pinned.pin_failure() is None and pinned.may_pin(10)


def test_reads_pin_files_where_there_is_room_and_read_the_rest(tmp_path, registry):
    """submit_pins: each file that will_pin admits is pinned by one job, or, where the room went to
    the others meanwhile, read into memory of its own; either way its bytes arrive whole."""
    data = [bytes([k]) * 300_000 for k in range(4)]  # 1 MB holds three
    paths = [str(write(tmp_path / f"f{k}", d)) for k, d in enumerate(data)]
    stats = [os.stat(p) for p in paths]
    assert all(pinned.will_pin(p, st) for p, st in zip(paths, stats))  # each alone fits
    jobs = reader.submit_pins(paths, stats)
    got = [reader._pinned_or_own(job) for job in jobs]
    assert [bytes(g) for g in got] == data
    held = [reader._pinned_by([job]) for job in jobs]
    for f in held:
        if f is not None:
            pinned.unpin_file(f)
    assert sum(f is not None for f in held) == 3  # the I/O threads race: any one of the four is left
    (left,) = [k for k, f in enumerate(held) if f is None]
    assert isinstance(got[left], np.ndarray) and bytes(got[left]) == data[left]
    again = [pinned.lookup(p, os.stat(p)) for p in paths]
    assert [f is not None for f in again] == [f is not None for f in held]
    for f in again:
        if f is not None:
            pinned.unpin_file(f)
    assert not pinned.will_pin(paths[left], stats[left])  # no room left beside the three


def test_release_unpins_every_file(tmp_path, registry):
    paths = [str(write(tmp_path / f"f{k}", b"q" * 1000)) for k in range(2)]
    lent = pinned.pin_file(paths[0], os.stat(paths[0]))
    pinned.unpin_file(pinned.pin_file(paths[1], os.stat(paths[1])))
    assert pinned.release() >= 2000 and len(registry) == 1  # the lent one stays until given back
    pinned.unpin_file(lent)
    assert not registry and pinned.pinned_files_bytes() == 0


def test_the_limit_of_a_worker_is_a_share_of_its_memory_limit():
    from distributed import Client, LocalCluster

    with dask.config.set({"pipeline.gpu.pinned-files": 0.25}):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit="400MB",
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            assert client.submit(pinned.pinned_files_limit, pure=False).result() == 100_000_000
        import psutil

        assert pinned.pinned_files_limit() == int(0.25 * psutil.virtual_memory().total)


def test_files_under_the_floor_are_never_pinned(tmp_path, registry):
    """``pipeline.gpu.pin-min-file``: a smaller file is read into a buffer, whatever the room."""
    with dask.config.set({"pipeline.gpu.pin-min-file": "4kB"}):
        assert pinned.pin_min_file() == 4000
        assert not pinned.may_pin(3999) and pinned.may_pin(4000)
    with dask.config.set({"pipeline.gpu.pin-min-file": 2 << 20}):
        assert pinned.pin_min_file() == 2 << 20 and not pinned.may_pin(400_000)
    assert dask.config.get("pipeline.gpu.pin-min-file") == 0 and pinned.may_pin(1)
    for bad in ("two megabytes", -1, [1]):
        with dask.config.set({"pipeline.gpu.pin-min-file": bad}), pytest.raises(InputError, match="pin-min-file"):
            pinned.may_pin(10)


def test_will_pin_follows_the_policy_and_counts_the_read(tmp_path, registry):
    """Under "reread" a file's first read is counted and not pinned, its second is; under
    "first-read" the first is; a file under pin-min-file never is."""
    p = str(write(tmp_path / "a", b"a" * 1000))
    with dask.config.set({"pipeline.gpu.pin-files": "reread"}):
        assert not pinned.will_pin(p, os.stat(p))
        assert pinned.will_pin(p, os.stat(p))
    q = str(write(tmp_path / "b", b"b" * 1000))
    with dask.config.set({"pipeline.gpu.pin-files": "first-read"}):
        assert pinned.will_pin(q, os.stat(q))
        with dask.config.set({"pipeline.gpu.pin-min-file": 2000}):
            assert not pinned.will_pin(q, os.stat(q))


def test_will_pin_files_decides_as_will_pin_a_file_at_a_time(tmp_path, registry):
    """A block's files asked at once: the policy, the floor and the room as for each alone, and
    each read counted once under "reread"."""
    paths = [str(write(tmp_path / f"f{k}", bytes([k]) * n)) for k, n in enumerate((1000, 10, 3000, 500))]
    stats = [os.stat(p) for p in paths]
    with dask.config.set({"pipeline.gpu.pin-files": "reread", "pipeline.gpu.pin-min-file": 100}):
        assert pinned.will_pin_files(paths, stats) == [False, False, False, False]  # first reads, counted
        assert pinned.will_pin_files(paths, stats) == [True, False, True, True]  # under the floor: never
        assert pinned.will_pin(paths[0], stats[0])
    with dask.config.set({"pipeline.gpu.pin-files": "first-read", "pipeline.gpu.pinned-files": 2000}):
        assert pinned.will_pin_files(paths, stats) == [True, True, False, True]  # 3000 bytes do not fit
    assert pinned.will_pin_files([], []) == []
