"""The benchmarks run as tests, at a tiny size, so they cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ops_bandwidth_smoke(tmp_path):
    bench = load("ops_bandwidth")
    out = bench.main(["--backend", "cpu", "--shape", "40,9,16", "--chunk-time", "13", "--repeat", "1", "--json", str(tmp_path / "bw.json")])
    assert {r["op"] for r in out["ops"]} == {name for name, _ in bench.OPS}
    assert all(r["seconds"] > 0 for r in out["ops"] + out["kernels"])
    assert all(r["seconds_in_a_row"] > 0 for r in out["kernels"])
    assert (tmp_path / "bw.json").exists()


def test_locality_smoke(tmp_path):
    bench = load("locality")
    out = bench.main(["--shape", "52,9,16", "--time-chunk", "13", "--workers", "2", "--flows", "standardized_anomaly,rolling",
                      "--workdir", str(tmp_path), "--json", str(tmp_path / "locality.json")])
    for name, r in out["flows"].items():
        assert r["equal"] and r["data_blocks_per_run"] == [0], (name, r["transfers"])
        assert sum(w.get("received_bytes", 0) for w in r["per_worker"].values()) == r["transfers"]["bytes"]
    assert (tmp_path / "locality.json").exists()


def run_peers(tmp_path, peers: str) -> dict:
    bench = load("peers")
    # At 9 x 16 points the weighted global means are near zero and the float32 xarray peers'
    # own rounding is about 1e-5 of them: the tolerance is looser here than at full size.
    argv = ["--sizes", "fit", "--fit-shape", "40,9,16", "--time-chunk", "13", "--repeat", "1", "--peers", peers,
            "--cpu-workers", "1", "--cpu-threads", "2", "--no-processes", "--gpu-threads", "2", "--rtol", "1e-4",
            "--workdir", str(tmp_path), "--json", str(tmp_path / "peers.json")]
    out = bench.main(argv)
    assert json.loads((tmp_path / "peers.json").read_text())["ok"] == out["ok"]
    return out


def check_runs(out: dict, peers: set[str]) -> None:
    runs = {(r["flow"], r["peer"]): r for r in out["runs"]}
    assert set(runs) == {(f, p) for f in ("standardized_anomaly", "monthly_anomaly", "rolling") for p in peers}
    for r in runs.values():
        assert "error" not in r, r
        assert r["seconds"] > 0 and r["agrees"], r
    assert out["ok"]


def test_peers_smoke_cpu(tmp_path):
    out = run_peers(tmp_path, "cpu-peer,pipeline-cpu")
    check_runs(out, {"cpu-peer", "pipeline-cpu"})
    assert out["sizes"]["fit"]["shape"] == (40, 9, 16) and out["sizes"]["fit"]["store_read"]["compressed_bytes"] > 0
    assert all(r["x_cpu_peer"] > 0 for r in out["runs"])


@pytest.mark.gpu
def test_peers_smoke_gpu(tmp_path):
    out = run_peers(tmp_path, "cpu-peer,naive-gpu-peer,pipeline-cpu,pipeline-gpu")
    check_runs(out, {"cpu-peer", "naive-gpu-peer", "pipeline-cpu", "pipeline-gpu"})
    assert out["ceilings"]["h2d_pinned_GBps"] > 0 and out["machine"]["gpu_name"]


def test_live_blocks_smoke(tmp_path):
    """Blocks alive at once, in one process and on one distributed worker: counted, bounded by a
    few a thread, and the block functions unwrapped again afterwards."""
    from pipeline.kernels import elementwise

    before = elementwise.cf_decode_cpu
    bench = load("live_blocks")
    out = bench.main(["--workdir", str(tmp_path), "--shape", "365,9,16", "--threads", "2", "--saturation", "1.0",
                      "--flows", "monthly_anomaly,rolling", "--repeat", "1"])
    assert set(out) == {"monthly_anomaly, 2 threads", "rolling, 2 threads"}
    for row in out.values():
        assert set(row) == {"one process", "1 worker(s), saturation 1.0"}
        assert all(1 <= n <= 5 * 2 for n in row.values()), row  # 5 blocks (365 steps) at most in all
    assert elementwise.cf_decode_cpu is before


def test_host_read_smoke(tmp_path, monkeypatch):
    """Processes reading their slabs at once: every block is read once across them, and the files
    read (or copied) are the store's whole files, once each."""
    import importlib

    peers = load("peers")
    store = peers.ensure_store(tmp_path, (146, 9, 16), 73, 0)[0]
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the spawned processes import it by name
    host_read = importlib.import_module("host_read")
    out = host_read.main(["--store", str(store), "--gpus", "1,2", "--repeat", "1", "--backend", "cpu",
                          "--stages", "pipeline,pipeline-read,files,memcpy"])
    stages = ("pipeline", "pipeline-read", "files", "memcpy")
    assert [(r["gpus"], r["stage"]) for r in out] == [(n, s) for n in (1, 2) for s in stages]
    assert all(r["seconds"] > 0 and len(r["per_process"]) == r["gpus"] for r in out)
    files = sum(p.stat().st_size for p in (store / "tas").rglob("*") if p.is_file() and p.name != "zarr.json")
    for r in out:
        assert r["bytes"] == (146 * 9 * 16 * 4 if r["stage"].startswith("pipeline") else files), r
    with pytest.raises(SystemExit):
        host_read.main(["--store", str(store), "--backend", "cpu", "--stages", "h2d"])


