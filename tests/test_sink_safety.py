"""The sink never destroys data: refusals, atomic and locked writes, checksums, digests, and
interrupted runs on a distributed cluster leave nothing behind. Each case runs the CLI in a
subprocess, as a user would."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
import zarr

from pipeline.errors import InputError
from pipeline.flows import check_sink, load_flow, with_source
from pipeline.sinks.zarr import MANIFEST, check_target, verify, write_zarr

from .conftest import climate_array, requires_gpu

REPO = Path(__file__).resolve().parent.parent
FLOW = REPO / "flows" / "climate_anomaly.yaml"
MONTHLY = REPO / "flows" / "monthly_anomaly.yaml"

# Loaded at interpreter start where its directory is on PYTHONPATH: every write into a zarr array
# in the process (a run, or a dask worker) takes that long, as on slow storage, so that a signal
# lands while writes go on and a cancelled write ends well after the cancel. With a hold file
# named, a write waits until that file exists instead: the run is held mid-write for as long as a
# test needs, however slowly the machine runs; with ``hold_after`` ("array:N"), only the writes
# to that array after its first N are held, and the others go on.
SLOW_WRITES = '''
import os, threading, time
if os.environ.get("PIPELINE_TEST_SLOW_WRITE") or os.environ.get("PIPELINE_TEST_HOLD_WRITE"):
    import zarr
    _setitem = zarr.Array.__setitem__
    _writes, _lock = {}, threading.Lock()
    def _held(array):
        after = os.environ.get("PIPELINE_TEST_HOLD_AFTER")
        if not after:
            return True
        name, n = after.rsplit(":", 1)
        if str(array.store_path).rstrip("/").rsplit("/", 1)[-1] != name:
            return False
        with _lock:
            _writes[name] = _writes.get(name, 0) + 1
            return _writes[name] > int(n)
    def slow_setitem(self, selection, value):
        hold = os.environ.get("PIPELINE_TEST_HOLD_WRITE")
        if hold and _held(self):
            deadline = time.monotonic() + 600
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.01)
        elif os.environ.get("PIPELINE_TEST_SLOW_WRITE"):
            time.sleep(float(os.environ["PIPELINE_TEST_SLOW_WRITE"]))
        return _setitem(self, selection, value)
    zarr.Array.__setitem__ = slow_setitem
'''


def env(tmp_path: Path, slow: float | None = None, hold: Path | None = None, hold_after: str | None = None) -> dict:
    """The environment of a CLI run; with ``slow``, each block write sleeps that long first; with
    ``hold``, each block write waits until the file ``hold`` exists (with ``hold_after``,
    "array:N", only the writes to that array after its first N)."""
    out = {**os.environ, "DASK_PIPELINE__BACKEND": "cpu"}
    if slow or hold:
        site = tmp_path / "slow_site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SLOW_WRITES)
        out["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    if slow:
        out["PIPELINE_TEST_SLOW_WRITE"] = str(slow)
    if hold:
        out["PIPELINE_TEST_HOLD_WRITE"] = str(hold)
    if hold_after:
        out["PIPELINE_TEST_HOLD_AFTER"] = hold_after
    return out


def cli(*args, cwd, slow=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env(Path(cwd), slow))


def start(*args, cwd, slow=None, hold=None, hold_after=None):
    return subprocess.Popen([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(Path(cwd), slow, hold, hold_after))


def tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` and the sha256 of its bytes."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def source(tmp_path) -> Path:
    r = cli("demo", "src.zarr", "--size", "1MB", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "src.zarr"


# --- 1. overwrite replaces only what pipeline wrote ----------------------------------------------


@pytest.mark.parametrize("output", ["src.zarr", "src.zarr/tas", "."])
def test_run_refuses_an_output_over_its_input(tmp_path, source, output):
    (tmp_path / "notes.txt").write_text("keep me")
    before = tree(tmp_path)
    r = cli("run", FLOW, "--input", "src.zarr", "--output", output, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "src.zarr" in r.stderr and "input" in r.stderr and "Traceback" not in r.stderr
    assert tree(tmp_path) == before  # nothing touched: not the source, not the other files
    assert np.isfinite(xr.open_zarr(source)["tas"].values).all()
    with pytest.raises(InputError, match="input"):  # what `pipeline validate` can call
        check_sink(with_source(load_flow(FLOW), source), output=str(tmp_path / output))


@pytest.mark.parametrize("sink", ["src.zarr", "src.zarr/tas", ".", "results"])
def test_validate_refuses_a_flow_whose_sink_would_destroy_data(tmp_path, source, sink):
    """The source itself, inside it, a folder holding it, a folder pipeline did not write."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "thesis.tex").write_text("years of work")
    flow = yaml.safe_load(FLOW.read_text())
    flow["source"] = {"path": "src.zarr", "variable": "tas"}
    flow["sink"] = {"path": sink}
    (tmp_path / "f.yaml").write_text(yaml.safe_dump(flow))
    before = tree(tmp_path)
    r = cli("validate", "f.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert sink.split("/")[0] in r.stderr or "input" in r.stderr, r.stderr
    assert tree(tmp_path) == before


def test_overwrite_refuses_what_pipeline_did_not_write(tmp_path, source):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    foreign = tmp_path / "foreign.zarr"
    climate_array(shape=(6, 3, 4)).to_dataset().to_zarr(foreign)
    (tmp_path / "file.zarr").write_text("a file")
    before = tree(tmp_path)
    for output, what in [(folder, "a directory that is not a pipeline store"), (foreign, "a Zarr store pipeline did not write"),
                         (tmp_path / "file.zarr", "a file")]:
        r = cli("run", FLOW, "--input", source, "--output", output, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert what in r.stderr and MANIFEST in r.stderr and "remove it yourself" in r.stderr
    assert tree(tmp_path) == before
    # the demo command refuses a folder, and a store that is not a demo store
    r = cli("demo", folder, "--size", "1MB", "--overwrite", cwd=tmp_path)
    assert r.returncode == 2 and "not a pipeline store" in r.stderr
    assert cli("run", FLOW, "--input", source, "--output", "out.zarr", cwd=tmp_path).returncode == 0
    r = cli("demo", "out.zarr", "--size", "1MB", "--overwrite", cwd=tmp_path)
    assert r.returncode == 2 and "not a demo store" in r.stderr
    assert (folder / "thesis.tex").read_text() == "years of work"
    # a demo store pipeline wrote is replaced
    r = cli("demo", source, "--size", "1MB", "--seed", "5", "--overwrite", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert xr.open_zarr(source).attrs["source"].endswith("seed=5")


def test_overwrite_replaces_a_store_pipeline_wrote(tmp_path):
    x = climate_array(chunks={"time": 10})
    first = write_zarr(x, tmp_path / "o.zarr")
    second = write_zarr(x * 2, tmp_path / "o.zarr", name="tas", mode="overwrite")
    np.testing.assert_array_equal(xr.open_zarr(first)["tas"].values, x.values * 2)
    assert first.digests != second.digests and sorted(os.listdir(tmp_path)) == ["o.zarr"]
    with pytest.raises(InputError, match="already exists"):
        check_target(tmp_path / "o.zarr", mode="fail")


# --- 2. fail mode is atomic; concurrent runs are locked out -------------------------------------


def _flow(tmp_path: Path, mode: str) -> Path:
    flow = yaml.safe_load(FLOW.read_text())
    flow["sink"]["mode"] = mode
    flow["source"].pop("demo")
    path = tmp_path / f"flow-{mode}.yaml"
    path.write_text(yaml.safe_dump(flow))
    return path


def test_two_runs_in_fail_mode_one_wins_whole(tmp_path):
    for seed in (1, 2):
        assert cli("demo", f"s{seed}.zarr", "--size", "2MB", "--seed", seed, cwd=tmp_path).returncode == 0
    flow = _flow(tmp_path, "fail")
    runs = [start("run", flow, "--input", f"s{seed}.zarr", "--output", "out.zarr", "--report", f"r{seed}.json", "--no-progress",
                  cwd=tmp_path) for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    winner = next(seed for seed, (rc, _) in zip((1, 2), results) if rc == 0)
    loser_err = next(err for rc, err in results if rc == 2)
    assert "out.zarr" in loser_err and ("already exists" in loser_err or "another run (pid" in loser_err), loser_err
    report = json.loads((tmp_path / f"r{winner}.json").read_text())
    assert verify(tmp_path / "out.zarr") == report["sink"]["digests"]  # the winner's store, complete
    # its values are those of the winner's source
    src = xr.open_zarr(tmp_path / f"s{winner}.zarr")["tas"].astype("float64")
    z = (src - src.mean("time")) / src.std("time")
    expected = z.weighted(np.cos(np.deg2rad(src.lat))).mean(("lat", "lon"))
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "out.zarr")["weighted_mean"].values, expected.values, rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == []


def test_a_second_overwrite_run_fails_fast_naming_the_holder(tmp_path):
    assert cli("demo", "src.zarr", "--size", "4MB", "--time-chunk", "2", cwd=tmp_path).returncode == 0
    # the first run holds its writes until the second has ended: it holds the output throughout
    release = tmp_path / "release"
    first = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--no-progress", cwd=tmp_path, hold=release)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None and not (tmp_path / ".out.zarr.partial").exists():
            time.sleep(0.02)
        assert first.poll() is None, first.communicate()[1]
        t = time.time()
        second = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", cwd=tmp_path)
        assert first.poll() is None, "the first run ended before the second started"
        assert second.returncode == 2 and f"pid {first.pid}" in second.stderr and "out.zarr" in second.stderr, second.stderr
        assert time.time() - t < 30
        # released, the first run completes its write
        release.touch()
        assert first.wait(timeout=300) == 0, first.communicate()[1]
        assert cli("verify", "out.zarr", cwd=tmp_path).returncode == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


# --- 5, 6. checksums and digests ------------------------------------------------------------------


def test_a_corrupt_chunk_is_an_error_not_numbers(tmp_path, source):
    assert cli("run", FLOW, "--input", source, "--output", "out.zarr", cwd=tmp_path).returncode == 0
    out = tmp_path / "out.zarr"
    assert cli("verify", out, cwd=tmp_path).returncode == 0
    meta = json.loads((out / "weighted_mean" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]][-1] == "crc32c"
    chunk = next(p for p in (out / "weighted_mean").rglob("*") if p.is_file() and p.name != "zarr.json")
    blob = bytearray(chunk.read_bytes())
    for i in (len(blob) // 3, len(blob) // 2, len(blob) - 6):
        blob[i] ^= 0x5A
    chunk.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="checksum"):
        xr.open_zarr(out)["weighted_mean"].values
    with pytest.raises(ValueError, match="checksum"):
        zarr.open_array(out / "weighted_mean", mode="r")[:]
    r = cli("verify", out, cwd=tmp_path)
    assert r.returncode == 2 and "'weighted_mean'" in r.stderr and "chunk (0,) (file c/0)" in r.stderr, r.stderr


def test_verify_names_a_variable_whose_values_changed(tmp_path):
    x = climate_array(chunks={"time": 10}).to_dataset()
    x["pr"] = x["tas"] * 0.1
    written = write_zarr(x, tmp_path / "o.zarr")
    # the digest is sha256 over per-chunk sha256 of the C-ordered values, in grid order
    values = x["tas"].values
    shas = b"".join(hashlib.sha256(np.ascontiguousarray(values[i:i + 10]).tobytes()).digest() for i in range(0, 50, 10))
    assert written.digests["tas"] == "sha256:" + hashlib.sha256(shas).hexdigest()
    assert verify(written) == written.digests
    arr = zarr.open_array(tmp_path / "o.zarr" / "pr", mode="r+")
    arr[3, 0, 0] = 1.0  # a valid chunk (its checksum matches) with other values
    r = cli("verify", "o.zarr", cwd=tmp_path)
    assert r.returncode == 2 and "'pr'" in r.stderr and "'tas'" not in r.stderr, r.stderr
    r = cli("verify", tmp_path, cwd=tmp_path)
    assert r.returncode == 2 and "not a store pipeline wrote" in r.stderr


# --- 3. a run on a distributed cluster, stopped with SIGTERM, leaves nothing behind ----------------


def test_sigterm_on_a_cluster_leaves_nothing_behind(tmp_path):
    assert cli("demo", "src.zarr", "--size", "4MB", "--time-chunk", "2", cwd=tmp_path).returncode == 0
    sched_file = tmp_path / "scheduler.json"
    slow = env(tmp_path, slow=1.5)  # longer than the moment the removal of a partial watches it
    dask_cli = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    procs = [subprocess.Popen([*dask_cli, "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                               str(sched_file)], cwd=tmp_path, env=slow, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not sched_file.exists():
            time.sleep(0.1)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(sched_file), "--nthreads", "2",
             "--no-nanny", "--no-dashboard", "--local-directory", str(tmp_path / "w")],
            cwd=tmp_path, env=slow, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        run = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--scheduler-file", sched_file,
                    "--no-progress", cwd=tmp_path, slow=0.5)
        partial = tmp_path / ".out.zarr.partial"
        while time.time() < deadline + 60 and run.poll() is None and not list(partial.glob("anomaly/c/*")):
            time.sleep(0.05)
        assert run.poll() is None, run.stderr.read()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=180)
        assert run.returncode == 1 and "no partial output was left behind" in err, err
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]
        assert leftovers == []
        time.sleep(3)  # the workers' cancelled writes were over before the run said so
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))] == []
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=30)


