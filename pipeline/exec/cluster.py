"""Where the graph runs: dask's threads in this process, a LocalCluster, a LocalCUDACluster, workers
started as batch jobs by dask-jobqueue (kind ``slurm``), or an existing scheduler (multi-node
``dask scheduler`` + ``dask cuda worker``), reached over TCP or TLS.

Profiles are YAML files, shipped with the package (``pipeline/profiles/NAME.yaml``, named by
``--cluster NAME``) or given by path, validated before anything starts, unknown keys rejected.
:func:`open_cluster` is a context manager: clusters it starts are always closed, and a cluster it
attached to is left running. Everything a local cluster opens (scheduler, workers, nannies,
dashboard) listens on 127.0.0.1 only: a dashboard on every interface serves anyone who reaches the
machine, and it runs code on the workers' behalf. Its workers spill to a directory of the run's
own, inside one that only this user may enter, removed when the cluster closes (and, where the run
was killed, by the next run: :func:`_remove_dead_runs`); they keep compiled kernels where
``pipeline.cache-dir`` says, and log as this process does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .. import config
from ..errors import InputError
from . import prefork
from .prefork import WORKER_PRELOAD, find_profile
from .worker import GPU_WORKER

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
TLS_KEYS = ("tls_ca_file", "tls_client_cert", "tls_client_key")
SLURM_KEYS = ("jobs", "cores", "memory", "gpus_per_job", "walltime", "queue", "account", "log_directory",
              "job_extra_directives", "job_script_prologue", "python", "interface")


class ClusterProfile(BaseModel):
    """A cluster profile; which keys apply depends on ``kind``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["threads", "local", "local-cuda", "scheduler", "slurm"]
    description: str = ""
    # threads / local / local-cuda
    n_workers: int | None = None
    threads_per_worker: int | None = None
    memory_limit: str | int | float | None = None  # host memory per worker ("auto", "16GB", fraction)
    # where workers spill to disk: a directory of each run's own (of each job's, on its compute node,
    # for kind slurm) is made in it and removed at the end; null: in this user's private_directory()
    local_directory: str | None = None
    processes: bool = True
    # local / local-cuda / slurm: the scheduler's dashboard; a bare port (":8787") binds to 127.0.0.1
    dashboard_address: str | None = f"{LOOPBACK}:0"
    # local-cuda, and slurm with gpus_per_job
    CUDA_VISIBLE_DEVICES: str | list[int] | None = None  # all visible GPUs by default
    device_memory_limit: str | int | float | None = None  # device bytes before spilling to host
    rmm_pool_size: str | int | None = None
    # the workers' comms: tcp, ucx (distributed-ucxx), or auto: ucx for GPU workers where
    # distributed-ucxx is installed, else tcp
    protocol: str | None = None
    # local / local-cuda / slurm: distributed.scheduler.worker-saturation of the scheduler started here.
    # dask's default, 1.1, sends a worker more reads than it has threads (ceil(1.1 x threads)):
    # one block more a worker than the same threads hold in one process, the margin by which
    # tightly budgeted GPU runs ran out of memory (benchmarks/RESULTS.md); 1.0 sends one a thread
    worker_saturation: float | None = None
    # scheduler
    address: str | None = None
    scheduler_file: str | None = None
    tls_ca_file: str | None = None  # TLS (tls:// addresses): the CA that signed the scheduler's certificate
    tls_client_cert: str | None = None  # this client's certificate, signed by a CA the scheduler trusts
    tls_client_key: str | None = None  # its private key (unless the certificate file holds it)
    # scheduler / slurm: how long to wait for the scheduler, or for the jobs' workers;
    # null: pipeline.cluster.connect-timeout
    timeout: str | int | float | None = None
    # slurm: one batch job per `jobs`, each of `cores` cores and `memory` (SLURM's --mem) for its
    # workers: one worker a GPU (`dask cuda worker`, --gres=gpu:N) or, without GPUs, one `dask worker`
    jobs: int = Field(1, ge=1)
    cores: int | None = Field(None, ge=1)
    memory: str | None = None
    gpus_per_job: int = Field(0, ge=0)
    walltime: str | None = None
    queue: str | None = None
    account: str | None = None
    log_directory: str | None = None
    job_extra_directives: list[str] = []
    job_script_prologue: list[str] = []
    python: str | None = None  # the Python of the compute nodes; default: this one
    interface: str | None = None  # the network interface workers and scheduler meet on (ib0, eth0)

    @field_validator("timeout")
    @classmethod
    def _duration(cls, value):
        if value is not None:
            config.seconds(value)
        return value

    @model_validator(mode="after")
    def _check(self):
        given = self.model_fields_set
        if self.kind == "scheduler" and not (self.address or self.scheduler_file):
            raise ValueError("kind 'scheduler' needs 'address' or 'scheduler_file'")
        if self.kind != "scheduler" and (self.address or self.scheduler_file):
            raise ValueError(f"'address' and 'scheduler_file' belong to kind 'scheduler', not {self.kind!r}")
        self._check_gpu_keys()
        if self.kind not in ("local", "local-cuda", "slurm") and self.worker_saturation is not None:
            raise ValueError(f"worker_saturation belongs to the clusters started here (kinds 'local', 'local-cuda' and 'slurm'), "
                             f"not {self.kind!r}: set distributed.scheduler.worker-saturation where the scheduler runs")
        self._check_tls(given)
        self._check_slurm(given)
        return self

    def _check_gpu_keys(self):
        if self.kind == "local-cuda":
            return
        gpu_keys = ("CUDA_VISIBLE_DEVICES", "device_memory_limit", "rmm_pool_size")
        allowed = gpu_keys[1:] if self.kind == "slurm" and self.gpus_per_job else ()
        wrong = [k for k in gpu_keys if getattr(self, k) is not None and k not in allowed]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} belong to kind 'local-cuda' (device_memory_limit and rmm_pool_size "
                             f"also to kind 'slurm' with gpus_per_job), not {self.kind!r}")

    def _check_tls(self, given):
        tls = [k for k in TLS_KEYS if k in given]
        if not tls:
            return
        if self.kind != "scheduler":
            raise ValueError(f"{', '.join(tls)} belong to kind 'scheduler', not {self.kind!r}")
        if not (self.tls_ca_file and self.tls_client_cert):
            raise ValueError("TLS needs tls_ca_file and tls_client_cert (and tls_client_key, unless the certificate file holds the key)")
        if self.address and not self.address.startswith("tls://"):
            raise ValueError(f"the tls_* keys encrypt tls:// addresses: write address: tls://{self.address.split('://')[-1]}")

    def _check_slurm(self, given):
        if self.kind != "slurm":
            slurm = [k for k in SLURM_KEYS if k in given]
            if slurm:
                raise ValueError(f"{', '.join(slurm)} belong to kind 'slurm', not {self.kind!r}")
            return
        local = [k for k in ("n_workers", "threads_per_worker", "memory_limit") if k in given]
        if local:
            raise ValueError(f"{', '.join(local)} belong to the local kinds: a 'slurm' profile sizes its jobs "
                             "with jobs, cores and memory (each job's workers share them)")
        if self.cores is None or self.memory is None:
            raise ValueError("kind 'slurm' needs 'cores' and 'memory': what each job asks of SLURM (--cpus-per-task, --mem)")
        if self.cores < self.gpus_per_job:
            raise ValueError(f"cores: {self.cores} cores cannot feed {self.gpus_per_job} GPU workers (gpus_per_job): give each one at least")
        if any("--gres" in d for d in self.job_extra_directives) and self.gpus_per_job:
            raise ValueError("job_extra_directives: gpus_per_job writes the --gres line; give it once")


