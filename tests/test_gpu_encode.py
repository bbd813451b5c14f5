"""nvCOMP compresses the frames `pipeline convert` writes: standard zstd that numcodecs and zarr
decode to the very bytes, the frames of several blocks in one batch, on stores xarray wrote."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import xarray as xr
import zarr
from numcodecs import Zstd

from pipeline.sinks.convert import convert
from pipeline.sinks.zarr import read_manifest, verify

from .conftest import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


def _values(shape, seed, dtype="f4"):
    rng = np.random.default_rng(seed)
    return np.round(280 + np.cumsum(rng.standard_normal(shape), axis=-1), 2).astype(dtype)


def test_frames_are_zstd_that_numcodecs_decodes():
    from pipeline.gpu import encode, pinned

    flat = _values((37, 64), 1).reshape(-1).view(np.uint8)
    size, numbers = 64 * 4, [0, 3, 4, 36]
    frames, buf = encode.compress(flat, size, numbers)
    try:
        assert len(frames) == len(numbers)
        for n, f in zip(numbers, frames):
            assert bytes(Zstd().decode(f.tobytes())) == flat[n * size:(n + 1) * size].tobytes()
    finally:
        pinned.give(buf)


def test_blocks_of_many_threads_share_batches(monkeypatch):
    """Twelve tasks at once: every frame decodes to its own bytes, and some nvCOMP call held the
    frames of several blocks."""
    from pipeline.gpu import encode, pinned

    batches = []
    real = encode.Encoder._encode

    def counting(self, cp, nv, codec, stream, batch):
        batches.append(len(batch))
        return real(self, cp, nv, codec, stream, batch)

    monkeypatch.setattr(encode.Encoder, "_encode", counting)
    blocks = [_values((50, 512), seed).reshape(-1).view(np.uint8) for seed in range(12)]
    size = 512 * 4
    results, start = {}, threading.Barrier(len(blocks))

    def task(k):
        start.wait()
        results[k] = encode.compress(blocks[k], size, range(50))

    threads = [threading.Thread(target=task, args=(k,)) for k in range(len(blocks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, (frames, buf) in results.items():
        decoded = b"".join(bytes(Zstd().decode(f.tobytes())) for f in frames)
        pinned.give(buf)
        assert decoded == blocks[k].tobytes()
    assert sum(batches) == len(blocks) and max(batches) >= 2


@pytest.mark.parametrize("chunks", [{"time": 5}, {"time": 23}])
def test_convert_on_the_gpu_keeps_every_value(tmp_path, chunks, monkeypatch):
    """A store as xarray writes it (Zarr v3, zarr's default codecs), NaNs and blocks cut at odd
    places: the copy compressed on the GPU reads back through plain zarr equal to the source,
    its digests verify, and nvCOMP compressed every shard."""
    from pipeline.gpu import encode

    calls = []
    real = encode.compress
    monkeypatch.setattr(encode, "compress", lambda *a: calls.append(1) or real(*a))
    tas = _values((23, 19, 40), 2)
    tas[3, 4:9, 7] = np.nan
    ds = xr.Dataset({
        "tas": (("time", "lat", "lon"), tas),
        "pr": (("time", "lat", "lon"), _values((23, 19, 40), 3, "f8")),
        "count": (("time", "lat", "lon"), _values((23, 19, 40), 4).astype("i2")),
    })
    src = tmp_path / "src.zarr"
    ds.chunk({"time": 7}).to_zarr(src, zarr_format=3, consolidated=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no shard left to the CPU
        dst = convert(src, tmp_path / "gpu.zarr", inner_bytes="1KB", chunks=chunks, backend="gpu")
    group = zarr.open_group(str(dst), mode="r")
    for name in ds.data_vars:
        np.testing.assert_array_equal(group[name][...], ds[name].values)
        assert group[name].shards[0] == chunks["time"]
    shards = sum(-(-23 // chunks["time"]) for _ in ds.data_vars)
    assert len(calls) == shards
    assert verify(dst) == read_manifest(dst)["digests"]


def test_encode_benchmark_smoke(tmp_path):
    """benchmarks/nvcomp_encode.py at a tiny size, in a process of its own, so that it cannot rot."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "nvcomp_encode.py"
    r = subprocess.run([sys.executable, str(path), "--frames-kb", "64", "--batches", "4,8", "--policies", "CONCURRENCY",
                        "--repeat", "1", "--max-gb", "0.001", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert len(rows) == 2 and all(row["exact"] and row["ratio"] > 1 for row in rows)
