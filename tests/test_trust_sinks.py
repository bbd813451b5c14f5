"""The Zarr sink trusts only what it can prove it wrote: an overwrite replaces nothing a user added,
a manifest counts only where it accounts for every file, links at the lock and partial paths and
links from an input into the output are refused, leftovers are removed only where a dead run's
record names them, a partial output of other library versions is not resumed, and `verify`
checks what a reader reads. Each case runs the CLI in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from pipeline.errors import InputError
from pipeline.sinks.zarr import MANIFEST, read_manifest, staged, verify, versions, write_zarr

from .conftest import climate_array
from .test_sink_safety import FLOW, MONTHLY, cli, start, tree


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A source and a store the monthly_anomaly flow wrote from it (coordinates time, month, lat, lon)."""
    tmp = tmp_path_factory.mktemp("made")
    assert cli("demo", "src.zarr", "--size", "1MB", cwd=tmp).returncode == 0
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", cwd=tmp)
    assert r.returncode == 0, r.stderr
    assert cli("verify", "out.zarr", cwd=tmp).returncode == 0
    return tmp


@pytest.fixture
def work(made, tmp_path) -> Path:
    shutil.copytree(made, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def beside(folder: Path, name: str = "out.zarr") -> list[str]:
    """What lies beside an output: its partial, lock, old and scratch siblings."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


# --- 1, 2. overwrite replaces only what the manifest accounts for --------------------------------


@pytest.mark.parametrize("added", ["notes", "variable", "link"])
def test_overwrite_keeps_what_a_user_added_to_a_store_pipeline_wrote(work, added):
    out = work / "out.zarr"
    if added == "notes":
        (out / "NOTES.txt").write_text("calibrated against station data")
        named = "NOTES.txt"
    elif added == "variable":
        xr.Dataset({"mine": ("station", np.arange(3.0))}).to_zarr(out, mode="a")
        named = "mine/"
    else:
        (out / "raw").symlink_to(work / "src.zarr")
        named = "raw (a link)"
    before = tree(work)
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", cwd=work)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "out.zarr: holds what pipeline did not write" in r.stderr and named in r.stderr, r.stderr
    assert tree(work) == before and beside(work) == []


def test_a_folder_with_a_manifest_of_its_own_is_not_replaced(work):
    """A one-line manifest, or one that claims a complete store but does not list the user's file."""
    results = work / "results"
    results.mkdir()
    (results / "thesis.tex").write_text("years of work")
    for manifest, said in [({"pipeline": "0"}, f"its {MANIFEST} does not record the files"),
                           ({"pipeline": "0", "complete": True, "kind": "output", "files": {}}, "thesis.tex")]:
        (results / MANIFEST).write_text(json.dumps(manifest))
        before = tree(work)
        r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "results", cwd=work)
        assert r.returncode == 2 and "results:" in r.stderr and said in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert tree(work) == before
    assert (results / "thesis.tex").read_text() == "years of work"


def test_a_store_filled_while_the_run_writes_is_not_replaced(made, tmp_path):
    """What a user adds after the run checked the output is seen when the old store is moved aside."""
    work = tmp_path / "w"
    work.mkdir()
    assert cli("demo", "src.zarr", "--size", "2MB", "--time-chunk", "2", cwd=work).returncode == 0
    shutil.copytree(made / "out.zarr", work / "out.zarr")
    old = tree(work / "out.zarr")
    # held after its first write of the anomaly until the user's file is added
    run = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--no-progress", cwd=work,
                hold=work / "release", hold_after="anomaly:1")
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None and not list((work / ".out.zarr.partial").glob("anomaly/c/*")):
        time.sleep(0.02)
    assert run.poll() is None, run.stderr.read()
    (work / "out.zarr" / "NOTES.txt").write_text("added during the run")
    (work / "release").touch()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2 and "NOTES.txt" in err and "nothing was replaced" in err, err
    assert tree(work / "out.zarr") == {**old, "NOTES.txt": tree(work / "out.zarr")["NOTES.txt"]}
    assert (work / "out.zarr" / "NOTES.txt").read_text() == "added during the run"
    assert beside(work) == []


# --- 3. links at the paths pipeline creates beside the output -------------------------------------