def connect_timeout(profile: ClusterProfile) -> float:
    """Seconds to wait for a scheduler, or for a batch system's workers: the profile's ``timeout``,
    else ``pipeline.cluster.connect-timeout``: a run given a wrong address fails in seconds, with
    a message, rather than waiting a minute and ending in a traceback."""
    if profile.timeout is not None:
        return config.seconds(profile.timeout)  # checked with the profile
    try:
        return config.seconds(config.get("cluster.connect-timeout"))
    except ValueError as e:
        raise InputError(f"pipeline.cluster.connect-timeout: {e}") from None


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
def open_cluster(profile: ClusterProfile, starting: Starting | None = None) -> Iterator[object | None]:
    """Start or attach to the cluster of ``profile``; yield a ``distributed.Client`` (None for threads).

    pipeline's settings are checked first (:func:`pipeline.config.check`): the workers of a local
    cluster inherit them. A cluster started here is closed on exit, also after an error or an
    interrupt: for kind ``slurm`` that cancels its jobs; a local cluster's spill directory is
    removed. ``starting``: the cluster of ``profile`` already being started (:func:`start_early`),
    which this takes over (and closes).
    """
    if starting is None:
        config.check()
    if profile.kind == "threads":
        if profile.n_workers or profile.threads_per_worker:
            import dask

            with dask.config.set(num_workers=(profile.n_workers or 1) * (profile.threads_per_worker or 1)):
                yield None
        else:
            yield None
        return

    if profile.kind == "scheduler":
        client = attach(profile)
        try:
            yield client
        finally:
            client.close()
        return

    from distributed import Client

    if starting is None:
        starting = Starting(profile, thread=False)
    try:
        with Client(starting.result()) as client:
            if profile.kind == "slurm":
                _wait_for_jobs(starting.cluster, client, profile)
            yield client
    finally:
        starting.close()


