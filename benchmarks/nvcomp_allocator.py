"""nvCOMP's pinned host memory from pipeline's allocator (``pipeline.gpu.nvcomp.PinnedAllocation``:
freed without synchronizing the device) against nvCOMP's own way (``cudaHostAlloc``, and
``cudaFreeHost`` at once, which waits for all of the device's work), in one process, alternating.
Each run is a flow's whole run (``pipeline.flows.run_flow``), warm: one untimed run of each first.
Prints the seconds of each run, their medians, and whether both ways wrote the same digests.

    python benchmarks/nvcomp_allocator.py STORE --flow flows/gwas.yaml --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class FreeHost:
    """nvCOMP's own allocator's behaviour: ``cudaHostAlloc``, and ``cudaFreeHost`` as the memory is
    freed."""

    def __init__(self, nbytes: int, stream=None):
        import cupy as cp

        self.ptr = cp.cuda.runtime.hostAlloc(max(1, int(nbytes)), 0)

    def __del__(self):
        import cupy as cp

        cp.cuda.runtime.freeHost(self.ptr)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--flow", default="flows/gwas.yaml")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from pipeline.flows import run_flow
    from pipeline.gpu import nvcomp

    nv = nvcomp._nvcomp()
    ways = {"pipeline": nvcomp.PinnedAllocation, "cudaFreeHost": FreeHost}
    seconds: dict = {w: [] for w in ways}
    compute: dict = {w: [] for w in ways}
    digests: dict = {w: set() for w in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat + 1):
            for way, allocator in ways.items():
                nv.set_pinned_allocator(allocator)
                t = time.perf_counter()
                rep = run_flow(args.flow, backend="gpu", source=args.store, output=str(Path(tmp) / "out.zarr"))
                took = time.perf_counter() - t
                digests[way].add(json.dumps(rep["sink"]["digests"], sort_keys=True))
                if i:
                    seconds[way].append(took)
                    compute[way].append(rep["wall_seconds"])
                    print(f"{way:<14}{took:8.3f} s (compute {rep['wall_seconds']:.3f} s)", flush=True)
    nv.set_pinned_allocator(nvcomp.PinnedAllocation)
    out = {"flow": args.flow, "store": args.store, "seconds": seconds, "compute": compute,
           "medians": {w: statistics.median(s) for w, s in seconds.items()},
           "compute_medians": {w: statistics.median(s) for w, s in compute.items()},
           "same_digests_both_ways": len(set().union(*digests.values())) == 1}
    print(json.dumps({k: out[k] for k in ("flow", "medians", "compute_medians", "same_digests_both_ways")}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