def test_a_link_at_the_lock_path_is_refused_by_every_writer(work):
    precious = work / "precious.txt"
    precious.write_text("do not touch")
    shared = work / "shared"
    shared.mkdir()
    (shared / ".res.zarr.lock").symlink_to(precious)
    for args in [("run", FLOW, "--input", "src.zarr", "--output", "shared/res.zarr"),
                 ("demo", "shared/res.zarr", "--size", "1MB"),
                 ("convert", "src.zarr", "shared/res.zarr")]:
        r = cli(*args, cwd=work)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "shared/.res.zarr.lock" in r.stderr and "symbolic link" in r.stderr, r.stderr
        assert precious.read_text() == "do not touch"
        assert sorted(p.name for p in shared.iterdir()) == [".res.zarr.lock"]


def test_a_hard_link_or_a_file_of_a_user_at_the_lock_path_is_refused(work):
    precious = work / "precious.txt"
    precious.write_text("do not touch")
    os.link(precious, work / ".res.zarr.lock")
    r = cli("run", FLOW, "--input", "src.zarr", "--output", "res.zarr", cwd=work)
    assert r.returncode == 2 and ".res.zarr.lock" in r.stderr and "hard link" in r.stderr, r.stderr
    assert precious.read_text() == "do not touch" and not (work / "res.zarr").exists()
    os.unlink(work / ".res.zarr.lock")
    (work / ".res.zarr.lock").write_text("my notes on the results")
    r = cli("run", FLOW, "--input", "src.zarr", "--output", "res.zarr", cwd=work)
    assert r.returncode == 2 and "other than pipeline's lock record" in r.stderr, r.stderr
    assert (work / ".res.zarr.lock").read_text() == "my notes on the results" and not (work / "res.zarr").exists()


def test_a_link_at_the_partial_path_is_refused(work):
    mine = work / "mine"
    mine.mkdir()
    before = tree(work)
    (work / ".res.zarr.partial").symlink_to(mine)
    r = cli("run", FLOW, "--input", "src.zarr", "--output", "res.zarr", "--resume", cwd=work)
    assert r.returncode == 2 and ".res.zarr.partial" in r.stderr and "remove it yourself" in r.stderr, r.stderr
    assert list(mine.iterdir()) == [] and tree(work) == before and (work / ".res.zarr.partial").is_symlink()


# --- 4. leftovers: only what a run that died recorded ---------------------------------------------


def test_only_what_a_killed_run_recorded_is_removed(made, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    assert cli("demo", "src.zarr", "--size", "2MB", "--time-chunk", "2", cwd=work).returncode == 0
    # held after its first write of the anomaly until it is killed (a file never made)
    run = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--no-progress", cwd=work,
                hold=work / "never", hold_after="anomaly:1")
    partial = work / ".out.zarr.partial"
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None and not list(partial.glob("anomaly/c/*")):
        time.sleep(0.02)
    assert run.poll() is None, run.stderr.read()
    run.send_signal(signal.SIGKILL)
    run.wait()
    record = json.loads((work / ".out.zarr.lock").read_text())
    assert record["created"] == [".out.zarr.partial"] and partial.is_dir()
    # named like leftovers, but the user's: a backup, a folder of their own, and an "old store"
    # that holds what no manifest records, named (as if) by the dead run's record
    for name in (".out.zarr.old-backup-2024", ".out.zarr.partial-mine", ".out.zarr.old-0123456789ab"):
        (work / name).mkdir()
        (work / name / "keep.txt").write_text(name)
    record["created"].append(".out.zarr.old-0123456789ab")
    (work / ".out.zarr.lock").write_text(json.dumps(record))
    r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", cwd=work)
    assert r.returncode == 0, r.stderr
    assert beside(work) == [".out.zarr.old-0123456789ab", ".out.zarr.old-backup-2024", ".out.zarr.partial-mine"]
    for name in beside(work):
        assert (work / name / "keep.txt").read_text() == name
    assert cli("verify", "out.zarr", cwd=work).returncode == 0


def test_a_partial_no_record_accounts_for_is_left_alone(work):
    (work / ".res.zarr.partial").mkdir()
    (work / ".res.zarr.partial" / "draft.txt").write_text("mine")
    before = tree(work)
    r = cli("run", FLOW, "--input", "src.zarr", "--output", "res.zarr", cwd=work)
    assert r.returncode == 2 and ".res.zarr.partial" in r.stderr and "no record says a run of pipeline left it" in r.stderr, r.stderr
    assert tree(work) == before and beside(work, "res.zarr") == [".res.zarr.partial"]