# --- the previous kernels (benchmarks/kernels_previous.py): Numba CUDA, checked in the simulator ---

import shutil  # noqa: E402
import subprocess  # noqa: E402

from .test_kernels import group_inputs, rolling_reference, sample, spells_reference  # noqa: E402


@pytest.fixture(scope="module")
def previous():
    return load("kernels_previous")


@pytest.mark.cudasim
@pytest.mark.parametrize("before,after,min_periods", [(0, 0, 1), (4, 0, 5), (4, 0, 2), (2, 2, 3), (1, 2, 1), (30, 0, 1)])
def test_previous_rolling_kernel(previous, before, after, min_periods):
    x = sample()
    out = np.empty_like(x)
    previous.rolling_launch(x, out, before, after, min_periods)  # NumPy in, NumPy out: Numba moves them
    np.testing.assert_allclose(out, rolling_reference(x, before, after, min_periods), rtol=1e-6, equal_nan=True)


@pytest.mark.cudasim
def test_previous_rolling_kernel_more_points_than_a_thread_block(previous):
    x = sample(nt=4, npts=previous.THREADS_PER_BLOCK + 5, seed=3)
    out = np.empty_like(x)
    previous.rolling_launch(x, out, 2, 0, 1)
    np.testing.assert_allclose(out, rolling_reference(x, 2, 0, 1), rtol=1e-6, equal_nan=True)


@pytest.mark.cudasim
def test_previous_moments_kernel_matches_two_pass_moments(previous):
    from pipeline.kernels import launch, moments

    x = sample(nt=31, npts=40, seed=4)
    x[:, 5] = np.nan  # no valid value
    x[3:, 6] = np.nan  # one valid value
    n, mean, m2 = (np.zeros(x.shape[1]) for _ in range(3))
    launch.launch_numba(previous.moments_kernel, x.shape[1], x, n, mean, m2)
    ref = moments.moments_cpu(x, 0)  # the CPU formula
    np.testing.assert_array_equal(n, ref["n"][0])
    np.testing.assert_allclose(mean, ref["mean"][0], rtol=1e-12)
    np.testing.assert_allclose(m2, ref["m2"][0], rtol=1e-9, atol=1e-9)


@pytest.mark.cudasim
@pytest.mark.parametrize("mode", [0, 1])
def test_previous_group_sum_kernel(previous, mode):
    from pipeline.kernels import groups, launch

    x, labels = group_inputs()
    sums, counts = np.zeros((4, x.shape[1])), np.zeros((4, x.shape[1]))
    launch.launch_numba(previous.group_sum_kernel, x.shape[1], x, labels, np.float64(280.0), np.int32(mode), sums, counts)
    expected = groups.group_sum_cpu(x, labels, 4, threshold=280.0, mode=mode)  # the CPU kernel
    np.testing.assert_allclose(sums, expected["sum"], rtol=1e-12)
    np.testing.assert_array_equal(counts, expected["count"])
    cpu = previous.group_sum_previous_cpu(x, labels, 4, threshold=280.0, mode=mode)
    np.testing.assert_array_equal(sums, cpu["sum"])
    for g in range(4):
        block = x[labels == g].astype(np.float64)
        if mode == 0:
            np.testing.assert_allclose(expected["sum"][g], np.nansum(block, axis=0), rtol=1e-12)
            np.testing.assert_array_equal(expected["count"][g], (~np.isnan(block)).sum(axis=0))
        else:
            np.testing.assert_array_equal(expected["sum"][g], (block > 280.0).sum(axis=0))


