"""The fork server that the workers of the local clusters ``pipeline run`` starts are forked
from, and where the cluster profiles are: what the command does first, before it imports its
cluster module (pydantic's models) and its libraries.

The server's imports are the longest path of such a command's start: its workers were ready
0.2-1.3 s after the command's own imports had ended, on the H200 machines. Started from here, at
the top of ``pipeline run`` (:func:`start_for`), it starts about 0.1 s sooner than after the
cluster module's import and the profile's validation (one H200: 0.31-0.42 s after the command
began importing NumPy, against 0.42-0.61 s). This module imports nothing beyond what ``import
pipeline`` has: the standard library, dask's config and YAML.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import config
from ..errors import InputError
from .worker import FORKED, WARM

PROFILES = Path(__file__).resolve().parent.parent / "profiles"  # the profiles shipped with the package
# what the workers of the clusters pipeline starts run as they start (their logs, their imports)
WORKER_PRELOAD = "pipeline.exec.worker"


def profile_names() -> list[str]:
    """The names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def find_profile(name_or_path: str) -> Path:
    """The file of a profile: the path of a YAML file (a name ending .yaml or .yml, or holding a
    ``/``), or else the name of one shipped with the package, wherever the command runs."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if path.is_file():
            return path
        raise InputError(f"{name_or_path}: cluster profile not found (no such file)")
    shipped = PROFILES / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    raise InputError(f"cluster profile {name_or_path!r} not found: give one of {', '.join(profile_names())} "
                     "(the profiles shipped with pipeline), or the path of a YAML file")


def start_for(name_or_path: str | None) -> bool:
    """Start the fork server now where the profile ``name_or_path`` (``--cluster``) is a local
    cluster whose workers are forked (kind local-cuda, or local with processes; the setting
    ``pipeline.cluster.fork-workers``), reading only its ``kind`` and ``processes``; whether it
    runs. The profile and the settings are validated after, as before a cluster starts
    (:func:`pipeline.exec.cluster.start_early`, which takes this server): a profile or a setting
    this cannot read starts nothing here, and is reported there."""
    if not name_or_path:
        return False
    try:
        import yaml

        data = yaml.safe_load(find_profile(name_or_path).read_text())
        kind = data.get("kind")
        return forks_workers(kind, data.get("processes", True) is True) and start(kind == "local-cuda")
    except Exception:  # reported where the profile and the settings are checked
        return False


def forks_workers(kind: str | None, processes: bool) -> bool:
    """Whether a cluster of ``kind`` forks its workers from the fork server: a local-cuda one, or
    a local one with worker processes, unless ``pipeline.cluster.fork-workers`` is false."""
    return (kind == "local-cuda" or (kind == "local" and processes)) and bool(config.get("cluster.fork-workers", True))


def start(gpu: bool) -> bool:
    """Start multiprocessing's fork server, if not running yet, importing what a worker imports
    (:data:`pipeline.exec.worker.WARM`, and dask-cuda and CuPy for GPU workers), so that the
    workers' processes, forked from it, start with their libraries imported: those imports run
    beside this process's own, before the cluster is asked for its first worker. With
    distributed's default (``spawn``) each worker starts a new interpreter and imports them after
    the nanny asks for it. False where the platform has no fork server (then workers are spawned).

    - **No CUDA in the server**: it is a fresh interpreter, not a fork of this process, so this
      process's threads and CUDA context are not in it; importing CuPy and dask-cuda makes no CUDA
      call, and each worker makes its context after the fork, under the ``CUDA_VISIBLE_DEVICES``
      its nanny gives it (checked on the H200 machine).
    - **The environment**: a worker inherits the server's environment, not this process's when
      the nanny starts it. What must be set before a process starts (distributed's
      ``distributed.nanny.pre-spawn-environ``: one BLAS thread, glibc's trim threshold), and where
      Numba and CuPy keep kernels (read as they are imported), are set here first; the nanny's
      own variables (``distributed.nanny.environ``, dask-cuda's devices) are set by the worker as
      it starts, as with ``spawn``."""
    import multiprocessing
    from multiprocessing import forkserver

    from ..backend import cache_env

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    cache_env()
    os.environ.update({k: os.environ.get(k, v) for k, v in _pre_spawn_environ().items()})
    # distributed's own list (utils.get_mp_context) is set when a nanny first starts a process,
    # once the server runs: it is in this one
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        # FORKED first: its collector (pipeline.exec.forkserver says why)
        [FORKED, "distributed", "dask", "cloudpickle", "msgpack", "tornado", "toolz", "lz4", *WARM, WORKER_PRELOAD]
        + (["dask_cuda", "cupy"] if gpu else []))
    forkserver.ensure_running()  # nothing where it runs already
    return True


def _pre_spawn_environ() -> dict[str, str]:
    """``distributed.nanny.pre-spawn-environ``: from the settings, else from distributed's own
    defaults file, read without importing distributed (this process imports it meanwhile)."""
    import importlib.util

    import dask
    import yaml

    value = dask.config.get("distributed.nanny.pre-spawn-environ", None)
    if value is None:
        spec = importlib.util.find_spec("distributed")
        with open(os.path.join(spec.submodule_search_locations[0], "distributed.yaml")) as f:
            # LibYAML's loader where PyYAML has it: 3 ms against 22 ms for distributed's file
            value = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["distributed"]["nanny"]["pre-spawn-environ"]
    return {k: str(v) for k, v in (value or {}).items() if v is not None}
