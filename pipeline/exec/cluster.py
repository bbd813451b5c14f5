"""Where the graph runs: dask's threads in this process, a LocalCluster, a LocalCUDACluster, or an
existing scheduler (multi-node ``dask scheduler`` + ``dask cuda worker``, or dask-jobqueue).

Profiles are YAML files (``configs/*.yaml``), validated before anything starts, unknown keys
rejected. :func:`open_cluster` is a context manager: clusters it starts are always closed, and a
cluster it attached to is left running.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..errors import InputError

PROFILE_DIRS = (Path("configs"), Path(__file__).resolve().parent.parent / "configs")


class ClusterProfile(BaseModel):
    """A cluster profile; which keys apply depends on ``kind``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["threads", "local", "local-cuda", "scheduler"]
    description: str = ""
    # threads / local / local-cuda
    n_workers: int | None = None
    threads_per_worker: int | None = None
    memory_limit: str | int | float | None = None  # host memory per worker ("auto", "16GB", fraction)
    local_directory: str | None = None  # where workers spill to disk
    processes: bool = True
    dashboard_address: str | None = ":0"
    # local-cuda
    CUDA_VISIBLE_DEVICES: str | list[int] | None = None  # all visible GPUs by default
    device_memory_limit: str | int | float | None = None  # device bytes before spilling to host
    rmm_pool_size: str | int | None = None
    # the workers' comms: tcp, ucx (distributed-ucxx), or auto: ucx for GPU workers where
    # distributed-ucxx is installed, else tcp
    protocol: str | None = None
    # local / local-cuda: distributed.scheduler.worker-saturation of the scheduler started here.
    # dask's default, 1.1, sends a worker more reads than it has threads (ceil(1.1 x threads)):
    # one block more a worker than the same threads hold in one process, the margin by which
    # tightly budgeted GPU runs ran out of memory (benchmarks/RESULTS.md); 1.0 sends one a thread
    worker_saturation: float | None = None
    # scheduler
    address: str | None = None
    scheduler_file: str | None = None
    timeout: str = "60s"

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "scheduler" and not (self.address or self.scheduler_file):
            raise ValueError("kind 'scheduler' needs 'address' or 'scheduler_file'")
        if self.kind != "scheduler" and (self.address or self.scheduler_file):
            raise ValueError(f"'address' and 'scheduler_file' belong to kind 'scheduler', not {self.kind!r}")
        gpu_keys = ("CUDA_VISIBLE_DEVICES", "device_memory_limit", "rmm_pool_size")
        if self.kind != "local-cuda" and any(getattr(self, k) is not None for k in gpu_keys):
            raise ValueError(f"{', '.join(gpu_keys)} belong to kind 'local-cuda', not {self.kind!r}")
        if self.kind not in ("local", "local-cuda") and self.worker_saturation is not None:
            raise ValueError(f"worker_saturation belongs to the clusters started here (kinds 'local' and 'local-cuda'), not {self.kind!r}: "
                             "set distributed.scheduler.worker-saturation where the scheduler runs")
        return self


def comms_protocol(protocol: str | None, gpu: bool = True) -> str | None:
    """``protocol`` for the workers, with ``auto`` resolved: for GPU workers UCX where
    distributed-ucxx is installed, else (and for CPU workers) TCP.

    Between the GPU workers of one machine, UCX moves CuPy arrays GPU to GPU (NVLink, or PCIe)
    where TCP copies them through host memory. Measured on the 4-GPU H200 machine: 200 MB from
    one worker to another took 0.023 s over UCX and 0.24 s over TCP, and four GPUs ran the
    monthly anomaly 2.8x slower than one over TCP (its group partials crossing) and 1.5x faster
    over UCX (benchmarks/RESULTS.md)."""
    if protocol != "auto":
        return protocol
    import importlib.util

    return "ucx" if gpu and importlib.util.find_spec("distributed_ucxx") is not None else "tcp"


def _format_errors(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"{source}: {loc}: {e['msg']}")
    return "\n".join(lines)