# --- 5. an input that links into the output --------------------------------------------------------


def test_an_input_array_linking_into_the_output_is_protected(work):
    (work / "out").mkdir()
    shutil.move(work / "out.zarr", work / "out" / "prev.zarr")
    (work / "data").mkdir()
    shutil.copytree(work / "src.zarr", work / "data" / "virt.zarr")
    shutil.rmtree(work / "data" / "virt.zarr" / "tas")
    (work / "data" / "virt.zarr" / "tas").symlink_to("../../out/prev.zarr/anomaly")
    (work / "f.yaml").write_text(
        "name: t\nsource: {path: data/virt.zarr, variable: tas}\n"
        "steps:\n  - {op: anomaly, name: anomaly, params: {freq: month}}\n"
        "sink: {path: out/prev.zarr, mode: overwrite}\n"
    )
    before = tree(work / "out")
    for args in [("validate", "f.yaml"), ("run", "f.yaml"),
                 ("run", MONTHLY, "--input", "data/virt.zarr", "--output", "out/prev.zarr")]:
        r = cli(*args, cwd=work)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert "out/prev.zarr: the output contains the input data/virt.zarr/tas (a link to" in r.stderr, r.stderr
        assert tree(work / "out") == before and (work / "data" / "virt.zarr" / "tas" / "zarr.json").exists()
    assert cli("verify", "out/prev.zarr", cwd=work).returncode == 0


# --- 6. resume only what these versions wrote ----------------------------------------------------