class Starting:
    """A cluster of kind local, local-cuda or slurm being started, in its run directory
    (:func:`_run_directory`), here or on a thread of its own (``thread``); :meth:`result` waits
    for it, :meth:`close` closes it (once started) and removes the directory."""

    def __init__(self, profile: ClusterProfile, thread: bool = True, forkserver: bool = False):
        self.profile = profile
        self.forkserver = forkserver  # workers forked from the started fork server (prefork.start)
        self.cluster = None
        self.error: BaseException | None = None
        self._run = None
        self._thread = None
        if thread:
            self._thread = threading.Thread(target=self._start, name="pipeline-cluster-start", daemon=True)
            self._thread.start()
        else:
            self._start()

    def _start(self) -> None:
        import dask

        profile = self.profile
        settings = {} if profile.worker_saturation is None else {"distributed.scheduler.worker-saturation": profile.worker_saturation}
        if self.forkserver:  # read as each nanny starts its worker's process
            settings["distributed.worker.multiprocessing-method"] = "forkserver"
        t = time.perf_counter()
        try:
            self._run = _run_directory(profile)
            run = self._run.__enter__()
            with dask.config.set({**settings, "temporary-directory": run}):  # read as the scheduler starts
                self.cluster = _start_cluster(profile, run)
        except BaseException as e:  # raised where the cluster is waited for
            self.error = e
        log.debug("cluster %s started in %.2f s", profile.kind, time.perf_counter() - t)

    def result(self):
        if self._thread is not None:
            t = time.perf_counter()
            self._thread.join()
            log.debug("waited %.2f s for the cluster to start", time.perf_counter() - t)
        if self.error is not None:
            raise self.error
        return self.cluster

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        try:
            if self.cluster is not None:
                t = time.perf_counter()
                _close(self.cluster)
                log.debug("cluster %s closed in %.2f s", self.profile.kind, time.perf_counter() - t)
        finally:
            if self._run is not None:
                self._run.__exit__(None, None, None)
                self._run = None


def start_early(profile: ClusterProfile) -> Starting | None:
    """Start a local cluster (kind local or local-cuda) on a thread of its own, so that its
    workers' processes start, import their libraries and prepare their devices
    (:mod:`pipeline.exec.worker`) while this process imports its own; None for other kinds.

    distributed and dask-cuda are imported here first, on this thread: two threads importing the
    same libraries at once can fail an import. On a one-GPU machine, a tiny flow's process took
    9.0-11.3 s with ``--cluster local-gpu`` against 3.8-5.2 s without, the cluster started after
    the process's 2.8 s of imports and its worker importing its libraries at its first tasks."""
    if profile.kind not in ("local", "local-cuda"):
        return None
    config.check()
    # first, so that its imports start before this process's (pipeline run has started it already)
    forked = prefork.forks_workers(profile.kind, profile.processes) and prefork.start(profile.kind == "local-cuda")
    import distributed  # noqa: F401  (imported on this thread, above)

    if profile.kind == "local-cuda":
        with contextlib.suppress(ImportError):  # reported where the cluster is waited for
            import dask_cuda  # noqa: F401
    return Starting(profile, forkserver=forked)


