"""BLAS's threads while Dask's threads compute: one (``pipeline.kernels.launch.one_blas_thread``, as
pipeline computes) against the library's own default (a thread per core for each call), in one
process, alternating. Each run is a flow's whole run (``pipeline.flows.run_flow``: a filter's
statistics pass, the computation and the write), warm: one untimed run of each first. Prints the
seconds of each run, their medians, and whether each way wrote the same digests.

    python benchmarks/blas_threads.py STORE --flow flows/gwas.yaml --backend cpu --repeat 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--flow", default="flows/gwas.yaml")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from threadpoolctl import threadpool_info

    from pipeline.flows import run_flow
    from pipeline.kernels import launch

    ways = {"one thread": launch.one_blas_thread, "default": contextlib.nullcontext}
    seconds: dict = {w: [] for w in ways}
    digests: dict = {w: set() for w in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat + 1):
            for way, limit in ways.items():
                launch.one_blas_thread = limit
                t = time.perf_counter()
                rep = run_flow(args.flow, backend=args.backend, source=args.store, output=str(Path(tmp) / "out.zarr"))
                took = time.perf_counter() - t
                digests[way].add(json.dumps(rep["sink"]["digests"], sort_keys=True))
                if i:
                    seconds[way].append(took)
                    print(f"{way:<12}{took:8.2f} s (compute {rep['wall_seconds']:.2f} s)", flush=True)
    launch.one_blas_thread = ways["one thread"]
    out = {"flow": args.flow, "backend": args.backend, "blas": [(i["internal_api"], i["num_threads"]) for i in threadpool_info()
                                                              if i["user_api"] == "blas"],
           "seconds": seconds, "medians": {w: statistics.median(s) for w, s in seconds.items()},
           "same_digests_each_way": {w: len(d) == 1 for w, d in digests.items()},
           "same_digests_both_ways": len(set().union(*digests.values())) == 1}
    print(json.dumps({k: out[k] for k in ("blas", "medians", "same_digests_each_way", "same_digests_both_ways")}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
