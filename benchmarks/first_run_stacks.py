"""Where a first run's time goes: every thread's stack sampled while one genomics group runs for
the first time in a fresh process (``faulthandler``, every ``--every`` seconds), then counted by
the innermost frames inside pipeline, dask, CuPy and Numba. The warm run is timed after it.

    python benchmarks/first_run_stacks.py STORE --group counting --json stacks.json
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

INTEREST = ("pipeline/", "dask/", "cupy", "numba", "nvidia", "zarr/", "numcodecs", "xarray/")


def _frames(dump: str):
    """(thread, innermost interesting frame, its caller chain) for each thread in each dump."""
    for block in dump.split("\n\n"):
        lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        if not lines:
            continue
        picked = [ln for ln in lines if any(k in ln for k in INTEREST)]
        if picked:
            yield picked[0], tuple(picked[:16])


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
    a = p.parse_args(argv)
    ds = _select(pipeline.open_dataset(a.store, backend=a.backend), "pipeline-" + a.backend)
    compute = lambda *xs: pipeline.compute(list(xs))  # noqa: E731
    if a.group in ("gwas", "pca", "distance"):
        ds = _dosage(ds, compute)
    times = []
    with tempfile.TemporaryFile("w+") as f:
        for run in range(2):
            if run == 0:
                faulthandler.dump_traceback_later(a.every, repeat=True, file=f)
            t = time.perf_counter()
            out = _analysis(a.group, sg, ds, (20_000, 2_000), a.pca_algorithm)
            compute(*[v.data if hasattr(v, "dims") else v for v in out.values()])
            times.append(time.perf_counter() - t)
            faulthandler.cancel_dump_traceback_later()
        f.seek(0)
        dump = f.read()
    inner = collections.Counter()
    chains = collections.Counter()
    for frame, chain in _frames(dump):
        inner[re.sub(r", line \d+", "", frame)] += 1
        chains[chain] += 1
    samples = sum(inner.values())
    print(f"{a.group}: first {times[0]:.3f} s, warm {times[1]:.3f} s; {samples} thread samples every {a.every} s")
    for frame, n in inner.most_common(25):
        print(f"{n:6d}  {frame}")
    if a.json:
        Path(a.json).write_text(json.dumps({"first": times[0], "warm": times[1], "inner": inner.most_common(60),
                                            "chains": [[n, list(c)] for c, n in chains.most_common(40)]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