# how long a worker of a local cluster has to close and exit: distributed's nannies kill one after
# 4 s (and log "killed by signal 9"), which workers on a loaded machine exceed
CLOSE_TIMEOUT = 30


def _close(cluster) -> None:
    """Close ``cluster``: a local one's nannies first, each given CLOSE_TIMEOUT to stop its worker."""
    from distributed import Nanny

    nannies = [w for w in getattr(cluster, "workers", {}).values() if isinstance(w, Nanny)]

    async def close_nannies():
        import asyncio

        await asyncio.gather(*(n.close(timeout=CLOSE_TIMEOUT) for n in nannies))

    try:
        if nannies:
            cluster.sync(close_nannies)
    finally:
        cluster.close()


def private_directory() -> Path:
    """This user's directory for spill files, ``pipeline-<uid>`` in the temporary directory
    (``$TMPDIR``, else /tmp): made with mode 0700 or, where it exists, checked to be a directory
    (not a link) of this user's that no one else may enter. Other users of a machine may read a
    directory they can enter, and may make one where this user's is expected: an InputError names
    the directory and what is wrong with it."""
    path = Path(tempfile.gettempdir()) / f"pipeline-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        wrong = "it is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        wrong = "it is not a directory"
    elif st.st_uid != os.getuid():
        wrong = f"it belongs to another user (uid {st.st_uid}, not {os.getuid()})"
    elif st.st_mode & 0o077:
        wrong = f"other users may enter it (mode {stat.S_IMODE(st.st_mode):o}, expected 700)"
    else:
        return path
    raise InputError(f"{path}: refusing to spill there: {wrong}\n"
                     "  remove it, or name a directory of your own as the cluster profile's local_directory")


@contextlib.contextmanager
def _run_directory(profile: ClusterProfile) -> Iterator[str]:
    """A directory of this run's own for the scratch files of the scheduler started here and of a
    local cluster's workers (their spill files), made (mode 0700) in the profile's
    ``local_directory`` (a local cluster's) or else in :func:`private_directory`, marked as a live
    run's (:func:`_mark_alive`), and removed with everything in it at the end. A run killed
    before its end (SIGKILL, the OOM killer, a batch system's time limit) cannot remove it: the
    next run that makes its own in the same place does (:func:`_remove_dead_runs`)."""
    local = profile.local_directory if profile.kind in ("local", "local-cuda") else None
    parent = Path(local).expanduser() if local else private_directory()
    with contextlib.ExitStack() as stack:
        try:
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            run = stack.enter_context(scratch_directory(parent))
        except OSError as e:
            raise InputError(f"local_directory: {parent}: cannot make a directory there ({e.strerror or e})") from None
        yield run


@contextlib.contextmanager
def scratch_directory(parent: Path, prefix: str = "run-") -> Iterator[str]:
    """A new directory (mode 0700) in ``parent``, named ``prefix`` and a random suffix, marked as
    this live run's (:func:`_mark_alive`) and removed with everything in it at the end; first, the
    directories of the same prefix there that runs killed before their end left are removed
    (:func:`_remove_dead_runs`). OSError where it cannot be made."""
    import shutil

    run = tempfile.mkdtemp(prefix=prefix, dir=parent)
    mark = None
    try:
        mark = _mark_alive(Path(run))
        _remove_dead_runs(parent, prefix)
        yield run
    finally:
        shutil.rmtree(run, ignore_errors=True)
        if mark is not None:
            os.close(mark)  # only once the folder is gone: no other run sees it unlocked before


# The file that marks a run directory as pipeline's, held locked (flock) by its run while it lives.
RUN_MARK = ".pipeline-run"


