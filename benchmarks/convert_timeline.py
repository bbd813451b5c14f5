"""Where `convert()` spends its time, block by block: when each block reached its writer, its copy
to the device, its wait for nvCOMP, its frames back, its file written; and each nvCOMP batch.

    python benchmarks/convert_timeline.py STORE --runs 2 [--backend gpu]

Times are seconds from the call's start, in this process (imports paid before the first run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--backend", default="gpu")
    p.add_argument("--json")
    args = p.parse_args(argv)

    from pipeline.gpu import encode, pinned
    from pipeline.sinks import convert as C

    events: list[tuple] = []
    lock = threading.Lock()
    t0 = [0.0]

    def mark(kind, start, **kw):
        with lock:
            events.append((kind, start - t0[0], time.perf_counter() - t0[0], threading.get_ident(), kw))

    wrapped = []

    def wrap(owner, name, kind, info=lambda *a, **k: {}):
        real = getattr(owner, name)
        wrapped.append((owner, name, real))

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                mark(kind, t, **info(*a, **k))

        setattr(owner, name, timed)

    wrap(C, "store_shard", "shard", lambda block, region, *a, **k: {"origin": [r.start for r in region]})
    wrap(encode, "_to_device", "to_device")
    wrap(encode.Encoder, "encode", "wait")
    wrap(encode.Encoder, "_encode", "batch", lambda self, cp, nv, codec, stream, batch: {"jobs": len(batch), "bytes": sum(j.nbytes for j in batch)})
    wrap(pinned, "take", "pinned_take", lambda nbytes: {"bytes": nbytes})
    wrap(C, "block_sha", "sha")

    out = {"runs": []}
    work = Path(tempfile.mkdtemp(prefix="convert_timeline-"))
    try:
        for run in range(args.runs):
            events.clear()
            dst = work / f"copy{run}.zarr"
            t0[0] = time.perf_counter()
            C.convert(args.store, dst, backend=args.backend)
            total = time.perf_counter() - t0[0]
            rows = sorted(events, key=lambda e: e[1])
            out["runs"].append({"seconds": total, "events": [{"kind": k, "start": s, "end": e, **kw} for k, s, e, _, kw in rows]})
            print(f"run {run}: {total:.2f} s", flush=True)
            for kind in ("shard", "to_device", "wait", "batch", "pinned_take", "sha"):
                ev = [e for e in rows if e[0] == kind]
                if ev:
                    d = sorted(e[2] - e[1] for e in ev)
                    print(f"  {kind:11s} n={len(ev):3d}  first start {ev[0][1]:.3f}  last end {max(e[2] for e in ev):.3f}  "
                          f"each {d[0]:.3f}-{d[-1]:.3f} (median {d[len(d) // 2]:.3f})", flush=True)
            for e in rows:
                if e[0] == "batch":
                    print(f"    batch {e[1]:.3f}-{e[2]:.3f}  jobs {e[4]['jobs']}  {e[4]['bytes'] / 1e6:.0f} MB", flush=True)
            shutil.rmtree(dst, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for owner, name, real in wrapped:
            setattr(owner, name, real)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
