"""A killed run resumes: only missing chunks are computed, and the result is bit-identical to a
clean run. A partial output a killed run left is removed by the next run without --resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import zarr

from .test_sink_safety import MONTHLY, cli, start

VARIABLES = ("climatology", "anomaly")


def stored_bytes(store: Path) -> dict[str, bytes]:
    """Every variable's stored values, as raw bytes (NaNs compared bit for bit)."""
    group = zarr.open_group(str(store), mode="r")
    return {k: group[k][...].tobytes() for k in VARIABLES}


@pytest.fixture(scope="module", autouse=True)
def one_chunk_a_block():
    """The runs here read one stored chunk a block (pipeline.cpu.block-size null), so that the
    output is written in many small chunks and a slowed run is still writing when it is killed."""
    before = os.environ.get("DASK_PIPELINE__CPU__BLOCK_SIZE")
    os.environ["DASK_PIPELINE__CPU__BLOCK_SIZE"] = "None"
    yield
    if before is None:
        del os.environ["DASK_PIPELINE__CPU__BLOCK_SIZE"]
    else:
        os.environ["DASK_PIPELINE__CPU__BLOCK_SIZE"] = before


@pytest.fixture(scope="module")
def killed(tmp_path_factory, one_chunk_a_block):
    """A source, a clean run's output, and the partial output of a run SIGKILLed mid-write."""
    tmp = tmp_path_factory.mktemp("resume")
    assert cli("demo", "src.zarr", "--size", "6MB", "--time-chunk", "3", cwd=tmp).returncode == 0
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "clean.zarr", "--report", "clean.json", cwd=tmp)
    assert r.returncode == 0, r.stderr
    # its writes of the anomaly after the fourth wait until it is killed (a file never made)
    run = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--no-progress", cwd=tmp,
                hold=tmp / "never", hold_after="anomaly:4")
    partial = tmp / ".out.zarr.partial"
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None and len(list(partial.glob("anomaly/c/*"))) < 4:
        time.sleep(0.02)
    assert run.poll() is None, run.stderr.read()
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert partial.is_dir() and not (tmp / "out.zarr").exists()
    total = json.loads((tmp / "clean.json").read_text())["sink"]["chunks_written"]
    return tmp, partial, total


def _copy(killed, tmp_path) -> Path:
    """A copy of the killed run's directory, for one test to change."""
    tmp, _, _ = killed
    shutil.copytree(tmp, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def test_resume_computes_only_missing_chunks_bit_identical(killed, tmp_path):
    work = _copy(killed, tmp_path)
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--report", "rep.json", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "resumed:" in r.stdout
    sink = json.loads((work / "rep.json").read_text())["sink"]
    total = killed[2]
    assert sink["chunks_kept"] >= 4 and sink["chunks_written"] + sink["chunks_kept"] == total
    assert sink["chunks_written"] < total
    assert stored_bytes(work / "out.zarr") == stored_bytes(work / "clean.zarr")
    assert sink["digests"] == json.loads((work / "clean.json").read_text())["sink"]["digests"]
    assert cli("verify", "out.zarr", cwd=work).returncode == 0
    assert not (work / ".out.zarr.partial").exists() and not (work / ".out.zarr.lock").exists()


def test_a_bad_kept_chunk_is_recomputed(killed, tmp_path):
    work = _copy(killed, tmp_path)
    chunk = next(p for p in (work / ".out.zarr.partial" / "anomaly").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[: len(chunk.read_bytes()) // 2])  # truncated
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--report", "rep.json", cwd=work)
    assert r.returncode == 0, r.stderr
    sink = json.loads((work / "rep.json").read_text())["sink"]
    assert sink["chunks_kept"] >= 3 and sink["chunks_written"] + sink["chunks_kept"] == killed[2]
    assert stored_bytes(work / "out.zarr") == stored_bytes(work / "clean.zarr")


def test_another_source_starts_over_and_says_so(killed, tmp_path):
    work = _copy(killed, tmp_path)
    assert cli("demo", "other.zarr", "--size", "6MB", "--time-chunk", "3", "--seed", "4", cwd=work).returncode == 0
    shutil.move(work / "src.zarr", work / "orig.zarr")
    shutil.move(work / "other.zarr", work / "src.zarr")
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--report", "rep.json", cwd=work)
    assert r.returncode == 0, r.stderr
    assert "not resumed, starting over" in r.stderr and "fingerprint" in r.stderr
    sink = json.loads((work / "rep.json").read_text())["sink"]
    assert sink["chunks_kept"] == 0 and sink["chunks_written"] == killed[2]
    assert stored_bytes(work / "out.zarr") != stored_bytes(work / "clean.zarr")


def test_without_resume_the_next_run_removes_the_partial(killed, tmp_path):
    work = _copy(killed, tmp_path)
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--report", "rep.json", cwd=work)
    assert r.returncode == 0, r.stderr
    assert json.loads((work / "rep.json").read_text())["sink"]["chunks_kept"] == 0
    assert sorted(p.name for p in work.iterdir() if "out.zarr" in p.name) == ["out.zarr"]
    assert stored_bytes(work / "out.zarr") == stored_bytes(work / "clean.zarr")


def test_a_terminated_run_with_resume_keeps_its_partial_and_the_next_completes_it(killed, tmp_path):
    """A batch system cancels with SIGTERM: with --resume, what was written stays for the rerun."""
    tmp, _, total = killed
    work = tmp_path / "w"
    work.mkdir()
    (work / "src.zarr").symlink_to(tmp / "src.zarr")
    # its writes of the anomaly after the fourth wait for the file "release", made once the run is
    # signalled: they end after the signal, as slow storage's would
    run = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--no-progress", cwd=work,
                hold=work / "release", hold_after="anomaly:4")
    partial = work / ".out.zarr.partial"
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None and len(list(partial.glob("anomaly/c/*"))) < 4:
        time.sleep(0.02)
    assert run.poll() is None, run.stderr.read()
    run.send_signal(signal.SIGTERM)
    (work / "release").touch()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1 and "kept" in err and "--resume" in err, err
    assert partial.is_dir() and not (work / "out.zarr").exists()
    # the lock file stays, free, as the record that a run of pipeline left the partial output
    assert json.loads((work / ".out.zarr.lock").read_text())["created"] == [".out.zarr.partial"]
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--report", "rep.json", cwd=work)
    assert r.returncode == 0, r.stderr
    sink = json.loads((work / "rep.json").read_text())["sink"]
    assert sink["chunks_kept"] >= 4 and sink["chunks_written"] + sink["chunks_kept"] == total
    assert stored_bytes(work / "out.zarr") == stored_bytes(tmp / "clean.zarr")