def _mark_alive(run: Path) -> int:
    """Mark ``run`` as the scratch folder of this live run: its :data:`RUN_MARK` file, locked
    (``flock``, exclusive) until the returned descriptor is closed, records pipeline, this
    process and this host. The kernel drops the lock when the process ends, however it ends. The
    file is locked before it takes its name, so no other run ever finds it unlocked while this one
    lives; it is not inherited by the processes this one starts (``O_CLOEXEC``)."""
    new = run / f"{RUN_MARK}.new"
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pipeline": "run", "pid": os.getpid(), "host": os.uname().nodename}).encode())
        os.rename(new, run / RUN_MARK)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _dead_run(folder: str) -> Iterator[dict | None]:
    """The record of the run whose scratch folder ``folder`` is, where that run is dead, its lock
    held for the block (of two runs clearing it, one does); else None: a folder without
    pipeline's mark (not pipeline's, or a run about to mark it), another user's, a run that still
    lives, or one on another host.

    The lock is the test of life. ``flock`` is kept by the kernel of the host whose process took
    it; on a shared file system (NFS, Lustre, GPFS) whether another host sees it depends on the
    mount (Linux's NFS client sends it to the server; ``local_lock=flock``, Lustre without the
    ``flock`` option and CIFS keep it on the host). So only a folder this host's run made is
    judged by its lock: one of another host is left to a run on that host."""
    try:
        fd = os.open(os.path.join(folder, RUN_MARK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield _dead_record(fd)
    finally:
        os.close(fd)


def _dead_record(fd: int) -> dict | None:
    """What the mark open at ``fd`` says of its run, where it is this user's, this host's run's,
    and no one holds its lock (then this process does); else None."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None  # alive, or being cleared by another run
    try:
        record = json.loads(os.pread(fd, 4096, 0))
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("pipeline") != "run" or record.get("host") != os.uname().nodename:
        return None
    return record


def directory_bytes(path: str | os.PathLike) -> int:
    """The bytes of the files under ``path`` (those that vanish meanwhile not counted)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _remove_dead_runs(parent: Path, prefix: str = "run-") -> None:
    """Remove the run directories in ``parent`` (``prefix*``, this user's) whose run died without
    removing its own (:func:`_dead_run`); log each with the bytes it held. Nothing else is touched."""
    import shutil

    from dask.utils import format_bytes

    with os.scandir(parent) as entries:
        folders = [e.path for e in entries if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)
                   and e.stat(follow_symlinks=False).st_uid == os.getuid()]
    for folder in folders:
        with _dead_run(folder) as record:
            if record is None:
                continue
            size = directory_bytes(folder)
            shutil.rmtree(folder, ignore_errors=True)
        if os.path.lexists(folder):
            log.warning("could not remove all of %s, the scratch folder of a run that was killed (pid %s)", folder, record.get("pid"))
        else:
            log.info("removed %s (%s), the scratch folder of a run that was killed (pid %s)", folder, format_bytes(size), record.get("pid"))


def attach(profile: ClusterProfile):
    """A ``distributed.Client`` of the running scheduler of a kind ``scheduler`` profile, or an
    error naming the address (and the scheduler file) when none answers within the timeout."""
    from distributed import Client

    address, source = _scheduler_address(profile)
    security = _security(profile, address)
    timeout = connect_timeout(profile)
    try:
        return Client(address, timeout=timeout, security=security)
    except (OSError, TimeoutError) as e:
        raise InputError(
            f"no dask scheduler answered at {address}{source} within {timeout:g} s ({type(e).__name__}: {e})\n"
            "  check that the scheduler runs, that this machine reaches it"
            f"{' and that it trusts this certificate' if address.startswith('tls://') else ''}; "
            "the profile's timeout or pipeline.cluster.connect-timeout sets how long to wait"
        ) from None


def _scheduler_address(profile: ClusterProfile) -> tuple[str, str]:
    """The scheduler's address, read from the scheduler file where the profile names one, and
    where it came from, for messages."""
    if not profile.scheduler_file:
        return profile.address, ""
    path = Path(profile.scheduler_file).expanduser()
    try:
        address = json.loads(path.read_text())["address"]
    except FileNotFoundError:
        raise InputError(f"{path}: scheduler file not found") from None
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a scheduler file (JSON with the scheduler's 'address', as `dask scheduler "
                         f"--scheduler-file` writes it): {type(e).__name__}: {e}") from None
    return address, f" (from the scheduler file {path})"


def _security(profile: ClusterProfile, address: str):
    """``distributed.security.Security`` for a ``tls://`` address: the profile's certificates,
    else those of dask's config (``distributed.comm.tls.*``); None for other addresses."""
    from distributed.security import Security

    if profile.tls_ca_file:
        files = {k: getattr(profile, k) for k in TLS_KEYS if getattr(profile, k)}
        for key, file in files.items():
            if not Path(file).expanduser().is_file():
                raise InputError(f"{key}: {file}: no such file (a PEM file is expected)")
        if not address.startswith("tls://"):
            raise InputError(f"the profile's tls_* keys encrypt tls:// addresses, and the scheduler's is {address}")
        return Security(require_encryption=True, **{k: str(Path(f).expanduser()) for k, f in files.items()})
    if not address.startswith("tls://"):
        return None
    security = Security()
    if not (security.tls_ca_file and security.tls_client_cert):
        raise InputError(
            f"{address}: a TLS scheduler needs a CA file and a client certificate: set tls_ca_file, tls_client_cert "
            "and tls_client_key in a cluster profile (kind scheduler), or distributed.comm.tls.ca-file, "
            "distributed.comm.tls.client.cert and distributed.comm.tls.client.key in dask's config"
        )
    return security


def _loopback(dashboard_address: str | None) -> str | None:
    """A bare port binds to 127.0.0.1: dask would serve it on every interface."""
    if dashboard_address is not None and dashboard_address.startswith(":"):
        return LOOPBACK + dashboard_address
    return dashboard_address


def _worker_env(gpu: bool = False) -> dict[str, str]:
    """The environment of the workers' processes: dask's ``distributed.nanny.environ``, where
    Numba and CuPy keep compiled kernels (``pipeline.cache-dir``, unless NUMBA_CACHE_DIR or
    CUPY_CACHE_DIR are set), which they read at their import, before pipeline's (dask-cuda imports
    CuPy), and for GPU workers ``PIPELINE_WORKER_GPU``, by which their start prepares the device
    (:mod:`pipeline.exec.worker`); dask-cuda replaces the environment a nanny is given, not this
    setting."""
    import dask

    from ..backend import cache_env

    cache_env()
    caches = {var: os.environ[var] for var in ("NUMBA_CACHE_DIR", "CUPY_CACHE_DIR")}
    gpu_env = {GPU_WORKER: "1", **config.cuda_env()} if gpu else {}
    return {**dask.config.get("distributed.nanny.environ", {}), **caches, **gpu_env}


def _start_cluster(profile: ClusterProfile, local_directory: str | None = None):
    """The cluster of a profile of kind local, local-cuda or slurm, its local workers spilling to
    ``local_directory``."""
    import dask

    from .. import log

    if profile.kind == "slurm":
        return slurm_cluster(profile)
    kwargs = {
        k: v
        for k, v in dict(
            n_workers=profile.n_workers,
            threads_per_worker=profile.threads_per_worker,
            memory_limit=profile.memory_limit,
            local_directory=local_directory,
            protocol=comms_protocol(profile.protocol, gpu=profile.kind == "local-cuda"),
        ).items()
        if v is not None
    }
    # the scheduler, workers and nannies listen on host (threads of one process talk in memory,
    # inproc://, which has none); the dashboard on its own address (None: none)
    if profile.kind == "local-cuda" or profile.processes:
        kwargs["host"] = LOOPBACK
        # workers in processes of their own log as this one does (they inherit the pipeline.log
        # settings) and keep kernels where it does
        kwargs["preload"] = [WORKER_PRELOAD]
    elif "protocol" in kwargs:
        kwargs["host"] = LOOPBACK
    kwargs["dashboard_address"] = _loopback(profile.dashboard_address)
    kwargs["silence_logs"] = log.library_level(config.get("log.level", "info"))  # the workers' lines before their preload
    with dask.config.set({"distributed.nanny.environ": _worker_env(profile.kind == "local-cuda")}):  # read as each nanny starts
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
        if not str(kwargs.get("protocol", "tcp")).startswith("ucx"):
            LocalCUDACluster = _context_beside_start(LocalCUDACluster)
        return LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=devices,
            device_memory_limit=profile.device_memory_limit,
            rmm_pool_size=profile.rmm_pool_size,
            **kwargs,
        )


