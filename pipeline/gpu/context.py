"""The CUDA context made while a command imports its libraries.

Made by CuPy once the imports are done, the context cost a ``pipeline run`` 0.2-0.37 s on the
H200 machine (its report's ``backend_init_seconds``), after 1.3-2.3 s of imports that hold the GIL.
Here the driver's ``cuInit`` and ``cuDevicePrimaryCtxRetain`` are called through ctypes, which
releases the GIL for each call, on a thread of its own, so the imports go on meanwhile; CuPy's
runtime later takes the same primary context. This module imports nothing but the standard
library, so that the thread starts before NumPy is imported.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import threading

from .. import config, state


def start() -> None:
    """Start creating the CUDA context of the first visible device (the one CuPy uses) on a
    thread of its own. Measured on the H200 machine, six runs each way alternating: the report's
    ``backend_init_seconds`` went from 0.31 s to 0, the imports beside the driver's work took
    0.11 s longer (medians), and the processes 2.60 s against 2.78 s. (A context made through
    CuPy on a thread, tried before, needs CuPy imported first and gained nothing.) Without a
    CUDA driver, or where ``pipeline.gpu.early-context`` is false, nothing happens; any failure
    is left for CuPy to report when the GPU is used."""
    os.environ.update(config.cuda_env())  # before cuInit, here or by CuPy
    if not config.get("gpu.early-context", True):
        return
    with state.context.lock:
        if state.context.thread is not None:
            return
        state.context.thread = threading.Thread(target=_retain_primary_context, name="pipeline-cuda-context", daemon=True)
        state.context.thread.start()


# Chunks of at least this many decoded bytes, each one zstd frame, decode faster with more blocks
# in flight on more streams (:func:`large_frames`). Measured on frames of 303 MB.
LARGE_FRAME = 64 << 20

# Bytes a value of each Zarr v3 data type, spelled here because this module runs before NumPy is
# imported (the context's thread starts first).
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "int32": 4, "uint32": 4,
             "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8, "complex128": 16}


def large_frames(store: str, variable) -> bool:
    """Whether ``variable`` of the Zarr store at ``store`` keeps each chunk as one zstd frame of
    at least :data:`LARGE_FRAME` bytes decoded: zarr's default codec, unsharded, as
    ``xarray.Dataset.to_zarr`` writes it (Zarr v3), or a Zarr v2 Zstd compressor. Read from the
    array's metadata alone (JSON, before any library is imported); False for anything else or
    anything unreadable. nvCOMP decodes such a frame on few of the GPU's units (0.65 s for 303 MB,
    however many decode beside it), so a run over them is faster with more blocks in flight, each
    batch on its own stream (:func:`pipeline.cli._gpu_settings`)."""
    if not isinstance(variable, str) or not isinstance(store, str):
        return False
    folder = os.path.join(store, variable)
    try:
        if os.path.exists(os.path.join(folder, "zarr.json")):
            with open(os.path.join(folder, "zarr.json")) as f:
                meta = json.load(f)
            names = [c.get("name") for c in meta.get("codecs", [])]
            if "zstd" not in names or "sharding_indexed" in names:
                return False
            shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
            itemsize = _ITEMSIZE.get(meta["data_type"], 0)
        else:
            with open(os.path.join(folder, ".zarray")) as f:
                meta = json.load(f)
            if (meta.get("compressor") or {}).get("id") != "zstd" or meta.get("filters"):
                return False
            shape, itemsize = meta["chunks"], int(meta["dtype"][2:]) if meta["dtype"][1:2] in "fiuc" else 0
        return math.prod(shape) * itemsize >= LARGE_FRAME
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _retain_primary_context() -> None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver: the CPU runs, or CuPy reports the GPU missing
        return
    device = ctypes.c_int()
    ctx = ctypes.c_void_p()
    if cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0:
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device)  # kept for the life of the process, as CuPy keeps it


def wait(timeout: float = 10.0) -> None:
    """Wait for :func:`start`'s thread, if one was started (before the process exits:
    the driver's exit handlers must not run beside a call into it)."""
    thread = state.context.thread
    if thread is not None:
        thread.join(timeout)