def _dataset(chunk: int = 7) -> xr.Dataset:
    da = pytest.importorskip("dask.array")
    values = np.arange(40 * 6 * 5, dtype="f4").reshape(40, 6, 5)
    values[3, 2, 1] = np.nan
    return xr.Dataset({"v": (("time", "y", "x"), da.from_array(values, chunks=(chunk, 6, 5)))})


def test_host_writes_store_what_the_synchronous_store_does(tmp_path, monkeypatch):
    """Blocks written on threads of their own (:class:`HostWrites`, as for a graph computed on the
    GPU) make the same store, digests and manifest as the blocks stored by their tasks."""
    from pipeline.sinks import zarr as sink

    expected = write_zarr(_dataset(), tmp_path / "sync.zarr")
    stored = []

    def store(block, region, array_dir):
        sink._zarr_write(block, region, array_dir)
        stored.append(region)

    monkeypatch.setattr(sink, "_host_writes", lambda ds, store_block, threads=None: sink.HostWrites(2, pending=2, store=store))
    written = write_zarr(_dataset(), tmp_path / "host.zarr")
    assert len(stored) == 6  # 40 steps in blocks of 7, each written by the writers
    assert written.digests == expected.digests == verify(tmp_path / "host.zarr")
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "host.zarr")["v"].values, _dataset()["v"].values)


