"""Where a first run's time goes: every thread's stack sampled while one genomics group runs for
the first time in a fresh process (``sys._current_frames`` from a sampling thread, every
``--every`` seconds; faulthandler's dumps crashed a run on the GPU machine), then counted by the
innermost frames inside pipeline, dask, CuPy and Numba. The warm run is timed after it.

    python benchmarks/first_run_stacks.py STORE --group counting --json stacks.json
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

INTEREST = ("pipeline/", "dask/", "cupy", "numba", "nvidia", "zarr/", "numcodecs", "xarray/")


def _chain(frame) -> tuple[str, ...]:
    """The frames of interest of one thread's stack, innermost first."""
    out = []
    while frame is not None:
        path = frame.f_code.co_filename
        if any(k in path for k in INTEREST):
            out.append(f'File "{path}" in {frame.f_code.co_name}')
        frame = frame.f_back
    return tuple(out[:16])


class Sampler(threading.Thread):
    """Samples every other thread's stack every ``every`` seconds until stopped."""

    def __init__(self, every: float):
        super().__init__(daemon=True)
        self.every, self.chains, self.stopped = every, collections.Counter(), threading.Event()
        self.timeline, self.threads = [], collections.Counter()  # (seconds, thread, stack); samples by pool

    def run(self):
        me = threading.get_ident()
        start = time.perf_counter()
        while not self.stopped.wait(self.every):
            names = {t.ident: t.name for t in threading.enumerate()}
            at = round(time.perf_counter() - start, 3)
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    chain = _chain(frame)
                    if chain:
                        self.chains[chain] += 1
                        name = names.get(ident, str(ident))
                        self.timeline.append((at, name, chain[:5]))
                        self.threads[name.split("_")[0]] += 1


def main(argv=None) -> int:
    import pipeline
    import pipeline.genomics as sg
    from genomics_sgkit import _analysis, _dosage, _select

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--group", default="counting")
    p.add_argument("--every", type=float, default=0.25)
    p.add_argument("--pca-algorithm", default="randomized")
    p.add_argument("--backend", default="gpu")
    p.add_argument("--json")
    p.add_argument("--log-compiles", action="store_true", help="log each CUDA kernel's compile (or load) and its seconds")
    a = p.parse_args(argv)
    if a.log_compiles:
        logging.basicConfig(format="%(relativeCreated)8.0f ms %(threadName)s %(message)s")
        logging.getLogger("pipeline.kernels.launch").setLevel(logging.DEBUG)
    ds = _select(pipeline.open_dataset(a.store, backend=a.backend), "pipeline-" + a.backend)
    compute = lambda *xs: pipeline.compute(list(xs))  # noqa: E731
    if a.group in ("gwas", "pca", "distance"):
        ds = _dosage(ds, compute)
    times = []
    sampler = Sampler(a.every)
    for run in range(2):
        if run == 0:
            sampler.start()
        t = time.perf_counter()
        out = _analysis(a.group, sg, ds, (20_000, 2_000), a.pca_algorithm)
        compute(*[v.data if hasattr(v, "dims") else v for v in out.values()])
        times.append(time.perf_counter() - t)
        sampler.stopped.set()
    sampler.join()
    chains = sampler.chains
    inner = collections.Counter()
    for chain, n in chains.items():
        inner[chain[0]] += n
    samples = sum(inner.values())
    from pipeline.kernels import launch

    print(f"{a.group}: first {times[0]:.3f} s, warm {times[1]:.3f} s; {samples} thread samples every {a.every} s; "
          f"compiling {launch.compile_seconds():.2f} s")
    for frame, n in inner.most_common(25):
        print(f"{n:6d}  {frame}")
    if a.json:
        Path(a.json).write_text(json.dumps({"first": times[0], "warm": times[1], "inner": inner.most_common(60),
                                            "threads": sampler.threads.most_common(),
                                            "timeline": sampler.timeline,
                                            "chains": [[n, list(c)] for c, n in chains.most_common(400)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