def find_profile(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    candidates = [d / f"{name_or_path}.yaml" for d in PROFILE_DIRS]
    for c in candidates:
        if c.exists():
            return c
    raise InputError(
        f"cluster profile {name_or_path!r} not found (looked for {', '.join(str(c) for c in candidates)})"
    )


def load_profile(name_or_path: str) -> ClusterProfile:
    path = find_profile(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return ClusterProfile(**data)
    except ValidationError as e:
        raise InputError(_format_errors(str(path), e)) from None


def profile_from_args(
    cluster: str | None = None, scheduler: str | None = None, scheduler_file: str | None = None
) -> ClusterProfile:
    given = [a for a in (cluster, scheduler, scheduler_file) if a]
    if len(given) > 1:
        raise InputError("give at most one of --cluster, --scheduler and --scheduler-file")
    if scheduler:
        return ClusterProfile(kind="scheduler", address=scheduler)
    if scheduler_file:
        if not Path(scheduler_file).exists():
            raise InputError(f"{scheduler_file}: scheduler file not found")
        return ClusterProfile(kind="scheduler", scheduler_file=scheduler_file)
    if cluster:
        return load_profile(cluster)
    return ClusterProfile(kind="threads")


@contextlib.contextmanager
def open_cluster(profile: ClusterProfile) -> Iterator[object | None]:
    """Start or attach to the cluster of ``profile``; yield a ``distributed.Client`` (None for threads).

    A cluster started here is closed on exit, also after an error or an interrupt.
    """
    if profile.kind == "threads":
        if profile.n_workers or profile.threads_per_worker:
            import dask

            with dask.config.set(num_workers=(profile.n_workers or 1) * (profile.threads_per_worker or 1)):
                yield None
        else:
            yield None
        return

    from distributed import Client

    if profile.kind == "scheduler":
        if profile.scheduler_file:
            client = Client(scheduler_file=profile.scheduler_file, timeout=profile.timeout)
        else:
            client = Client(profile.address, timeout=profile.timeout)
        try:
            yield client
        finally:
            client.close()
        return

    kwargs = {
        k: v
        for k, v in dict(
            n_workers=profile.n_workers,
            threads_per_worker=profile.threads_per_worker,
            memory_limit=profile.memory_limit,
            local_directory=os.path.expanduser(profile.local_directory) if profile.local_directory else None,
            dashboard_address=profile.dashboard_address,
            protocol=comms_protocol(profile.protocol, gpu=profile.kind == "local-cuda"),
        ).items()
        if v is not None
    }
    import dask

    saturation = {} if profile.worker_saturation is None else {"distributed.scheduler.worker-saturation": profile.worker_saturation}
    with dask.config.set(saturation):  # read when the scheduler starts
        cluster = _start_cluster(profile, kwargs)
    try:
        client = Client(cluster)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


def _start_cluster(profile: ClusterProfile, kwargs: dict):
    if profile.kind == "local":
        from distributed import LocalCluster

        return LocalCluster(processes=profile.processes, **kwargs)
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as e:
        raise InputError("cluster kind 'local-cuda' needs dask-cuda: install the 'gpu' extra") from e
    devices = profile.CUDA_VISIBLE_DEVICES
    if isinstance(devices, list):
        devices = ",".join(map(str, devices))
    kwargs.pop("n_workers", None)  # one worker per visible GPU
    return LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=devices,
        device_memory_limit=profile.device_memory_limit,
        rmm_pool_size=profile.rmm_pool_size,
        **kwargs,
    )


def describe(client) -> dict:
    """A small summary of where the run happened, for reports."""
    if client is None:
        import dask

        return {"kind": "threads", "workers": 1, "threads": dask.config.get("num_workers", None) or os.cpu_count()}
    info = client.scheduler_info()
    workers = info.get("workers", {})
    return {
        "kind": "distributed",
        "scheduler": client.scheduler.address,
        "workers": len(workers),
        "threads": sum(w.get("nthreads", 0) for w in workers.values()),
    }
