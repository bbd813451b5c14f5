"""The CUDA C modules built ahead of time (pipeline/kernels/prebuilt.py): every manifest entry has
the binary of its current source, the keys follow the source, records merge into the manifest;
on a GPU, every binary loads, the kernels come from it, and compute what NVRTC's compile does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

from pipeline.kernels import build, launch, prebuilt


def test_every_manifest_entry_has_the_binary_of_its_current_source():
    # An edited .cu file or Spec changes its key: rebuild with `python -m pipeline.kernels.build
    # build` (nvcc) after recording (benchmarks/record_kernels.sh).
    assert build.manifest(), "the manifest lists no instantiation"
    assert build.problems() == []


def test_the_manifest_covers_the_genomics_and_climate_modules():
    files = {e.get("file") for e in build.manifest()}
    specs = {e["spec"]["name"] for e in build.manifest() if "spec" in e}
    assert {"genotypes.cu", "calls.cu", "popgen.cu", "patterson.cu", "moments.cu", "weighted.cu"} <= files
    assert {"pipeline_standardize", "pipeline_cf_decode"} <= specs


def test_key_follows_the_source_and_the_options():
    source = launch.cuda_source("moments.cu", in_t="float", threads=128, unroll=4)
    k = prebuilt.key(source, launch.FMAD)
    assert k == prebuilt.key(source, launch.FMAD)
    assert k != prebuilt.key(source, ())
    assert k != prebuilt.key(source.replace("float", "double"), launch.FMAD)
    assert k != prebuilt.key(source + " ", launch.FMAD)


def test_binary_is_found_for_a_manifest_entry_and_not_when_switched_off():
    entry = build.manifest()[0]
    source, options = build.render(entry)
    path = prebuilt.binary(source, options)
    assert path is not None and path.parent == prebuilt.DIR and path.stat().st_size > 0
    assert prebuilt.binary(source + "\n// edited", options) is None
    with dask.config.set({"pipeline.gpu.prebuilt-kernels": False}):
        assert prebuilt.binary(source, options) is None


def test_records_render_as_launch_renders_them(tmp_path, monkeypatch):
    log = tmp_path / "kernels.jsonl"
    monkeypatch.setenv(prebuilt.RECORD, str(log))
    module = prebuilt.module_entry("moments.cu", launch.FMAD, {"in_t": "float", "threads": 128, "unroll": 4})
    spec = launch.Spec("flat", "pipeline_test_twice", (("double", "a"),), "return (out_t)(a * x);")
    stream = prebuilt.stream_entry(spec, np.float32, np.float64)
    prebuilt.record(module)
    prebuilt.record(stream)
    prebuilt.record(module)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [module, stream, module]  # JSON round trip: what `add` reads back
    assert build.render(module) == (launch.cuda_source("moments.cu", in_t="float", threads=128, unroll=4), launch.FMAD)
    assert build.render(stream) == (spec.source(np.float32, np.float64), launch.FMAD_CXX17)

    # `add` merges them once into a manifest; `problems` then names the binary they lack
    monkeypatch.setattr(prebuilt, "DIR", tmp_path)
    monkeypatch.setattr(prebuilt, "MANIFEST", tmp_path / "manifest.json")
    assert build.add(log) == 2
    assert build.add(log) == 0
    canonical = lambda entries: sorted(json.dumps(e, sort_keys=True) for e in entries)  # noqa: E731
    assert canonical(build.manifest()) == canonical([module, stream])
    found = build.problems()
    assert len(found) == 2 and all("no binary" in line for line in found)
    (tmp_path / "0123.fatbin").write_bytes(b"x")
    assert any(line.startswith("0123.fatbin: no manifest entry") for line in build.problems())


def test_no_record_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(prebuilt.RECORD, raising=False)
    monkeypatch.chdir(tmp_path)
    prebuilt.record({"file": "x.cu"})
    assert list(tmp_path.iterdir()) == []


# --- on a GPU ---------------------------------------------------------------------------------------


def _kernel_names(source: str) -> list[str]:
    import re

    return re.findall(r"__global__\b.*?\b(pipeline_\w+)\s*\(", source, re.S)


@pytest.mark.gpu
def test_every_binary_loads_and_is_what_launch_returns():
    import cupy

    cc = int(cupy.cuda.Device().compute_capability)
    if cc < 90 or not any(cc // 10 == a // 10 and cc >= a for a in prebuilt.ARCHS):
        pytest.skip(f"not every binary is built for sm_{cc}")  # the cluster kernels: sm_90 and later
    launch.raw_kernel.cache_clear()
    launch._streaming_kernel.cache_clear()
    for entry in build.manifest():
        source, options = build.render(entry)
        names = _kernel_names(source)
        assert names, entry
        path = prebuilt.binary(source, options)
        module = cupy.RawModule(path=str(path))
        for name in names:
            assert module.get_function(name).attributes["binary_version"] >= 80
        if "file" in entry:
            kernel = launch.raw_kernel(entry["file"], names[0], tuple(options), **entry["params"])
        else:
            s = entry["spec"]
            spec = launch.Spec(s["kind"], s["name"], tuple(tuple(p) for p in s["params"]), s["body"], s["prelude"])
            kernel = launch._streaming_kernel(spec, np.dtype(entry["in"]), np.dtype(entry["out"]))
        assert kernel.file_path == str(path), entry


def _results(prebuilt_on: bool) -> dict:
    """Kernels of the genomics and climate families, with the binaries or compiled by NVRTC."""
    import cupy

    from pipeline.kernels import alternate, copies, elementwise, genotypes, gwas, ld, linalg, moments, popgen, trend, weighted

    launch.raw_kernel.cache_clear()
    launch._streaming_kernel.cache_clear()
    rng = np.random.default_rng(7)
    g = rng.integers(-1, 2, size=(301, 257, 2)).astype(np.int8)
    g[rng.random(g.shape) < 0.05] = -1
    x = (rng.standard_normal((40, 19, 33)) * 3 + 280).astype(np.float32)
    x[3, 4, 5] = np.nan
    ac = rng.integers(0, 50, size=(97, 3, 2)).astype(np.uint64)  # (variants, cohorts, alleles)
    out = {}
    with dask.config.set({"pipeline.gpu.prebuilt-kernels": prebuilt_on}):
        dg = cupy.asarray(g)
        out["variant_calls"] = genotypes.variant_call_counts_gpu(dg, 2)
        out["variant_genotypes"] = genotypes.variant_genotype_counts_gpu(dg, 2)
        out["sample_calls"] = genotypes.sample_call_counts_gpu(dg)
        out["per_call"] = (genotypes.call_allele_counts_gpu(dg, 2), alternate.alternate_allele_count_gpu(dg, 2))
        het, hom1, hom2 = (rng.integers(0, 400, size=200).astype(np.int64) for _ in range(3))
        out["hwe"] = genotypes.hwe_exact_gpu(het, hom1, hom2)
        cohort = cupy.asarray(rng.integers(0, 3, size=257).astype(np.int32))
        out["cohort_counts"] = popgen.cohort_allele_count_gpu(dg, cohort, 3, 2)
        out["diversity"] = popgen.diversity_terms_gpu(cupy.asarray(ac))
        for dtype in (np.int8, np.float32):  # the PCA's alternate-allele counts, and a float dosage
            dosage = cupy.asarray(rng.integers(0, 3, size=(60, 257)).astype(dtype))
            mean, scale = rng.random(60) * 2, rng.random(60) + 0.5
            out[f"patterson_{dtype.__name__}"] = (linalg.patterson_moments_gpu(dosage),
                                                   linalg.patterson_standardize_gpu(dosage, mean, scale))
        dx = cupy.asarray(x)
        out["moments"] = moments.moments_gpu(dx, 0)
        m = cupy.nanmean(dx, axis=0, dtype=np.float64)
        s = cupy.nanstd(dx, axis=0, dtype=np.float64)
        out["standardize"] = elementwise.standardize_gpu(dx, m, s, np.float32)
        w = cupy.broadcast_to(cupy.cos(cupy.linspace(-1.4, 1.4, 19))[:, None], (40, 19, 33))
        out["weighted"] = weighted.weighted_sums_gpu(dx, w, (1, 2))
        u = cupy.arange(40, dtype=np.float64)
        out["detrend"] = trend.detrend_block_gpu(dx, u, axis=0, deg=1, out_dtype=np.float32)
        parts = {f: cupy.concatenate([moments.moments_gpu(dx[i : i + 13], 0)[f] for i in (0, 13, 26)]) for f in ("n", "mean", "m2")}
        merged = moments.moments_merge_gpu(parts, (0,))
        out["moments_merge"] = (merged, moments.mean_std_gpu(merged, 0))
        d16 = cupy.asarray(rng.integers(-1, 3, size=(90, 257)).astype(np.int16))  # alternate allele counts
        starts, stops = np.array([0, 30, 60]), np.array([40, 70, 90])
        out["ld"] = ld.ld_r2_gpu(d16, starts, stops, np.minimum(stops, [30, 60, 90]), 0.1)
        out["impute"] = (linalg.patterson_moments_gpu(d16), linalg.fill_missing_gpu(d16, rng.random(90)))
        out["gram"] = linalg.sum_parts_gpu(linalg.patterson_gram_gpu([dosage[:, :100], dosage[:, 100:]], mean, scale)[:1] * 2)
        out["copies"] = (copies.copy_of(d16[::2, ::3]), copies.take_gpu(dg, np.array([5, 1, 300]), 0),
                         copies.take_gpu(d16, np.array([3, 3, 0]), 1))
        q, _ = np.linalg.qr(rng.standard_normal((257, 2)))
        yp = rng.standard_normal((257, 2))
        yp -= q @ (q.T @ yp)
        out["gwas"] = gwas.linreg_block_gpu(linalg.fill_missing_gpu(d16, np.ones(90)), w=np.hstack([q, yp]), gram=q.T @ q,
                                            qyp=q.T @ yp, yps=(yp * yp).sum(0), dof=250)
    return out


def _flat(value):
    if isinstance(value, dict):
        return [a for k in sorted(value) for a in _flat(value[k])]
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flat(v)]
    from pipeline import backend as B

    return [B.to_numpy(value)]


@pytest.mark.gpu
def test_prebuilt_kernels_equal_the_compiled():
    with_binaries, compiled = _results(True), _results(False)
    assert with_binaries.keys() == compiled.keys()
    for name in with_binaries:
        a, b = _flat(with_binaries[name]), _flat(compiled[name])
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=name)
    launch.raw_kernel.cache_clear()
    launch._streaming_kernel.cache_clear()


_FLOW_COMPILES = """
import sys
from pipeline import cli
from pipeline.reduce import aggregation
aggregation.HOST_FINISH_BYTES = int(sys.argv[2])
sys.exit(cli.main(["run", sys.argv[1], "--backend", "gpu", "--log-level", "debug"]))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("flow", ["genomics_qc", "gwas"])
def test_the_genomics_flows_on_the_gpu_compile_no_cupy_kernel(tmp_path, flow):
    """A fresh process runs a genomics flow on the GPU (filters, windows, LD pruning, imputation,
    exact PCA; or a regression) from shipped binaries alone: no CuPy compilation is logged."""
    pytest.importorskip("msprime")  # the flows' demo store
    from pipeline.reduce import aggregation

    path = Path(__file__).resolve().parents[1] / "flows" / f"{flow}.yaml"
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run([sys.executable, "-c", _FLOW_COMPILES, str(path), str(aggregation.HOST_FINISH_BYTES)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / f"{flow}.zarr").exists()
    compiles = [line for line in done.stderr.splitlines() if "CuPy kernel" in line]
    assert compiles == [], "\n".join(compiles)


@pytest.mark.gpu
@pytest.mark.parametrize("host_finish_bytes", [None, 0], ids=["small-partials-on-host", "partials-on-device"])
def test_the_climate_flow_on_the_gpu_compiles_no_cupy_kernel(tmp_path, host_finish_bytes):
    """A fresh process runs the climate flow on the GPU from shipped binaries alone: every CuPy
    compilation (or load from CuPy's disk cache) is logged, and there is none, whether the
    reduction's partials are finished on the host or merged on the device."""
    from pipeline.reduce import aggregation

    flow = Path(__file__).resolve().parents[1] / "flows" / "climate_anomaly.yaml"
    limit = aggregation.HOST_FINISH_BYTES if host_finish_bytes is None else host_finish_bytes
    done = subprocess.run([sys.executable, "-c", _FLOW_COMPILES, str(flow), str(limit)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "climate_anomaly.zarr").exists()
    compiles = [line for line in done.stderr.splitlines() if "CuPy kernel" in line]
    assert compiles == [], "\n".join(compiles)


_HAPLOTYPES = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
logging.getLogger("pipeline").setLevel(logging.DEBUG)
import pipeline, pipeline.genomics as sg
ds = pipeline.open_dataset(sys.argv[1], backend="gpu")
w = sg.window_by_variant(ds, size=100)
h = sg.Garud_H(w, merge=False)
p = sg.pbs(w, cohorts=[(0, 1, 2)], merge=False)
values = [pipeline.to_numpy(v.data) for v in (h.stat_Garud_h1, h.stat_Garud_h2_h1, p.stat_pbs)]
print(type(h.stat_Garud_h12.data._meta).__module__, sum(float(abs(v[v == v]).sum()) for v in values))
"""


@pytest.mark.gpu
def test_garud_h_and_pbs_on_the_gpu_compile_no_cupy_kernel(tmp_path):
    """A fresh process with empty kernel caches computes Garud's H and the PBS on the GPU from
    shipped binaries alone (the hashes' prefix sums by CUDA C, the windows' few hashes and Fst
    finished on the host): no CuPy compilation is logged, and the results are CuPy arrays."""
    pytest.importorskip("msprime")
    from pipeline.demo_genomics import write_genomics_demo

    store = write_genomics_demo(tmp_path / "g.vcz", samples=300, variants=1000, variant_chunk=300, sample_chunk=128)
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run([sys.executable, "-c", _HAPLOTYPES, str(store)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    module, total = done.stdout.split()
    assert module.startswith("cupy") and float(total) > 0, done.stdout
    compiles = [line for line in done.stderr.splitlines() if "CuPy kernel" in line]
    assert compiles == [], "\n".join(compiles)


_COUNTS_ALONE = """
import sys
import cupy, numpy as np
from pipeline.kernels import genotypes as K
g = np.random.default_rng(0).integers(-1, 2, (300, 1001, 2)).astype(np.int8)
d = cupy.asarray(g)
calls, samples = K.variant_call_counts_gpu(d, 2, words=True).get(), K.sample_call_counts_gpu(d, words=True).get()
print(sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")))
np.testing.assert_array_equal(calls, K.variant_call_counts_cpu(g, 2))  # (the CPU twins are Numba's)
np.testing.assert_array_equal(samples, K.sample_call_counts_cpu(g))
"""


@pytest.mark.gpu
def test_loading_a_cuda_c_kernel_imports_no_numba(tmp_path):
    """The CUDA C kernels (shipped compiled) load without importing Numba: that import, where a
    first run had nothing else for Numba to do, held up the threads at their first kernel."""
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run([sys.executable, "-c", _COUNTS_ALONE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[0] == "[]", done.stdout
