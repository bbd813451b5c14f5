"""Fixed costs: what a command imports, kernels compiled once per machine and only when used, when
page-cache files are pinned, and the startup section of a run's report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dask.config
import pytest
import yaml

from .conftest import requires_gpu

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("dask.array", "distributed", "numba", "cupy")


def _env(**extra):
    return {**os.environ, "DASK_PIPELINE__BACKEND": "cpu", **extra}


def _probe(code: str, env=None) -> list[str]:
    """The words a fresh Python process running ``code`` prints (it must succeed)."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env or _env(), timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from pipeline.demo import write_demo

    root = tmp_path_factory.mktemp("startup")
    write_demo(root / "data" / "demo.zarr", "1MB", seed=3)
    return root


def test_validate_with_data_imports_no_array_library(demo):
    """`pipeline validate` checks every shipped flow against the data without importing dask.array,
    distributed, Numba or CuPy."""
    flows = sorted(str(p) for p in (REPO / "flows").glob("*.yaml") if "variables:" not in p.read_text().split("steps:")[0])
    probe = ("import atexit, sys; atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] if m.split('.')[0] != 'dask' "
             f"else m for m in sys.modules if m == 'dask.array' or m.split('.')[0] in {HEAVY!r}}}), file=sys.stderr)); "
             f"sys.argv = ['pipeline', 'validate', *{flows!r}]; import runpy; runpy.run_module('pipeline', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", probe], cwd=demo, capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("checked against data/demo.zarr") == len(flows), r.stdout
    assert r.stderr.split("LOADED", 1)[1].strip() == "[]", r.stderr


def test_a_run_on_threads_imports_no_distributed(demo, tmp_path):
    """`pipeline run` without a cluster never imports distributed (0.65-1 s of a one-shot run): not
    to look for a client, and not through the sink's ``to_zarr(compute=False)``, whose delayed close
    made dask import it to look for distributed's shuffle tasks. The store it writes is complete."""
    out = tmp_path / "out.zarr"
    probe = ("import atexit, sys; atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules "
             "if m.split('.')[0] == 'distributed' and sys.modules[m] is not None), file=sys.stderr)); "
             f"sys.argv = ['pipeline', 'run', {str(REPO / 'flows' / 'climate_anomaly.yaml')!r}, '--output', {str(out)!r}, "
             "'--no-progress']; import runpy; runpy.run_module('pipeline', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", probe], cwd=demo, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.split("LOADED", 1)[1].strip() == "[]", r.stderr
    from pipeline.sinks.zarr import verify

    assert verify(out)  # every chunk matches the digests of the manifest