def test_host_writes_hold_a_bounded_number_of_blocks_and_fail_whole(tmp_path, monkeypatch):
    """A caller waits while ``pending`` blocks wait or are being written; a write's error fails
    the store, and nothing is left behind."""
    import threading

    from pipeline.sinks import zarr as sink

    gate, stored = threading.Event(), []

    def slow(block, region, array_dir):
        gate.wait()
        stored.append(region)

    writes = sink.HostWrites(1, pending=2, store=slow)
    digests = [writes(np.full((2, 2), i, "f4"), (slice(i, i + 1),), "dir") for i in range(2)]
    assert digests == [sink.block_sha(np.full((2, 2), i, "f4")) for i in range(2)]
    assert not writes._places.acquire(blocking=False)  # both places taken: a third caller waits
    gate.set()
    writes.close()
    assert len(stored) == 2 and writes._places.acquire(blocking=False)

    tried = []

    def broken(block, region, array_dir):
        tried.append(region)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sink, "_host_writes", lambda ds, store_block, threads=None: sink.HostWrites(1, store=broken))
    with pytest.raises(OSError, match="No space left"):
        write_zarr(_dataset(), tmp_path / "out.zarr")
    assert sorted(os.listdir(tmp_path)) == []
    # the first error stops the computation: no block is handed to a writer after it is known
    assert len(tried) == 1


