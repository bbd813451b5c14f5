"""Where each worker's slab of blocks ends (:mod:`pipeline.exec.locality` places the blocks;
:func:`pipeline.sources.balanced_fits` plans blocks that share evenly between the slabs). Free of
distributed, so that planning blocks imports nothing a run without a cluster does not need."""

from __future__ import annotations

import math


def slab_ends(n: int, threads: list[int], cuts: list[int]) -> list[int]:
    """The end (exclusive) of each worker's slab of ``n`` blocks: slabs in proportion to
    ``threads``, each at most a tenth of its share (rounded down) over it, ending where ``cuts``
    (from :func:`pipeline.exec.locality.straddling`) is lowest, and else nearest to the balanced end."""
    if n < len(threads):
        return [min(k + 1, n) for k in range(len(threads))]
    shares = [n * t / sum(threads) for t in threads]
    caps = [math.ceil(s) + int(s // 10) for s in shares]
    ends, start, balanced = [], 0, 0.0
    for k in range(len(threads) - 1):
        balanced += shares[k]
        lo = max(start + 1, n - sum(caps[k + 1:]))  # leave no more than the next slabs can hold
        hi = min(start + caps[k], n - (len(threads) - k - 1))  # and a block for each of them
        start = min(range(lo, hi + 1), key=lambda b: (cuts[b], abs(b - balanced)))
        ends.append(start)
    return ends + [n]
