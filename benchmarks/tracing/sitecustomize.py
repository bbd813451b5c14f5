"""Where a process's seconds go, in every process of a run: the command's, the fork server's and
its workers' (``benchmarks/scaling.py --trace``; read by ``benchmarks/process_trace.py``).

Python imports ``sitecustomize`` at its start from the first folder of ``PYTHONPATH`` that holds
one: with this folder first and ``PIPELINE_TRACE_DIR`` set, each process appends one JSON line a
step to ``PIPELINE_TRACE_DIR/<pid>.jsonl``: ``[pid, step, thread, start, end, detail]``, seconds
since ``PIPELINE_TRACE_T0`` (a Unix time the caller takes before it starts the command, so that
every process is on one clock). The steps: the process's start, the start of a few libraries'
imports, the collector's pauses over 5 ms, and the calls of the functions in ``WRAP`` (a worker's
start and tasks, a block's read and decode, pinned memory, the run). A worker forked from the fork
server inherits all of it, and writes to a file of its own pid. Without ``PIPELINE_TRACE_DIR``
it does nothing. It changes no function's result, only wraps the calls.

With ``PIPELINE_TRACE_SAMPLE`` (seconds, such as 0.005) a thread of each process also samples
what its main thread, the command's cluster start and distributed's event loop run at that
interval: one step ``sample`` for each stretch of a thread's samples in the same place (its
innermost frames, innermost first), for what the wrapped calls do not show. ``PIPELINE_TRACE_THREADS``
adds threads to those: ``all``, or comma-separated beginnings of their names (``ThreadPoolExecutor``
for the threads that compute a run without a cluster and for pipeline's I/O pool, ``Dask-Default``
for a worker's). ``PIPELINE_SWITCH_INTERVAL`` (seconds) sets the interpreter's switch interval
(``sys.setswitchinterval``), traced or not: an experiment on how threads share the GIL."""

import os

if os.environ.get("PIPELINE_SWITCH_INTERVAL"):  # an experiment's knob: the GIL's switch interval (s)
    import sys

    sys.setswitchinterval(float(os.environ["PIPELINE_SWITCH_INTERVAL"]))