@pytest.mark.cudasim
def test_previous_group_spells_kernel(previous):
    from pipeline.kernels import groups, launch

    x, labels = group_inputs(seed=1)
    labels = np.sort(labels)
    x[:, 7] = 400  # one run over the whole block
    npts = x.shape[1]
    best, lead, tail, tail_group = (np.zeros((4, npts), np.int32), *(np.zeros(npts, np.int32) for _ in range(3)))
    launch.launch_numba(previous.group_spells_kernel, npts, x, labels, np.float64(280.0), best, lead, tail, tail_group)
    cpu = groups.group_spells_cpu(x, labels, 4, 280.0)
    for name, gpu in [("best", best), ("lead", lead), ("tail", tail), ("tail_group", tail_group)]:
        np.testing.assert_array_equal(gpu, cpu[name], err_msg=name)
    for p in range(npts):
        b, ld, t, tg = spells_reference(x[:, p] > 280.0, labels, 4)
        np.testing.assert_array_equal(cpu["best"][:, p], b)
        assert (cpu["lead"][p], cpu["tail"][p], cpu["tail_group"][p]) == (ld, t, tg)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
@pytest.mark.parametrize("in_t", [np.float32, np.float64])
def test_previous_weighted_sums_source_compiles(previous, tmp_path, in_t):
    src = tmp_path / "weighted.cu"
    src.write_text(previous.weighted_source(in_t))
    r = subprocess.run(["nvcc", "-c", "-arch=sm_90", "--fmad=false", str(src), "-o", str(tmp_path / "w.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_genomics_linalg_smoke(tmp_path):
    bench = load("genomics_linalg")
    out = bench.main(["--backends", "cpu", "--variants", "300", "--samples", "40", "--variant-chunk", "70",
                      "--distance-samples", "30", "--components", "3", "--repeat", "1", "--json", str(tmp_path / "g.json")])
    assert {r["op"] for r in out["rows"]} == {"pca[tsqr]", "pca[randomized]", "pairwise_distance[euclidean]",
                                              "pairwise_distance[correlation]"}
    assert all(r["seconds"] > 0 for r in out["rows"])
    assert json.loads((tmp_path / "g.json").read_text())["rows"] == out["rows"]
    counts = bench.counts_block(np, 5, 50, 40, seed=0)
    assert counts.dtype == np.int8 and set(np.unique(counts)) == {0, 1, 2}
    assert (counts.min(axis=1) < counts.max(axis=1)).all()


@pytest.mark.skipif(shutil.which("plink2") is None, reason="PLINK 2 (plink2) not on PATH")
def test_plink2_smoke(tmp_path):
    """PLINK 2 and pipeline on the same msprime genotypes (PLINK 1 .bed -> .pgen, .bed -> VCF Zarr
    by bio2zarr): every operation timed as a process and its results agreeing; the data reused by
    a second run."""
    pytest.importorskip("msprime")
    pytest.importorskip("bio2zarr.plink")
    bench = load("plink2")
    argv = ["--samples", "150", "--variants", "800", "--workdir", str(tmp_path), "--workers", "1",
            "--json", str(tmp_path / "plink2.json")]
    out = bench.main(argv)
    assert [r["operation"] for r in out["rows"]] == list(bench.OPS)
    for r in out["rows"]:
        assert r["agrees"] and r["plink2_seconds"] > 0 and r["pipeline_seconds"] > 0, r
        assert set(r["pipeline_phases"]) == set(bench.PHASES) and r["pipeline_seconds"] > r["pipeline_phases"]["first"]
    assert out["ok"] and set(out["prepared_seconds"]) == {"simulate_and_bed", "bio2zarr", "make_pgen"}
    assert json.loads((tmp_path / "plink2.json").read_text())["rows"] == out["rows"]
    bed = np.fromfile(tmp_path / "data.bed", dtype=np.uint8)
    assert bed[:3].tolist() == [0x6C, 0x1B, 0x01] and bed.size == 3 + 800 * 38  # 150 samples: 38 bytes a variant
    codes = (bed[3:].reshape(800, 38)[..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    with_missing = int((codes.reshape(800, -1)[:, :150] == bench.MISSING_CODE).any(axis=1).sum())
    assert 60 < with_missing <= 80  # 80 variants (10 %) draw missing calls at 2 %
    glm = next(r for r in out["rows"] if r["operation"] == "glm")["agreement"]
    assert f"({800 - with_missing} complete variants)" in glm  # compared where PLINK 2 and pipeline see the same calls
    again = bench.main(argv[:-2] + ["--ops", "freq"])  # the .bed, the store and the .pgen are reused
    assert again["prepared_seconds"] == {} and again["rows"][0]["agrees"]


def test_genomics_sgkit_added_groups(tmp_path, capsys):
    """The groups of sgkit's added functions run on a tiny demo store: through the CLI's processes
    (a matrix group, compared value by value between two runs of pipeline), and in this process."""
    from pipeline.demo_genomics import write_genomics_demo

    store = tmp_path / "g.vcz"
    write_genomics_demo(store, samples=40, variants=1200, seed=2)
    bench = load("genomics_sgkit")
    assert bench.main([str(store), "--tools", "pipeline-cpu,pipeline-cpu@1GB", "--groups", "relatedness", "--processes", "2",
                       "--distance-samples", "30", "--distance-variants", "400", "--json", str(tmp_path / "g.json")]) == 0
    rows = json.loads((tmp_path / "g.json").read_text())
    assert [(r["label"], r["tool"], r["group"]) for r in rows] == [
        ("pipeline-cpu", "pipeline-cpu", "relatedness"), ("pipeline-cpu#2", "pipeline-cpu", "relatedness"),
        ("pipeline-cpu@1GB", "pipeline-cpu@1GB", "relatedness"), ("pipeline-cpu@1GB#2", "pipeline-cpu@1GB", "relatedness")]
    # each process against the first tool's process of the same rank; the first tool's own second not compared
    assert [r.get("agrees_with") for r in rows] == [None, None, "pipeline-cpu", "pipeline-cpu#2"], capsys.readouterr().out
    assert {r.get("agrees_with_first") for r in rows[2:]} == {"0.0e+00 (stat_identity_by_state)"}
    shapes = {k: d[3] for k, d in rows[0]["digest"].items()}
    assert shapes == {k: [30, 30] for k in ("stat_identity_by_state", "stat_Weir_Goudet_beta", "stat_genomic_relationship",
                                                   "stat_inverse_relationship", "pc_relate_phi")}
    assert rows[0]["digest"]["pc_relate_phi"][2] == 0  # no NaN

    # the biallelic variants of the 1,200 (2 windows of 1,000 variants); 400 in the subset
    for group, name, shape in [("frequencies", "cohort_allele_frequency", [None, 3, 2]),
                               ("haplotypes", "stat_pbs", [2, 3, 3, 3]),
                               ("regenie", "variant_linreg_p_value", [400, 2]),
                               ("pedigree", "stat_hybrid_inverse_relationship", [30, 30])]:
        r = bench.one("pipeline-cpu", group, str(store), (400, 30), runs=1, values_dir=str(tmp_path))
        assert r["first_seconds"] > 0 and r["warm_seconds"] is None
        got = r["digest"][name][3]
        assert len(got) == len(shape) and all(n in (None, d) for n, d in zip(shape, got)), (group, got)
        saved = np.load(tmp_path / f"pipeline-cpu.{group}.npz")
        assert set(saved.files) == set(r["digest"])
    pbs = np.load(tmp_path / "pipeline-cpu.haplotypes.npz")["stat_pbs"]
    assert np.isfinite(pbs[:, 0, 1, 2]).all() and np.isnan(pbs).sum() == pbs.size - 2  # only the triple asked for


def test_genomics_sgkit_more_added_groups(tmp_path, capsys):
    """The groups of sgkit's conversions, genee, pedigree tools and datasets run on a tiny demo
    store: datasets through the CLI's processes (a store saved and read again, displays compared as
    text, value by value between two runs of pipeline), the others in this process."""
    import pipeline
    from pipeline.demo_genomics import write_genomics_demo

    store = tmp_path / "g.vcz"
    write_genomics_demo(store, samples=40, variants=1200, seed=2)
    bench = load("genomics_sgkit")
    assert bench.main([str(store), "--tools", "pipeline-cpu,pipeline-cpu@1GB", "--groups", "datasets",
                       "--json", str(tmp_path / "g.json")]) == 0
    rows = json.loads((tmp_path / "g.json").read_text())
    assert [r["label"] for r in rows] == ["pipeline-cpu", "pipeline-cpu@1GB"], capsys.readouterr().out
    assert rows[1]["agrees_with_first"] == "0.0e+00 (call_genotype_mask)"
    shapes = {k: d[3] for k, d in rows[0]["digest"].items()}
    n = shapes["call_genotype_mask"][0]  # the biallelic variants
    assert shapes["saved_call_genotype"] == shapes["simulated_call_genotype"] == [n, 40, 2]
    assert shapes["call_genotype_probability_mask"] == [n, 40, 3] and shapes["simulated_variant_position"] == [n]
    assert all(len(shapes[k]) == 1 for k in ("saved_sample_id", "saved_variant_allele", "display_genotypes"))

    # the biallelic variants of the 1,200 (an interval every 50); 400 in genee's subset (8 genes)
    for group, expected in [
            ("conversion", {"call_genotype": [None, 40, 2], "sample_ploidy": [40], "stat_diversity": [None, 3]}),
            ("genee", {"window_start": [8], "test_q": [8], "pval": [8]}),
            ("genedrop", {"parent": [40, 2], "call_genotype": [None, 40, 2]})]:
        r = bench.one("pipeline-cpu", group, str(store), (400, 30), runs=1, values_dir=str(tmp_path))
        assert r["first_seconds"] > 0 and r["warm_seconds"] is None
        for name, shape in expected.items():
            got = r["digest"][name][3]
            assert len(got) == len(shape) and all(e in (None, d) for e, d in zip(shape, got)), (group, name, got)
        saved = np.load(tmp_path / f"pipeline-cpu.{group}.npz")
        assert set(saved.files) == set(r["digest"])
    # a graphviz.Digraph, compared as its DOT text: where the library is installed
    assert ("display_pedigree" in r["digest"]) == (importlib.util.find_spec("graphviz") is not None)
    drop = np.load(tmp_path / "pipeline-cpu.genedrop.npz")["call_genotype"]
    calls = bench._select(pipeline.open_dataset(store, backend="cpu"), "pipeline-cpu").call_genotype.values
    np.testing.assert_array_equal(drop[:, :4], calls[:, :4])  # the founders' (the first tenth) kept
    assert (drop[:, 4:] != calls[:, 4:]).any()


def test_genomics_sgkit_texts_and_results_of_one_tool():
    """A text (a display's) and an array of strings are compared as the bytes of their lines; a
    result only one tool gave (display_pedigree without graphviz) is named, not compared."""
    bench = load("genomics_sgkit")
    np.testing.assert_array_equal(bench._numbers("a\nb"), [97, 10, 98])
    np.testing.assert_array_equal(bench._numbers(np.array([b"a", b"b"])), [97, 10, 98])
    np.testing.assert_array_equal(bench._numbers(np.array(["a", "b"], dtype=object)), [97, 10, 98])
    assert bench._numbers(np.array([True, False])).dtype == np.float64
    a = {"tool": "a", "group": "g", "digest": {"m": [1.0, 1.0, 0, [1]]}}
    b = {"tool": "b", "group": "g", "digest": {"m": [1.0, 1.0, 0, [1]], "display_pedigree": [9.0, 9.0, 0, [1]]}}
    assert bench._agree(a, b) == bench._agree(b, a) == "display_pedigree: in one tool's results only"


@pytest.mark.skipif(importlib.util.find_spec("sgkit") is None, reason="sgkit not installed")
def test_genomics_sgkit_datasets_agree_with_sgkit(tmp_path):
    """Where sgkit is installed: pipeline's datasets (created, saved and read again, simulated,
    displayed) equal sgkit's value by value."""
    from pipeline.demo_genomics import write_genomics_demo

    store = tmp_path / "g.vcz"
    write_genomics_demo(store, samples=40, variants=1200, seed=2)
    assert load("genomics_sgkit").main([str(store), "--tools", "pipeline-cpu,sgkit", "--groups", "datasets",
                                        "--json", str(tmp_path / "g.json")]) == 0
    rows = json.loads((tmp_path / "g.json").read_text())
    assert [r["label"] for r in rows] == ["pipeline-cpu", "sgkit"]
    assert rows[0]["agrees_with_sgkit"] == "0.0e+00 (call_genotype_mask)"


def test_genomics_sgkit_agree_value_by_value(tmp_path):
    """Results are compared value by value where saved: NaN in other places is a difference the
    digests (the same sums and NaN counts) would not see."""
    bench = load("genomics_sgkit")
    x, y = np.array([1.0, np.nan, 1.0]), np.array([1.0, 1.0, np.nan])
    rows = []
    for tool, v in (("a", x), ("b", y)):
        np.savez(tmp_path / f"{tool}.g.npz", m=v)
        rows.append({"tool": tool, "group": "g", "digest": {"m": [2.0, 1.0, 1, [3]]}})
    assert bench._agree(rows[0], rows[1], str(tmp_path)) == "m: NaNs in other places"
    assert bench._agree(rows[0], rows[1]) == "0.0e+00 (m)"  # digests only
    np.savez(tmp_path / "b.g.npz", m=x + 1e-3)
    assert bench._agree(rows[0], rows[1], str(tmp_path)) == "1.0e-03 (m)"


def test_scaling_processes_smoke(tmp_path):
    """The user's command as fresh processes, without and with a cluster (a CPU one here), on a
    NetCDF4 store as a climate model writes it: the same output, and each row's figures."""
    stores = load("user_stores").main(["--shape", "20,9,12", "--workdir", str(tmp_path), "--only", "zlib"])
    bench = load("scaling")
    out = bench.main(["--store", stores["zlib"], "--gpus", "1", "--processes", "1", "--backend", "cpu",
                      "--cluster-profile", "local-cpu", "--workdir", str(tmp_path), "--json", str(tmp_path / "s.json"),
                      "--trace"])
    rows = out["processes"]["rows"]
    assert [r["config"] for r in rows] == ["no cluster", "--cluster local-cpu"]
    assert rows[0]["cluster"]["kind"] == "threads" and rows[1]["cluster"]["kind"] == "distributed"
    for r in rows:
        assert r["same_output"] and r["run_seconds"] > 0 and r["process_seconds"] > r["run_seconds"]
        assert r["read_GBps"] > 0 and r["before_run"]["import"] > 0
        # every process's steps on one clock: the run's milestones in their order
        t = r["trace"]
        assert 0 < t["run_start"] <= t["first_read"] <= t["last_read_end"] <= t["run_end"] < r["process_seconds"]
    alone, cluster = rows[0]["trace"], rows[1]["trace"]
    assert alone["worker_forked"] is None and alone["cluster_start"] is None
    assert 0 < cluster["cluster_start"] <= cluster["worker_forked"] <= cluster["worker_ready"] <= cluster["run_start"]
    assert "results" not in out and (tmp_path / "s.json").exists()


def test_scaling_table_of_the_users_stores_smoke(tmp_path):
    """``--user-stores``: stores made as the users' tools write them, and a VCF Zarr store with the
    GWAS flow, each timed as fresh processes without and with a cluster: one table, the same
    output in every configuration of a store."""
    import subprocess
    import sys

    genomics = tmp_path / "g.vcz"
    subprocess.run([sys.executable, "-m", "pipeline", "demo", "--kind", "genomics", str(genomics), "--samples", "40",
                    "--variants", "300", "--no-progress"], check=True, capture_output=True)
    bench = load("scaling")
    out = bench.main(["--user-stores", "zlib", "--shape", "20,9,12", "--workdir", str(tmp_path), "--genomics-store",
                      str(genomics), "--gpus", "1", "--processes", "1", "--backend", "cpu", "--cluster-profile", "local-cpu",
                      "--json", str(tmp_path / "s.json")])
    assert list(out["processes"]) == ["zlib", "vcf-zarr"] and out["stores"]["vcf-zarr"] == str(genomics)
    for table in out["processes"].values():
        rows = table["rows"]
        assert [r["config"] for r in rows] == ["no cluster", "--cluster local-cpu"]
        assert all(r["same_output"] and r["run_seconds"] > 0 for r in rows)
    assert out["processes"]["vcf-zarr"]["flow_file"].endswith("gwas.yaml")
    # the GWAS filter's statistics pass, computed while the graph is built, counted apart
    assert all(r["before_run"]["statistics"] > 0 for r in out["processes"]["vcf-zarr"]["rows"])
    assert all(r["before_run"]["statistics"] == 0 for r in out["processes"]["zlib"]["rows"])
    assert json.loads((tmp_path / "s.json").read_text())["shape"] == "20,9,12"


def test_out_of_core_smoke(tmp_path):
    bench = load("out_of_core")
    out = bench.main(["--shape", "30,9,12", "--workdir", str(tmp_path), "--backend", "cpu", "--repeat", "1", "--budget", "2GB",
                      "--stores", "v3-default,zlib", "--cold", "--json", str(tmp_path / "ooc.json")])
    assert [r["store"] for r in out["rows"]] == ["v3-default", "zlib"]
    for r in out["rows"]:
        assert r["none"]["run_seconds"] > 0 and r["budget"]["run_seconds"] > 0 and r["ratio_run"] > 0
        assert r["none"]["same_output"] and r["budget"]["same_output"]
        # both budgets hold this input: the same blocks, the same output
        assert r["none"]["runs"][0]["digests"] == r["budget"]["runs"][0]["digests"]
        cold = r["cold"]  # dropped from the page cache, read, dropped again, run: the same output
        assert cold["same_output"] and cold["stored_bytes"] > 4 * 30 * 9 * 12 / 10 and cold["run_seconds"] > 0
        assert 0 <= cold["resident_after_drop"] <= 1 and cold["share"] == pytest.approx(cold["run_rate"] / cold["disk_rate"])
    assert (tmp_path / "ooc.json").exists()


def test_trace_samples_where_the_main_thread_waits(tmp_path):
    """``PIPELINE_TRACE_SAMPLE``: a process's main thread sampled, and a long wait read back as one
    stretch in the function that waited."""
    import os
    import sys

    tracing = Path(__file__).resolve().parent.parent / "benchmarks" / "tracing"
    code = "import time\ndef waits():\n    time.sleep(0.3)\nwaits()\n"
    env = {**os.environ, "PYTHONPATH": str(tracing), "PIPELINE_TRACE_DIR": str(tmp_path),
           "PIPELINE_TRACE_SAMPLE": "0.002"}
    done = subprocess.run([sys.executable, "-c", code], env=env)
    assert done.returncode == 0
    trace = load("process_trace")
    rows = trace.load(tmp_path)
    (pid,) = {r[0] for r in rows}
    lines = trace.samples(rows, pid, least=0.2)
    assert len(lines) == 1 and ":waits:3 < " in lines[0], lines
    assert "sample" not in trace.processes(rows)[pid]["seconds"]


def test_trace_samples_the_threads_asked_for(tmp_path):
    """``PIPELINE_TRACE_THREADS``: threads beyond the main one sampled, by the beginning of their name."""
    import os
    import sys

    tracing = Path(__file__).resolve().parent.parent / "benchmarks" / "tracing"
    code = ("import threading, time\ndef waits():\n    time.sleep(0.3)\n"
            "t = threading.Thread(target=waits, name='reader-7')\nt.start()\nt.join()\n")
    env = {**os.environ, "PYTHONPATH": str(tracing), "PIPELINE_TRACE_DIR": str(tmp_path),
           "PIPELINE_TRACE_SAMPLE": "0.002", "PIPELINE_TRACE_THREADS": "reader"}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
    rows = load("process_trace").load(tmp_path)
    waited = [r for r in rows if r[1] == "sample" and r[2] == "reader-7" and ":waits:3 < " in r[5]]
    assert waited and max(r[4] - r[3] for r in waited) >= 0.2, rows


def test_host_codecs_smoke():
    bench = load("host_codecs")
    rows = bench.main(["--threads", "1,2", "--seconds", "0.05", "--zstd-steps", "2", "--grid", "9,16"])
    assert {(r["codec"], r["threads"]) for r in rows} == {(c, n) for c in bench.CODECS for n in (1, 2)}
    assert all(r["GBps"] > 0 for r in rows)


def test_small_files_smoke(tmp_path):
    rng = np.random.default_rng(0)
    for k in range(30):
        (tmp_path / f"{k}.0.0").write_bytes(rng.integers(0, 256, 1000 + 37 * k, dtype=np.uint8).tobytes())
    rows = load("small_files").main([str(tmp_path), "--threads", "1,2", "--group", "5000", "--busy", "1"])
    assert {(r["way"], r["threads"]) for r in rows} == {(w, n) for w in ("python", "loop") for n in (1, 2)}
    assert all(r["GBps"] > 0 for r in rows)


def test_scaling_touches_memory():
    assert load("scaling").touch_memory(8 << 20, threads=2) > 0
