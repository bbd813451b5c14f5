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