def test_host_writes_are_for_graphs_computed_on_the_gpu_here():
    from pipeline.sinks import zarr as sink

    ds = _dataset()
    assert sink._host_writes(ds, sink.store_with_zarr) is None  # NumPy blocks: their tasks store them
    assert sink._host_writes(ds, lambda *a: "x") is None
    assert sink._host_writes(ds, sink.store_with_zarr, threads=1) is None


@pytest.mark.gpu
@requires_gpu
def test_a_graph_on_the_gpu_is_stored_by_host_writes(tmp_path, monkeypatch):
    import dask

    from pipeline import backend as B
    from pipeline.sinks import zarr as sink

    calls = []

    class Counting(sink.HostWrites):
        def __call__(self, *args):
            calls.append(args[1])
            return super().__call__(*args)

    monkeypatch.setattr(sink, "HostWrites", Counting)
    ds = _dataset()
    # computed on the device (an array only moved there would be written from where it came)
    on_gpu = xr.Dataset({"v": (ds["v"].dims, B.to_backend(ds["v"].data, "gpu") * 2)})
    with dask.config.set({"pipeline.gpu.threads": 1}):  # as a small device budget leaves it
        written = write_zarr(on_gpu, tmp_path / "gpu.zarr")
    assert len(calls) == 6  # 40 steps in blocks of 7
    with dask.config.set({"pipeline.gpu.threads": 64}):  # threads enough: each stores its own blocks
        stored = write_zarr(on_gpu, tmp_path / "stored.zarr")
    assert len(calls) == 6
    # (the same as the CPU's values, NaN where it has NaN; a NaN's bits may differ, and the digest with them)
    assert written.digests == stored.digests == verify(tmp_path / "gpu.zarr")
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "gpu.zarr")["v"].values, 2 * ds["v"].values)