def _context_beside_start(cls):
    """``dask_cuda.LocalCUDACluster`` whose workers make their CUDA context beside their start
    rather than before they join the scheduler.

    dask-cuda preloads ``dask_cuda.initialize --create-cuda-context`` in each worker, which makes
    the context, and checks its device, before the worker registers; with TCP the time at which
    the context is made does not matter (dask-cuda's own comment there). pipeline's preload
    (:mod:`pipeline.exec.worker`) already makes it on a thread of its own (:mod:`pipeline.gpu.context`,
    on the device dask-cuda made the worker's first visible one). Traced on the 2-GPU H200 machine
    (``benchmarks/scaling.py --processes 2 --trace``), dask-cuda's call held each worker's start
    0.38-0.70 s, and the run waited for it: the command had nothing to do but wait for the
    workers. UCX needs the context before its comms start, so there the preload stays."""

    class LocalCUDACluster(cls):
        def new_worker_spec(self):
            spec = super().new_worker_spec()
            for worker in spec.values():
                options = worker["options"]
                preload, argv = list(options.get("preload", [])), list(options.get("preload_argv", []))
                if "dask_cuda.initialize" in preload and "--create-cuda-context" in argv:
                    preload.remove("dask_cuda.initialize")
                    argv.remove("--create-cuda-context")
                    options["preload"], options["preload_argv"] = preload, argv
            return spec

    return LocalCUDACluster