if os.environ.get("PIPELINE_TRACE_DIR"):
    import gc
    import importlib.abc
    import importlib.machinery
    import json
    import sys
    import threading
    import time

    _DIR = os.environ["PIPELINE_TRACE_DIR"]
    _T0 = float(os.environ.get("PIPELINE_TRACE_T0") or time.time())
    _FILES: dict = {}
    _LOCK = threading.Lock()

    def _emit(step, start, end, detail=None, thread=None):
        pid = os.getpid()
        with _LOCK:
            f = _FILES.get(pid)
            if f is None:
                f = _FILES[pid] = open(os.path.join(_DIR, f"{pid}.jsonl"), "a", buffering=1)
            f.write(json.dumps([pid, step, thread or threading.current_thread().name, round(start - _T0, 4),
                                round(end - _T0, 4), detail]) + "\n")

    _now = time.time()
    _emit("start", _now, _now, " ".join(sys.argv)[:160])

    WRAP = {
        "pipeline.flows": ["run_flow", "build_flow", "_audit"],
        "pipeline.sinks.zarr": ["write_zarr"],
        "pipeline.exec.compute": ["compute"],
        "pipeline.exec.memory": ["plan"],
        "pipeline.sources": ["open_dataset"],
        "pipeline.exec.cluster": ["start_early", "open_cluster"],
        "pipeline.exec.worker": ["dask_setup"],
        "distributed.worker": ["_run_task"],
        "pipeline.gpu.reader": ["read_block", "_decode_file", "_move_and_decode", "_decode_into_place"],
        "pipeline.gpu.blosc": ["decode_frames", "_decode_on_device", "_stream_table", "_device_table"],
        "pipeline.gpu.nvcomp": ["decode_batch", "_batch", "_decode_sized"],
        "pipeline.kernels.shuffle": ["byte_unshuffle_gpu", "bit_unshuffle_gpu"],
        "pipeline.gpu.engine": ["read_block_host", "to_device"],
        "pipeline.gpu.hdf5": ["read_block", "read_block_host", "decode_block_host", "_move_and_decode", "_decode_on_device"],
        "pipeline.exec.spill": ["to_host", "to_device"],
        "pipeline.gpu.ahead": ["read", "_decode"],
        "pipeline.gpu.pinned": [],
    }
    MARK = ("numpy", "distributed", "dask_cuda", "cupy", "xarray", "zarr", "dask.array", "pandas", "numba")

    def _wrap(module, name):
        fn = getattr(module, name, None)
        if fn is None:
            return
        step = module.__name__.rsplit(".", 1)[-1] + "." + name

        def traced(*args, **kwargs):
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                _emit(step, start, time.time(), str(args[3])[:80] if name == "_run_task" and len(args) > 3 else None)

        setattr(module, name, traced)

    def _wrap_init(module, name, step):
        cls = getattr(module, name, None)
        if cls is None:
            return
        init = cls.__init__

        def traced(self, *args, **kwargs):
            start = time.time()
            init(self, *args, **kwargs)
            _emit(step, start, time.time(), args[0] if args else None)

        cls.__init__ = traced

    class _Finder(importlib.abc.MetaPathFinder):
        seen: set = set()

        def find_spec(self, name, path, target=None):
            if name in MARK and name not in self.seen:
                self.seen.add(name)
                _emit("import " + name, time.time(), time.time())
            if name not in WRAP or ("wrapped", name) in self.seen:
                return None
            self.seen.add(("wrapped", name))
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return None
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                for fn in WRAP[name]:
                    _wrap(module, fn)
                if name == "pipeline.gpu.pinned":
                    _wrap_init(module, "Buffer", "pinned.Buffer")
                if name == "pipeline.gpu.nvcomp":  # nvCOMP's pinned memory (pipeline's allocator)
                    _wrap_init(module, "PinnedAllocation", "nvcomp.PinnedAllocation")

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())

    _gc_start = [0.0]

    def _collector(phase, info):
        if phase == "start":
            _gc_start[0] = time.time()
        elif time.time() - _gc_start[0] > 0.005:
            _emit(f"gc{info.get('generation', '')}", _gc_start[0], time.time())

    gc.callbacks.append(_collector)

    _EVERY = float(os.environ.get("PIPELINE_TRACE_SAMPLE") or 0)

    def _where(frame, depth=5):
        out = []
        while frame is not None and len(out) < depth:
            code = frame.f_code
            out.append(f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return " < ".join(out)

    # the threads sampled: the main one, the command's cluster start, distributed's event loop
    _SAMPLED = ("MainThread", "pipeline-cluster-start", "IO loop")
    _MORE = os.environ.get("PIPELINE_TRACE_THREADS", "")
    _ALL = _MORE.strip() == "all"
    _SAMPLED += tuple(p for p in _MORE.split(",") if p and not _ALL)
    _stretches: dict = {}  # thread name -> the stretch being sampled: [place, since, last]

    def _sample():
        _stretches.clear()
        while True:
            time.sleep(_EVERY)
            frames = sys._current_frames()
            now = time.time()
            for t in threading.enumerate():
                if t.name == "pipeline-trace-sampler" or not (_ALL or t.name.startswith(_SAMPLED)):
                    continue
                frame = frames.get(t.ident)
                here = _where(frame) if frame is not None else None
                s = _stretches.get(t.name)
                if s is None or here != s[0]:
                    _end_stretch(t.name)
                    s = _stretches[t.name] = [here, now, now]
                s[2] = now

    def _end_stretch(name=None):
        for n in [name] if name else list(_stretches):
            s = _stretches.pop(n, None)
            if s is not None and s[0] is not None:
                _emit("sample", s[1], s[2], s[0], thread=n)

    def _start_sampler():
        threading.Thread(target=_sample, name="pipeline-trace-sampler", daemon=True).start()

    def _context_state():
        """At exit, under ``PIPELINE_TRACE_CONTEXT``: a step ``cuda_context`` whose detail says
        whether this process made the primary CUDA context of its first device (active) or not."""
        import ctypes

        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            flags, active = ctypes.c_uint(), ctypes.c_int()
            ok = cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0
            now = time.time()
            _emit("cuda_context", now, now, ("active" if active.value else "none") if ok else "unknown")
        except Exception:
            pass

    if os.environ.get("PIPELINE_TRACE_CONTEXT"):
        import atexit

        atexit.register(_context_state)

    if _EVERY > 0:
        import atexit

        atexit.register(_end_stretch)
        _start_sampler()
        os.register_at_fork(after_in_child=_start_sampler)
