"""What each worker of the clusters that pipeline starts does as it starts (``--preload
pipeline.exec.worker``), before it joins the scheduler.

- Its log lines, distributed's included, take the format and level of the settings it inherited
  from the process that started it (:func:`pipeline.log.configure`).
- On a GPU worker, CuPy arrays go to and from the other workers without importing Numba, and on
  every worker NumPy arrays arrive aligned to their type (:mod:`pipeline.exec.serialize`).
- BLAS runs on one thread (:func:`pipeline.kernels.launch.one_blas_thread_from_now`), as
  distributed's nanny asks through the environment (``OMP_NUM_THREADS=1`` and the like), which a
  worker started without a nanny, or with an environment of its own, does not see.
- It imports what its first tasks would otherwise import one after another while the run waits:
  xarray, zarr, pandas and numcodecs, pipeline's sources, sinks, kernels and computation, and on a
  GPU worker CuPy, with the CUDA context made meanwhile (:mod:`pipeline.gpu.context`). A worker of
  a local cluster starts while the run's own process imports its libraries, so this is done beside
  them rather than after them. On a one-GPU machine, a tiny flow's first computation on a fresh
  ``--cluster local-gpu`` took 2.13 s, where the same process without a cluster computed it in
  0.3 s; a ``local-cpu`` worker here imported 80 modules during its first run (0.95 s of its
  1.09 s; the second run took 0.14 s).

Imports are done here, before the worker takes any task, rather than on a thread beside its
tasks: two threads importing modules that import each other can fail one import. A worker forked
from the fork server that ``pipeline run`` starts for a local cluster
(:func:`pipeline.exec.prefork.start`, which imports :data:`WARM` itself) finds them
imported already, and only makes its CUDA context here.

A worker that starts before the run (a SLURM job's, ``dask cuda worker --preload
pipeline.exec.worker``, a local cluster's spawned worker) also imports :data:`LATER`: the op
registry that the tasks' functions live in (with its parameter models), the memory plan and the
GPU reader, and on a CPU worker Numba with its CPU target ready (:mod:`pipeline.exec.warm_cpu`).
Its first graph had imported them as it was unpickled, while the run waited (on one H200 the
GWAS flow's first genotype read came 0.32-0.39 s after the run's start, 0.15-0.19 s with them
imported), and its first compiled kernel Numba (0.5 s). A worker forked for ``pipeline run``
does not: the fork server's imports are the longest path of that command's start, and with these
among them its workers were ready 0.1-1.0 s later on the H200 machines, about what the run gained.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time

GPU_WORKER = "PIPELINE_WORKER_GPU"  # set for the workers that compute on a GPU: their start makes the device ready
WARM = ("numpy", "pandas", "xarray", "zarr", "numcodecs", "dask.array", "pipeline.sources", "pipeline.sinks.zarr",
        "pipeline.exec.compute", "pipeline.kernels", "pipeline.kernels.launch")
# what the first graph imports as it is unpickled, and a CPU worker's first kernel: imported before
# it joins by a worker that starts before the run, not by one forked for it (the module docstring)
LATER = ("pipeline.exec.memory", "pipeline.gpu.reader", "pipeline.ops")
LATER_CPU = ("pipeline.exec.warm_cpu",)  # Numba, ready for the CPU kernels: a GPU worker's tasks do not import it
FORKED = "pipeline.exec.forkserver"  # imported first by the fork server of pipeline run's local clusters


def dask_setup(worker) -> None:
    from .. import log

    log.configure()
    t = time.perf_counter()
    gpu = _has_gpu()
    from . import serialize

    if gpu:
        from ..gpu import context

        context.start()  # the driver's work, outside the GIL, beside the imports below
        serialize.register()
    serialize.register_aligned()
    names = WARM + (("cupy",) if gpu else ())
    if FORKED not in sys.modules:  # a worker that starts before the run: all it needs, now
        names += LATER + (() if gpu else LATER_CPU)
    _import(names)
    from ..kernels import launch

    launch.one_blas_thread_from_now()  # after the imports, which load the BLAS libraries to limit
    logging.getLogger(__name__).debug("worker warm-up took %.2f s", time.perf_counter() - t)


def _import(names) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a library this worker lacks: its first task reports what is wrong
            logging.getLogger(__name__).debug("worker warm-up: %s not imported", name, exc_info=True)


def _has_gpu() -> bool:
    """Whether this worker computes on a GPU: started by pipeline as one (``PIPELINE_WORKER_GPU``:
    a dask-cuda worker of kind local-cuda, or of a SLURM job with GPUs), with CuPy installed."""
    import importlib.util

    return os.environ.get(GPU_WORKER) == "1" and importlib.util.find_spec("cupy") is not None