def test_the_command_keeps_what_its_imports_made_from_the_collector(demo, tmp_path, monkeypatch):
    """The ``pipeline`` command (a process of its own) freezes what is alive after its imports and
    at its end (``gc.freeze``), with the collector paused while ``run`` imports and on again after,
    and its result is the same; ``cli.main`` called in a process that goes on leaves the collector
    alone."""
    import gc

    from pipeline import cli

    probe = ("import gc, sys; from pipeline.cli import script; "
             f"sys.argv = ['pipeline', 'run', {str(REPO / 'flows' / 'climate_anomaly.yaml')!r}, '--output', "
             f"{str(tmp_path / 'a.zarr')!r}, '--no-progress']; code = script(); "
             "print(code, gc.get_freeze_count() > 10000, gc.isenabled())")
    r = subprocess.run([sys.executable, "-c", probe], cwd=demo, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    # the collector, paused while the run imported, is on again
    assert r.stdout.split()[-3:] == ["0", "True", "True"], r.stdout
    frozen = gc.get_freeze_count()
    monkeypatch.chdir(demo)
    with dask.config.set({"pipeline.backend": "cpu"}):
        code = cli.main(["run", str(REPO / "flows" / "climate_anomaly.yaml"), "--output", str(tmp_path / "b.zarr"),
                         "--no-progress", "--backend", "cpu"])
    assert code == cli.EXIT_OK and gc.get_freeze_count() == frozen and gc.isenabled()
    import xarray as xr

    a, b = (xr.open_zarr(tmp_path / n) for n in ("a.zarr", "b.zarr"))
    xr.testing.assert_equal(a.compute(), b.compute())  # the attributes' history holds the time


def test_to_numpy_imports_no_distributed_and_follows_an_active_client(demo):
    """``pipeline.to_numpy`` of a Dask array computes on dask's threads without importing
    distributed to look for a client (0.33 s of a first call on the GPU machine); once a client
    is active, on that client, as ``.compute()`` would."""
    probe = ("import sys, numpy as np, dask.array as da, pipeline\n"
             "x = da.from_array(np.arange(100.0).reshape(10, 10), chunks=3)\n"
             "print((pipeline.to_numpy(x.sum(0)) == np.arange(100).reshape(10, 10).sum(0)).all(), 'distributed' in sys.modules)\n"
             "from distributed import Client\n"
             "with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as c:\n"
             "    out = pipeline.to_numpy(x.sum(0))\n"
             "    seen = c.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))\n"
             "print((out == np.arange(100).reshape(10, 10).sum(0)).all(), any(p.startswith('sum') for p in seen))\n")
    assert _probe(probe) == ["True", "False", "True", "True"]


def test_the_cuda_context_is_started_early_only_where_the_gpu_may_be_used(tmp_path, monkeypatch):
    """``pipeline run`` and ``convert`` start the CUDA context while they import (gpu/context.py),
    with a cluster too (the command builds the graph of CuPy blocks), unless the CPU is asked for
    (on the command line, in the settings or by the flow) or ``pipeline.gpu.early-context`` is
    false; without a driver the thread does nothing and the command goes on."""
    import argparse

    from pipeline import cli, state
    from pipeline.gpu import context

    flow_cpu, flow_any = tmp_path / "cpu.yaml", tmp_path / "any.yaml"
    flow_cpu.write_text("name: x\nbackend: cpu\nsource: {path: s.zarr, variable: tas}\nsteps: []\n")
    flow_any.write_text("name: x\nsource: {path: s.zarr, variable: tas}\nsteps: []\n")

    def args(backend=None, **kw):
        return argparse.Namespace(backend=backend, cluster=kw.get("cluster"), scheduler=None, scheduler_file=None)

    with dask.config.set({"pipeline.backend": "auto"}):
        assert cli._may_use_gpu(args(), str(flow_any))
        assert not cli._may_use_gpu(args(), str(flow_cpu))
        assert cli._may_use_gpu(args("gpu"), str(flow_cpu))  # the command line wins over the flow
        assert not cli._may_use_gpu(args("cpu"), str(flow_any))
        assert cli._may_use_gpu(args(cluster="local-gpu"), str(flow_any))  # the command builds CuPy graphs
        assert not cli._may_use_gpu(args("cpu", cluster="local-gpu"), str(flow_any))
        assert cli._may_use_gpu(args(), str(tmp_path / "missing.yaml"))  # its error comes later
    with dask.config.set({"pipeline.backend": "cpu"}):
        assert not cli._may_use_gpu(args(), str(flow_any))

    monkeypatch.setattr(state, "context", state.ContextState())
    with dask.config.set({"pipeline.gpu.early-context": False}):
        context.start()
    assert state.context.thread is None
    monkeypatch.setattr(context.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    context.start()
    context.wait()
    assert state.context.thread is not None and not state.context.thread.is_alive()


def _stores(tmp_path):
    """The same small variable as xarray writes it (Zarr v3, zarr's default zstd; Zarr v2, Blosc),
    in large chunks, and sharded by zarr (small zstd frames)."""
    import numpy as np
    import xarray as xr
    import zarr

    ds = xr.Dataset({"tas": (("time", "lat", "lon"), np.zeros((20, 721, 1440), "f4"))}).chunk({"time": 17})
    ds.to_zarr(tmp_path / "v3.zarr")
    ds.to_zarr(tmp_path / "v2.zarr", zarr_format=2)
    ds.chunk({"time": 5}).to_zarr(tmp_path / "v3_small.zarr")
    zarr.create_group(tmp_path / "sharded.zarr").create_array("tas", shape=(20, 721, 1440), chunks=(17, 721, 1440),
                                                              shards=(17, 721, 1440), dtype="f4")
    return {name: str(tmp_path / f"{name}.zarr") for name in ("v3", "v2", "v3_small", "sharded")}


def test_large_zstd_frames_are_found_from_the_metadata_alone(tmp_path):
    """:func:`pipeline.gpu.context.large_frames` reads a variable's JSON metadata: True for zarr's
    default codec on chunks of 64 MiB or more (here 17 x 721 x 1440 float32, 71 MB), False for
    smaller ones, Blosc, shards, a missing variable or store, a NetCDF file."""
    from pipeline.gpu import context

    stores = _stores(tmp_path)
    (tmp_path / "x.nc").write_bytes(b"\x89HDF\r\n\x1a\n")
    assert context.large_frames(stores["v3"], "tas")
    assert not any(context.large_frames(stores[k], "tas") for k in ("v2", "v3_small", "sharded"))
    assert not context.large_frames(stores["v3"], "pr") and not context.large_frames(stores["v3"], None)
    assert not context.large_frames(str(tmp_path / "none.zarr"), "tas")
    assert not context.large_frames(str(tmp_path / "x.nc"), "tas")
    import numcodecs
    import zarr

    # a Zarr v2 Zstd compressor: one frame a chunk too
    zarr.create_array(tmp_path / "zstd2.zarr" / "tas", shape=(20, 721, 1440), chunks=(17, 721, 1440), dtype="<f4",
                      zarr_format=2, compressors=numcodecs.Zstd())
    assert context.large_frames(str(tmp_path / "zstd2.zarr"), "tas")


def test_a_run_over_large_zstd_frames_takes_more_queues_and_threads(tmp_path, monkeypatch):
    """``pipeline.gpu.hardware-queues: auto``: a run over a store of large zstd frames takes 32
    hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, before its context and for its local
    cluster's GPU workers) and 16 task threads where ``pipeline.gpu.threads`` is at its default;
    over other stores CUDA's default and the configured threads. A number applies everywhere, a
    value in the environment is the user's and is kept, and null is CUDA's default."""
    import argparse

    from pipeline import cli, config
    from pipeline.exec import cluster

    stores = _stores(tmp_path)
    flow = tmp_path / "flow.yaml"
    flow.write_text(f"name: x\nsource: {{path: {stores['v2']}, variable: tas}}\nsteps: []\n")

    def settings(given=None, **cfg):  # both keys set here, so that both are restored after
        cfg = {"hardware_queues": "auto", "threads": 8, **cfg}
        with dask.config.set({f"pipeline.gpu.{k.replace('_', '-')}": v for k, v in cfg.items()}):
            cli._gpu_settings(argparse.Namespace(flow=str(flow), input=given))
            return config.cuda_env(), dask.config.get("pipeline.gpu.threads"), cluster._worker_env(gpu=True)

    monkeypatch.delenv(config.CUDA_QUEUES, raising=False)
    env, threads, workers = settings()  # the flow's own store: Blosc
    assert env == {} and threads == 8 and config.CUDA_QUEUES not in workers
    env, threads, workers = settings(stores["v3"])  # --input: zarr's default codec
    assert env == {config.CUDA_QUEUES: "32"} and threads == 16 and workers[config.CUDA_QUEUES] == "32"
    assert config.CUDA_QUEUES not in cluster._worker_env(gpu=False)
    assert settings(stores["v3"], threads=4)[:2] == ({config.CUDA_QUEUES: "32"}, 4)  # the user's threads
    assert settings(stores["v3_small"])[:2] == ({}, 8)
    assert settings(stores["v3"], hardware_queues=None)[:2] == ({}, 8)
    assert settings(stores["v2"], hardware_queues=16)[:2] == ({config.CUDA_QUEUES: "16"}, 8)
    monkeypatch.setenv(config.CUDA_QUEUES, "4")
    assert settings(stores["v3"])[0] == {config.CUDA_QUEUES: "4"}

    # in fresh processes: a script or notebook keeps CUDA's default unless a number is set (before
    # CuPy's import); a run's early context takes its queues, whatever early-context says
    env = {k: v for k, v in _env().items() if k not in (config.CUDA_QUEUES, "DASK_PIPELINE__GPU__HARDWARE_QUEUES")}
    library = "import os; from pipeline import backend; backend._cupy(); print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))"
    assert _probe(library, env=env) == ["None"]
    assert _probe(library, env={**env, "DASK_PIPELINE__GPU__HARDWARE_QUEUES": "16"}) == ["16"]
    command = ("import argparse, os; from pipeline import cli; from pipeline.gpu import context\n"
               f"cli._gpu_settings(argparse.Namespace(flow={str(flow)!r}, input={stores['v3']!r})); context.start(); context.wait()\n"
               "print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))")
    assert _probe(command, env={**env, "DASK_PIPELINE__GPU__EARLY_CONTEXT": "false"}) == ["32"]
    assert _probe(command, env={**env, "DASK_PIPELINE__GPU__HARDWARE_QUEUES": "null"}) == ["None"]


def test_a_context_that_cannot_be_made_is_explained():
    """A CUDA context that fails for lack of the GPU's resources (as when many processes share it)
    names the setting that takes fewer of them."""
    from pipeline import cli

    error = type("CUDARuntimeError", (RuntimeError,), {})("cudaErrorMemoryAllocation: out of memory")
    assert "pipeline.gpu.hardware-queues: null" in cli._hint(error)
    assert cli._hint(type("CUDARuntimeError", (RuntimeError,), {})("cudaErrorInvalidValue")) == ""


# Kernels that each count themselves in, then wait until all have (or a bound of clock cycles
# has passed): whether the work of ``n`` streams runs at once on the GPU.
_MEET = r"""
extern "C" __global__ void meet(int* count, int n, long long limit, int* met, int k) {
    atomicAdd(count, 1);
    long long start = clock64();
    while (atomicAdd(count, 0) < n && clock64() - start < limit) {}
    met[k] = atomicAdd(count, 0) >= n;
}
"""


@requires_gpu
@pytest.mark.gpu
def test_the_work_of_twenty_streams_runs_at_once_under_pipelines_queues():
    """In a fresh process whose context is made as ``pipeline run`` makes it over zarr's default
    store (32 queues: ``pipeline.gpu.hardware-queues``), the work of 20 streams runs at the same
    time: each stream's first kernel sees all 20 counted in. Each stream then has a second kernel,
    as a block's decode queues several: under CUDA's default of 8 queues, a stream beyond 8 shares
    a queue with an earlier one, and its first kernel waits behind that stream's second, which
    waits for the first to give up (after about a second of clock cycles)."""
    code = ("import os, sys; from pipeline.gpu import context\n"
            "context.start(); context.wait(); import cupy as cp\n"
            f"kernel = cp.RawKernel({_MEET!r}, 'meet')\n"
            "n = 20; count = cp.zeros(2, cp.int32); met = cp.zeros((2, n), cp.int32)\n"
            "streams = [cp.cuda.Stream(non_blocking=True) for _ in range(n)]\n"
            "kernel((1,), (1,), (count[1:], cp.int32(1), cp.int64(0), met[1], cp.int32(0)))  # compiled and loaded\n"
            "count[...] = 0; met[...] = 0; cp.cuda.Device().synchronize()\n"
            "for k, s in enumerate(streams):\n"
            "    with s:\n"
            "        kernel((1,), (1,), (count[:1], cp.int32(n), cp.int64(2 * 10**9), met[0], cp.int32(k)))\n"
            "        kernel((1,), (1,), (count[1:], cp.int32(1), cp.int64(0), met[1], cp.int32(k)))\n"
            "cp.cuda.Device().synchronize(); print(os.environ['CUDA_DEVICE_MAX_CONNECTIONS'], int(met[0].sum()))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_DEVICE_MAX_CONNECTIONS", "DASK_PIPELINE__GPU__HARDWARE_QUEUES")}
    assert _probe(code, env={**env, "DASK_PIPELINE__GPU__HARDWARE_QUEUES": "32"}) == ["32", "20"]
    queues, met = _probe(code, env={**env, "CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert queues == "8" and int(met) < 20


@requires_gpu
@pytest.mark.gpu
def test_the_early_context_is_the_one_cupy_uses():
    """In a fresh process, the context made through the driver, before CuPy is imported, is the
    one CuPy's first use of the device finds and computes on."""
    probe = ("import ctypes, sys; from pipeline.gpu import context; context.start(); context.wait()\n"
             "lib = ctypes.CDLL('libcuda.so.1'); flags, active = ctypes.c_uint(), ctypes.c_int()\n"
             "lib.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active))\n"
             "print('cupy' in sys.modules, active.value)\n"
             "import cupy as cp; print(float(cp.arange(10).sum()))\n")
    assert _probe(probe, env=dict(os.environ)) == ["False", "1", "45.0"]


def test_distributed_stays_importable_around_the_metadata_write():
    """The sink's guard marks distributed's shuffle module missing only while distributed is not
    imported, and unmarks it after, so that a later import (a cluster started afterwards) works."""
    probe = ("import sys; from pipeline.exec.compute import distributed_not_imported\n"
             "with distributed_not_imported():\n"
             "    try:\n        import distributed.shuffle._core\n    except ModuleNotFoundError:\n        print('blocked')\n"
             "import distributed.shuffle._core as m; print('after', m.P2PBarrierTask.__name__)\n"
             "with distributed_not_imported():\n    import distributed.shuffle._core; print('imported stays')\n")
    assert _probe(probe) == ["blocked", "after", "P2PBarrierTask", "imported", "stays"]


STEPS = [
    ("standardized_anomaly", {"dim": "time"}),
    ("weighted_mean", {"dims": ["lat", "lon"], "weights": "coslat"}),
    ("rolling_mean", {"window": 3}),
    ("coarsen_mean", {"factors": {"lat": 2, "lon": 3}}),
    ("detrend", {"deg": 1}),
    ("quantile", {"q": 0.9}),
    ("quantile", {"q": [0.1, 0.5]}),
    ("saturation_vapor_pressure", {}),
    ("climatology", {"freq": "month"}),
    ("anomaly", {"freq": "dayofyear"}),
    ("resample_mean", {"freq": "MS"}),
    ("count_above", {"threshold": "25 degC", "freq": "YS"}),
    ("max_spell_length", {"threshold": 290.0, "freq": "YS"}),
]


@pytest.mark.parametrize("op_name,params", STEPS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(STEPS)])
def test_metadata_checks_give_the_result_the_op_builds(demo, op_name, params):
    """Each op's result, as validate derives it from metadata, has the dimensions and sizes of the
    result the op's graph has."""
    import xarray as xr

    from pipeline import ops
    from pipeline.ops import shapes

    op = ops.get(op_name)
    full = op.params(**params).model_dump()
    with xr.open_dataset(demo / "data" / "demo.zarr", engine="zarr", chunks=None) as ds:
        meta = shapes.check(op, shapes.meta_of(ds, "tas"), full)
    built = op.func(xr.open_zarr(demo / "data" / "demo.zarr")["tas"], **full)
    assert meta.dims == tuple(built.dims)
    assert meta.sizes == dict(built.sizes)


@pytest.mark.parametrize(
    "steps",
    [
        [{"op": "climatology", "params": {"freq": "month"}}, {"op": "quantile", "params": {"q": 0.5}}],
        [{"op": "standardized_anomaly"}, {"op": "count_above", "params": {"threshold": "25 degC"}}],
        [{"op": "coarsen_mean", "params": {"factors": {"lat": 500}}}],
        [{"op": "weighted_mean", "params": {"dims": "time"}}, {"op": "detrend", "params": {"deg": 1}}],
    ],
)
def test_validate_refuses_what_graph_building_refuses(demo, tmp_path, steps):
    """A data error in any step of a chain is found from metadata with the message that building
    the graph gives."""
    from pipeline.errors import FlowError
    from pipeline.flows import build_flow, check_data, load_flow

    flow_file = tmp_path / "f.yaml"
    flow_file.write_text(yaml.safe_dump({"name": "f", "source": {"path": str(demo / "data" / "demo.zarr"), "variable": "tas"},
                                         "steps": steps, "sink": {"path": str(tmp_path / "out.zarr")}}))
    flow = load_flow(flow_file)
    with pytest.raises(FlowError) as built:
        build_flow(flow, "cpu")
    with pytest.raises(FlowError) as checked:
        check_data(flow)
    assert str(checked.value) == str(built.value)


_KERNEL_RUN = """
import sys, numpy as np, xarray as xr
from pipeline import ops
from pipeline.kernels import launch
x = xr.DataArray(np.random.default_rng(0).random((40, 6, 5)).astype("float32"), dims=("time", "lat", "lon"),
                 name="tas").chunk({"time": 20})
ops.rolling_mean(x, window=4).compute()
print(launch.compile_seconds())
"""


def _twice(script: str, cache) -> tuple[float, float]:
    """Runs ``script`` in two processes with ``cache`` as pipeline.cache-dir: the compile seconds
    each printed last, once it is checked that the first saved kernels to Numba's disk cache and
    the second only loaded them."""
    env = _env(DASK_PIPELINE__CACHE_DIR=str(cache), NUMBA_DEBUG_CACHE="1")
    env.pop("NUMBA_CACHE_DIR", None)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "data saved" in runs[0].stdout and "data loaded" in runs[1].stdout
    assert "data saved" not in runs[1].stdout, runs[1].stdout
    first, second = (float(r.stdout.split()[-1]) for r in runs)
    return first, second


def test_numba_kernels_compile_once_per_machine_and_only_when_used(tmp_path):
    """A second process loads the compiled kernels from pipeline.cache-dir instead of compiling them,
    and a flow of one op compiles none of the other ops' kernels."""
    first, second = _twice(_KERNEL_RUN, tmp_path / "cache")
    assert first > 0 and second == 0.0, (first, second)
    cached = [p.name for p in (tmp_path / "cache" / "numba").rglob("*.nbi")]
    assert cached and all(name.startswith("rolling.") for name in cached), cached


_CUDA_KERNEL_RUN = """
import threading
from concurrent.futures import ThreadPoolExecutor
import cupy, numpy as np
from pipeline.kernels import genotypes as K, launch
g = np.random.default_rng(0).integers(-1, 2, (300, 70, 2)).astype(np.int8)
d = cupy.asarray(g)
together = threading.Barrier(8)
def first_launch(_):  # threads launching a kernel first at once, as Dask's do
    together.wait()
    return K.variant_genotype_counts_gpu(d, 2, words=True).get()
with ThreadPoolExecutor(8) as pool:
    for counts in pool.map(first_launch, range(8)):
        np.testing.assert_array_equal(counts, K.variant_genotype_counts_cpu(g, 2))
np.testing.assert_array_equal(K.variant_call_counts_gpu(d, 2, words=False).get(), K.variant_call_counts_cpu(g, 2))
np.testing.assert_array_equal(K.variant_call_counts_gpu(d, 2, words=True).get(), K.variant_call_counts_cpu(g, 2))
np.testing.assert_array_equal(K.sample_call_counts_gpu(d).get(), K.sample_call_counts_cpu(g))
print(launch.compile_seconds())
"""


@pytest.mark.gpu
@requires_gpu
def test_cuda_kernels_compile_once_per_machine(tmp_path):
    """The Numba CUDA kernels, closures over their constants, are found in the disk cache by a
    second process (and counted by compile_seconds), with the same results, threads launching
    one first at once included."""
    first, second = _twice(_CUDA_KERNEL_RUN, tmp_path / "cache")
    assert first > 3 * second, (first, second)
    cached = {p.name.split(".")[0] for p in (tmp_path / "cache" / "numba").rglob("*.nbi")}
    assert "genotypes" in cached, cached


@pytest.mark.gpu
@requires_gpu
def test_cupy_keeps_its_kernels_under_the_cache_dir(tmp_path):
    """CuPy's compilations, its own kernels first among them (a selection's take, before any of
    pipeline's), go to pipeline.cache-dir: CuPy reads CUPY_CACHE_DIR once, so pipeline sets it
    before it imports CuPy."""
    env = _env(DASK_PIPELINE__CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CUPY_CACHE_DIR", None)
    script = ("from pipeline import backend as B\nassert B.gpu_available()\nimport cupy\n"
              "x = cupy.arange(10, dtype='int8')\nprint(int(x[cupy.asarray([1, 3, 5])].sum()))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "9"
    assert any((tmp_path / "cache" / "cupy").iterdir())


def test_pinning_waits_for_a_second_read_in_a_one_shot_run(tmp_path):
    """Under ``reread`` a file is pinned from its second read on (a new file or changed contents
    count as a first read); under ``first-read`` and ``auto`` outside the CLI, at once."""
    from pipeline.errors import InputError
    from pipeline.gpu import pinned

    f = tmp_path / "c.0"
    f.write_bytes(b"x" * 100)
    with dask.config.set({"pipeline.gpu.pin-files": "reread"}):
        assert not pinned.read_before(str(f), os.stat(f))
        assert pinned.pin_file(str(f), os.stat(f)) is None  # the policy answers before any CUDA call
        assert pinned.read_before(str(f), os.stat(f))
        f.write_bytes(b"y" * 200)
        assert not pinned.read_before(str(f), os.stat(f))
    for policy in ("first-read", "auto"):
        with dask.config.set({"pipeline.gpu.pin-files": policy}):
            assert pinned.read_before(str(tmp_path / "other"), os.stat(f))
    with dask.config.set({"pipeline.gpu.pin-files": "sometimes"}), pytest.raises(InputError, match="pin-files"):
        pinned.pin_policy()


def test_the_run_command_pins_only_files_read_again():
    from pipeline import cli

    with dask.config.set({"pipeline.gpu.pin-files": "auto"}):
        cli._one_shot_pinning()
        assert dask.config.get("pipeline.gpu.pin-files") == "reread"
    with dask.config.set({"pipeline.gpu.pin-files": "first-read"}):
        cli._one_shot_pinning()
        assert dask.config.get("pipeline.gpu.pin-files") == "first-read"


def test_the_run_command_sets_its_pinning_before_its_cluster_starts(monkeypatch, tmp_path):
    """A local cluster's nannies copy the settings of the process that makes them, as they are
    made: the workers of ``pipeline run --cluster`` pin files as the command does only if the
    command sets its policy before the cluster starts."""
    from pipeline import cli
    from pipeline.exec import cluster

    class Started(Exception):
        pass

    seen = []

    def start_early(profile):
        seen.append(dask.config.get("pipeline.gpu.pin-files"))
        raise Started

    monkeypatch.setattr(cluster, "start_early", start_early)
    args = cli.parser().parse_args(["run", str(REPO / "flows" / "climate_anomaly.yaml"), "--cluster", "local-cpu"])
    args.import_seconds = None
    with dask.config.set({"pipeline.gpu.pin-files": "auto"}), pytest.raises(Started):
        cli.cmd_run(args)
    assert seen == ["reread"]


def test_report_has_the_startup_costs(demo, tmp_path):
    report = tmp_path / "report.json"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pipeline", "run", str(REPO / "flows" / "climate_anomaly.yaml"),
                        "--output", str(tmp_path / "out.zarr"), "--report", str(report), "--no-progress"],
                       cwd=demo, capture_output=True, text=True, env=_env(), timeout=300)
    wall = time.perf_counter() - t
    assert r.returncode == 0, r.stderr
    startup = json.loads(report.read_text())["startup"]
    keys = ("import_seconds", "open_source_seconds", "build_graph_seconds", "statistics_seconds",
            "backend_init_seconds", "compute_seconds")
    assert set(startup) == {*keys, "compile_seconds"}
    assert all(isinstance(startup[k], float) and startup[k] >= 0 for k in startup), startup
    assert startup["import_seconds"] > 0 and startup["compute_seconds"] > 0
    assert startup["statistics_seconds"] == 0  # nothing computed while this flow's graph is built
    assert startup["compile_seconds"] <= startup["compute_seconds"] + startup["build_graph_seconds"]
    assert sum(startup[k] for k in keys) <= wall, (startup, wall)