def slurm_cluster(profile: ClusterProfile):
    """A ``dask_jobqueue.SLURMCluster`` for a kind ``slurm`` profile (its scheduler runs here; no
    job is submitted until it is scaled).

    With ``gpus_per_job`` each job asks for that many GPUs (``--gres=gpu:N``) and starts ``dask
    cuda worker``, one worker a GPU (dask-jobqueue's ``processes``, whose worker names are
    dask-cuda's), each with its share of the job's cores and memory and the profile's device
    limits; without, one ``dask worker`` a job with all its cores.

    The job script makes the workers' spill directory on its node (:func:`_job_spill`), and hands
    them this process's log settings, which their preload (``pipeline.log``) applies."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as e:
        raise InputError("cluster kind 'slurm' needs dask-jobqueue: install the 'jobqueue' extra") from e
    gpus = profile.gpus_per_job
    worker_args = ["--preload", WORKER_PRELOAD]
    if gpus:
        for flag, value in (("--device-memory-limit", profile.device_memory_limit), ("--rmm-pool-size", profile.rmm_pool_size)):
            if value is not None:
                worker_args += [flag, str(value)]
    expand = lambda d: os.path.expanduser(d) if d else None  # noqa: E731
    logs = {"DASK_PIPELINE__LOG__FORMAT": config.get("log.format", "text"), "DASK_PIPELINE__LOG__LEVEL": config.get("log.level", "info")}
    prologue = [*profile.job_script_prologue, *_job_spill(expand(profile.local_directory)),
                "export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in {**logs, **({GPU_WORKER: "1"} if gpus else {})}.items())]
    kwargs = dict(
        cores=profile.cores,
        memory=profile.memory,
        processes=max(gpus, 1),
        worker_command="dask cuda worker" if gpus else "distributed.cli.dask_worker",
        worker_extra_args=worker_args,
        job_extra_directives=([f"--gres=gpu:{gpus}"] if gpus else []) + profile.job_extra_directives,
        job_script_prologue=prologue,
        walltime=profile.walltime,
        queue=profile.queue,
        account=profile.account,
        local_directory='"$PIPELINE_SPILL"',
        log_directory=expand(profile.log_directory),
        python=profile.python,
        interface=profile.interface,
        protocol=comms_protocol(profile.protocol, gpu=bool(gpus)),
        job_name="pipeline-worker",
        # workers on other nodes reach the scheduler; its dashboard stays on this machine's loopback
        scheduler_options={"dashboard_address": _loopback(profile.dashboard_address)},
    )
    return SLURMCluster(**{k: v for k, v in kwargs.items() if v is not None})


def _job_spill(local_directory: str | None) -> list[str]:
    """The job script's lines that make its workers' spill directory, ``$PIPELINE_SPILL``, on its
    compute node: a directory of the job's own (``mktemp -d``: mode 0700, a name no one else can
    have made first) in ``local_directory`` (else the node's $TMPDIR, else /tmp), removed when the
    job's script ends.

    A job killed with SIGKILL (SLURM's, past its time limit or its memory) runs no trap: as a local
    run's (:func:`_mark_alive`, :func:`_remove_dead_runs`), the directory is marked with a file
    that the script and its workers hold locked (``flock``, fd 9, inherited by the workers) while
    they live, and each job removes the marked directories of this node's jobs whose lock is
    free. Where the node lacks util-linux's ``flock``, nothing is marked and nothing removed."""
    if local_directory:
        make = f"mkdir -p {shlex.quote(local_directory)} && PIPELINE_SPILL=$(mktemp -d {shlex.quote(os.path.join(local_directory, 'pipeline-spill.XXXXXXXX'))})"
    else:
        make = 'PIPELINE_SPILL=$(mktemp -d "${TMPDIR:-/tmp}/pipeline-spill.XXXXXXXX")'
    mark = f'"$PIPELINE_SPILL/{RUN_MARK}"'
    return [
        f"{make} || exit 1",
        """trap 'rm -rf "$PIPELINE_SPILL"' EXIT""",
        "if command -v flock >/dev/null; then",
        # locked before it takes its name: no other job finds it unlocked while this one lives
        f"""  exec 9>"$PIPELINE_SPILL/{RUN_MARK}.new" && flock 9 && printf '{{"pipeline": "run", "pid": %d, "host": "%s"}}' $$ """
        f""""$(uname -n)" >&9 && mv "$PIPELINE_SPILL/{RUN_MARK}.new" {mark}""",
        '  for old in "$(dirname "$PIPELINE_SPILL")"/pipeline-spill.*; do',
        f'    mark="$old/{RUN_MARK}"',
        '    if [ "$old" != "$PIPELINE_SPILL" ] && [ ! -L "$old" ] && [ -O "$old" ] && [ -f "$mark" ] && [ ! -L "$mark" ] '
        """&& grep -qF "$(printf '"host": "%s"' "$(uname -n)")" "$mark" && size=$(du -sh "$old" | cut -f1) """
        """&& flock -n "$mark" rm -rf "$old"; then""",
        '      echo "pipeline: removed $old ($size), the spill folder of a job that was killed" >&2',
        "    fi",
        "  done",
        "fi",
    ]


def _wait_for_jobs(cluster, client, profile: ClusterProfile) -> None:
    """Submit the profile's jobs and wait for all their workers, or fail naming where to look."""
    cluster.scale(jobs=profile.jobs)
    workers = profile.jobs * max(profile.gpus_per_job, 1)
    timeout = connect_timeout(profile)
    try:
        client.wait_for_workers(workers, timeout=timeout)
    except TimeoutError:
        logs = f" and the jobs' logs in {profile.log_directory}" if profile.log_directory else ""
        raise InputError(
            f"{len(client.scheduler_info()['workers'])} of the {workers} workers of {profile.jobs} SLURM job(s) "
            f"connected to {cluster.scheduler_address} within {timeout:g} s\n"
            f"  see `squeue --name pipeline-worker`{logs}; the jobs may wait in the queue longer than the "
            "profile's timeout, or fail to reach this machine (set interface)"
        ) from None


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