def test_resume_starts_over_on_a_partial_other_versions_wrote(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    assert cli("demo", "src.zarr", "--size", "2MB", "--time-chunk", "2", cwd=work).returncode == 0
    # held after its second write of the anomaly until it is signalled
    run = start("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--no-progress", cwd=work,
                hold=work / "release", hold_after="anomaly:2")
    partial = work / ".out.zarr.partial"
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None and len(list(partial.glob("anomaly/c/*"))) < 2:
        time.sleep(0.02)
    assert run.poll() is None, run.stderr.read()
    run.send_signal(signal.SIGTERM)
    (work / "release").touch()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1 and partial.is_dir(), err
    for older in ({"zarr": "2.18.3"}, None):  # zarr 2's chunks; a pipeline that recorded no versions
        copy = tmp_path / f"copy-{older is None}"
        shutil.copytree(work, copy)
        manifest = json.loads((copy / ".out.zarr.partial" / MANIFEST).read_text())
        if older is None:
            del manifest["versions"]
            manifest["pipeline"] = "0.0.1"
        else:
            manifest["versions"] |= older
        (copy / ".out.zarr.partial" / MANIFEST).write_text(json.dumps(manifest))
        r = cli("run", MONTHLY, "--input", "src.zarr", "--output", "out.zarr", "--resume", "--report", "rep.json", cwd=copy)
        assert r.returncode == 0, r.stderr
        assert "not resumed, starting over: it was written by other versions" in r.stderr, r.stderr
        assert ("zarr 2.18.3, now" if older else "pipeline unrecorded, now") in r.stderr, r.stderr
        assert json.loads((copy / "rep.json").read_text())["sink"]["chunks_kept"] == 0
        assert read_manifest(copy / "out.zarr")["versions"] == versions()
        assert cli("verify", "out.zarr", cwd=copy).returncode == 0


# --- 7, 8. verify checks what a reader reads ------------------------------------------------------


def _reverse_time(out: Path):
    arr = zarr.open_array(out / "time", mode="r+")
    arr[:] = arr[:][::-1]


def _rewrite_lat(out: Path):
    arr = zarr.open_array(out / "lat", mode="r+")
    arr[:] = arr[:] + 0.5


def _scale(out: Path):
    zarr.open_array(out / "anomaly", mode="r+").attrs["scale_factor"] = 10


def _scale_consolidated(out: Path):
    _scale(out)
    zarr.consolidate_metadata(str(out))


def _time_units(out: Path):
    zarr.open_array(out / "time", mode="r+").attrs["units"] = "hours since 1990-01-01"


def _add(out: Path):
    xr.Dataset({"mine": ("station", np.arange(3.0))}).to_zarr(out, mode="a")


def _remove(out: Path):
    shutil.rmtree(out / "climatology")
    zarr.consolidate_metadata(str(out))


def _empty_digests(out: Path):
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["digests"] = {}
    (out / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("change, said", [
    (_reverse_time, "'time': the values differ from those written"),
    (_rewrite_lat, "'lat': the values differ from those written"),
    (_scale, "'anomaly': scale_factor 10, written '(none)'"),
    (_scale_consolidated, "'anomaly': scale_factor 10, written '(none)'"),
    (_time_units, "'time': units 'hours since 1990-01-01', written 'days since 1990-01-01"),
    (_add, "'mine': in the store, but pipeline did not write it"),
    (_remove, "'climatology': written by pipeline, but missing"),
    (_empty_digests, "the manifest records no digests"),
])
def test_verify_fails_where_a_reader_would_read_other_values(work, change, said):
    change(work / "out.zarr")
    r = cli("verify", "out.zarr", cwd=work)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "match" not in r.stdout


def test_verify_a_path_that_does_not_exist(tmp_path):
    r = cli("verify", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "nope: does not exist" in r.stderr and "not a store pipeline wrote" not in r.stderr, r.stderr


# --- 9. an output that cannot be written there ----------------------------------------------------


def test_an_output_under_a_file_or_in_a_read_only_place_is_refused_before_anything_runs(work):
    (work / "somefile.txt").write_text("a file")
    read_only = work / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    cases = [("somefile.txt/out.zarr", "somefile.txt is a file, not a folder"),
             ("/sys/pipeline-out.zarr", "/sys is not writable")]  # read-only to root too
    if os.geteuid() != 0:  # root writes in a folder of mode 0o555
        cases.append(("ro/out.zarr", "ro is not writable"))
    before = tree(work)
    try:
        for output, said in cases:
            for args in [("run", FLOW, "--input", "src.zarr", "--output", output), ("demo", output, "--size", "1MB")]:
                r = cli(*args, cwd=work)
                assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
                assert f"{output}: the output cannot be written there" in r.stderr and said in r.stderr, r.stderr
                assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
        assert tree(work) == before and list(read_only.iterdir()) == []
        assert not os.path.lexists("/sys/pipeline-out.zarr")
    finally:
        read_only.chmod(0o755)


# --- 10. the Python API refuses an existing store unless asked; the hook before publishing -----------


def test_write_zarr_refuses_an_existing_store_unless_asked(tmp_path):
    x = climate_array(shape=(6, 3, 4), chunks={"time": 3})
    write_zarr(x, tmp_path / "o.zarr")
    before = tree(tmp_path)
    with pytest.raises(InputError, match="already exists"):
        write_zarr(x * 2, tmp_path / "o.zarr")
    assert tree(tmp_path) == before
    write_zarr(x * 2, tmp_path / "o.zarr", mode="overwrite")
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "o.zarr")["tas"].values, x.values * 2)
    assert verify(tmp_path / "o.zarr")


def test_check_inputs_failing_publishes_nothing_and_leaves_no_partial(tmp_path):
    x = climate_array(shape=(6, 3, 4), chunks={"time": 3})
    write_zarr(x, tmp_path / "o.zarr")
    before = tree(tmp_path)
    seen = []

    def changed():
        (partial,) = tmp_path.glob(".*.partial")  # written whole, not yet in place
        manifest = read_manifest(partial)
        seen.append(manifest["complete"] and set(manifest["files"]) >= {"zarr.json", "tas/zarr.json"})
        raise InputError("src.zarr: changed while the run read it")

    for resume in (False, True):
        with pytest.raises(InputError, match="changed while the run read it"):
            write_zarr(x * 2, tmp_path / "o.zarr", mode="overwrite", resume=resume, check_inputs=changed)
        assert tree(tmp_path) == before and beside(tmp_path, "o.zarr") == []
    with pytest.raises(InputError, match="changed while the run read it"):
        write_zarr(x * 2, tmp_path / "new.zarr", check_inputs=changed)  # mode "fail": its reservation goes too
    assert not os.path.lexists(tmp_path / "new.zarr") and beside(tmp_path, "new.zarr") == []
    with pytest.raises(InputError, match="changed while the run read it"):
        with staged(tmp_path / "st.zarr", check_inputs=changed) as partial:
            x.to_dataset().to_zarr(partial)
    assert not os.path.lexists(tmp_path / "st.zarr") and beside(tmp_path, "st.zarr") == []
    assert seen == [True] * 4
    assert tree(tmp_path) == before
