"""sgkit's diploid pedigree loops in NumPy: kinship, inbreeding, inverse kinship and the "even"
contributions, with no compilation.

sgkit's loops visit the samples one by one in an order where parents come before their children,
and set each value from values already final. Here the same order is cut into blocks: runs of
consecutive samples none of which is a parent of another in its run, so that a whole block's values
depend only on earlier blocks' (and, for a pair inside a block, on the block's own values against
the earlier samples, computed first). Each value is sgkit's expression of the same operands, in
the same order of operations, so the results are sgkit's bit for bit: kinship's pair of samples is
computed from the side of the later one in sgkit's order, as sgkit's loop computes it; the
contributions and the inverse add their terms in the order sgkit's loops add them.

The dense matrices are the cost: kinship and inbreeding hold an (n + 1) x n matrix (an out-of-order
pedigree's kinship is permuted in it), which sgkit's inbreeding loop does not; the callers use
these functions only up to a bound on the samples.
"""

from __future__ import annotations

import numpy as np


def topological_argsort(parent) -> np.ndarray:
    """sgkit's ``topological_argsort`` by a walk in plain Python, int64 (``pedigree.py`` uses it
    up to ``PLAIN_SAMPLES`` samples, Numba's compiled walk beyond)."""
    n_samples, n_parents = parent.shape
    order = [0] * n_samples
    topological_order(parent.ravel().tolist(), n_parents, [0] * n_samples, order)
    return np.array(order[::-1], dtype=np.int64)


def topological_order(parent, n_parents: int, node_children, order) -> None:
    """sgkit's ``topological_argsort`` before its reversal: ``order`` (n samples, filled) the
    samples children first, from ``parent`` flat (samples x n_parents) and ``node_children`` (n
    zeros)."""
    n_samples = len(node_children)
    for i in range(n_samples):
        for j in range(n_parents):
            p = parent[i * n_parents + j]
            if p >= 0:
                node_children[p] += 1
    insert = 0
    for i in range(n_samples - 1, -1, -1):
        if node_children[i] == 0:
            order[insert] = i
            insert += 1
    i = 0
    while i < insert:
        c = order[i]
        i += 1
        for j in range(n_parents):
            p = parent[c * n_parents + j]
            if p >= 0:
                node_children[p] -= 1
                if node_children[p] == 0:
                    order[insert] = p
                    insert += 1
    if i < n_samples:
        raise ValueError('Pedigree contains a directed loop')


def _check_diploid(parent, allow_half_founders: bool) -> None:
    """sgkit's checks of a diploid pedigree, its messages in its order."""
    if parent.shape[1] != 2:
        raise ValueError('The parents dimension must be length 2')
    if not allow_half_founders and np.any((parent[:, 0] < 0) != (parent[:, 1] < 0)):
        raise ValueError('Pedigree contains half-founders')


def _blocks(parent_position) -> list[tuple[int, int]]:
    """The blocks (start, stop) of positions 0..n: runs where no sample's parent is in the run.
    ``parent_position``: (n, parents) each sample's parents' positions, by position; unknown
    parents -1 or beyond the samples (>= n) where they are never in a run."""
    n = len(parent_position)
    known = np.where(parent_position < n, parent_position, -1)
    latest = known.max(axis=1, initial=-1).tolist()
    starts, start = [], 0
    for position, p in enumerate(latest):
        if p >= start or position == 0:
            starts.append(position)
            start = position
    return list(zip(starts, starts[1:] + [n]))


def _by_position(parent, order):
    """``parent`` in the positions of ``order``: row a the parents' positions of sample
    ``order[a]``, ``n`` where unknown; and each sample's position."""
    n = len(parent)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    rows = parent[order]
    return np.where(rows >= 0, position[rows], n), position


def _kinship_in_order(parent, order) -> np.ndarray:
    """sgkit's diploid kinship loop over ``order``, as an (n + 1, n) matrix in the positions of
    ``order``, its last row zeros (the unknown parent's)."""
    n = len(parent)
    pp, _ = _by_position(parent, order)
    k = np.zeros((n + 1, n))
    for s, e in _blocks(pp):
        p, q = pp[s:e, 0], pp[s:e, 1]
        if s:  # the block's pairs with the earlier samples: (K[p, j] + K[q, j]) / 2
            rows = k[p, :s]
            rows += k[q, :s]
            rows /= 2
            k[s:e, :s] = rows
            k[:s, s:e] = rows.T
        # pairs within the block, each from its later sample's parents, against the columns just set
        inner = k[p, s:e]
        inner += k[q, s:e]
        inner /= 2
        lower = np.tril(inner, -1)
        inner = lower + lower.T
        both = (p < n) & (q < n)
        self_kinship = np.full(e - s, 0.5)
        self_kinship[both] = (1 + k[p[both], q[both]]) / 2
        np.fill_diagonal(inner, self_kinship)
        k[s:e, s:e] = inner
    return k


def kinship_diploid(parent, allow_half_founders: bool = False) -> np.ndarray:
    """sgkit's ``kinship_diploid``: the (n, n) kinship of the samples of ``parent`` (samples, 2),
    over the samples in their stored order where it is sorted (parents first), else over
    ``topological_argsort``'s, as sgkit's."""
    parent = np.asarray(parent, dtype=np.int64)
    _check_diploid(parent, allow_half_founders)
    n = len(parent)
    if np.all(parent < np.arange(n)[:, None]):
        return _kinship_in_order(parent, np.arange(n))[:n]
    order = topological_argsort(parent)
    _, position = _by_position(parent, order)
    return _permuted(_kinship_in_order(parent, order), position)


def _permuted(k, position) -> np.ndarray:
    """``k[position][:, position]`` (``k`` (n + 1, n)), in ``k``'s memory: its columns a few rows
    at a time, then its rows along the permutation's cycles. (Two copies of the matrix, fresh pages
    to fault in, took 0.55 to 3 s at 10,000 samples; this about 0.25 s.)"""
    n = len(position)
    for a in range(0, n, 256):
        k[a:a + 256] = np.take(k[a:a + 256], position, axis=1)
    position = position.tolist()
    done = [False] * n
    for i in range(n):
        if done[i] or position[i] == i:
            continue
        first, j = k[i].copy(), i
        while True:
            done[j] = True
            source = position[j]
            if source == i:
                k[j] = first
                break
            k[j] = k[source]
            j = source
    return k[:n]


def inbreeding_diploid(parent, allow_half_founders: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """sgkit's ``inbreeding_Hamilton_Kerr`` with tau 1 and lambda 0 of a diploid ``parent``: each
    sample's inbreeding and its parents' kinship, both the kinship of its two parents (0 with a
    parent unknown). sgkit reads each needed kinship from its pair's later sample in
    ``topological_argsort``'s order, as ``half * K_ip + half * K_iq``, which equals
    ``(K_ip + K_iq) / 2`` bit for bit: here the kinship loop over that order."""
    parent = np.asarray(parent, dtype=np.int64)
    _check_diploid(parent, allow_half_founders)
    n = len(parent)
    order = topological_argsort(parent)
    k = _kinship_in_order(parent, order)
    pp, position = _by_position(parent, order)
    pp = pp[position]  # by sample again
    both = (pp[:, 0] < n) & (pp[:, 1] < n)
    inbreeding = np.zeros(n)
    inbreeding[both] = k[pp[both, 0], pp[both, 1]]
    return inbreeding, inbreeding.copy()


def inverse_kinship_diploid(parent, self_kinship, parent_kinship, return_relationship: bool = False) -> np.ndarray:
    """sgkit's ``inverse_kinship_Hamilton_Kerr`` with tau 1 (Henderson's rules) of a diploid
    ``parent``, from each sample's self-kinship and its parents' kinship: each sample's terms
    added in ``topological_argsort``'s order, in the order sgkit adds them, by one ``np.add.at``.
    With ``return_relationship`` each term is halved (sgkit's scaling by ploidy 2)."""
    parent = np.asarray(parent, dtype=np.int64)
    self_kinship = np.asarray(self_kinship, dtype=np.float64)
    parent_kinship = np.asarray(parent_kinship, dtype=np.float64)
    n = len(parent)
    i = topological_argsort(parent)
    p, q = parent[i, 0], parent[i, 1]
    has_p, has_q = p >= 0, q >= 0
    both = has_p & has_q
    weight = 0.5  # tau / ploidy
    prod = np.zeros(n)
    prod += np.where(has_p, self_kinship[p] * weight ** 2, 0.0)
    prod += np.where(has_q, self_kinship[q] * weight ** 2, 0.0)
    prod += np.where(both, parent_kinship[i] * weight * weight * 2, 0.0)
    rest = self_kinship[i] - prod
    if np.any(rest == 0):
        raise ValueError('Singular kinship matrix')
    scalar = 1 / rest
    half = 2.0 if return_relationship else 1.0  # sgkit's divisions by ploidy 2 and 2 * sqrt(1 * 1)
    square = weight ** 2 * scalar / half
    cross = weight * scalar / half
    pair = weight * weight * scalar / half
    own = scalar / half
    # sgkit's updates of sample i, in its order: pp, pi, ip, qq, qi, iq, pq, qp, ii
    rows = np.stack([p, p, i, q, q, i, p, q, i], axis=1)
    cols = np.stack([p, i, p, q, i, q, q, p, i], axis=1)
    vals = np.stack([square, -cross, -cross, square, -cross, -cross, pair, pair, own], axis=1)
    used = np.stack([has_p] * 3 + [has_q] * 3 + [both] * 2 + [np.ones(n, bool)], axis=1)
    mtx = np.zeros((n, n))
    np.add.at(mtx.reshape(-1), rows[used] * n + cols[used], vals[used])
    return mtx


def _columns(parent, order, targets):
    """What both contributions need: ``order`` and ``targets`` as int64, the blocks of ``order``'s
    positions, each sample's parents (``n`` where unknown), each sample's position, and a matrix W
    (n + 1, targets) of zeros, a row per sample and a last row for the unknown parent."""
    parent = np.asarray(parent, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    n = len(parent)
    pp, position = _by_position(parent, order)
    parents = np.where(parent >= 0, parent, n)
    return order, targets, _blocks(pp), parents, position, np.zeros((n + 1, len(targets)))


def contribution_from(parent, parent_contribution, order, targets) -> np.ndarray:
    """sgkit's ``contribution_from`` (the loop of the row-tiled ``pedigree_contribution``): row t
    the contribution of sample ``targets[t]`` to each sample, ``0 + C[p] * share_p + C[q] *
    share_q`` over ``order`` (1 at the target), block by block. ``parent_contribution`` (the
    shares) finite and not negative, as the "even" method's halves."""
    order, targets, blocks, parents, position, w = _columns(parent, order, targets)
    share = np.asarray(parent_contribution, dtype=np.float64)
    at = position[targets]
    by = np.argsort(at, kind="stable")
    bounds = np.searchsorted(at[by], [s for s, _ in blocks] + [len(order)])
    for b, (s, e) in enumerate(blocks):
        y = order[s:e]
        acc = np.zeros((e - s, w.shape[1]))
        for k in range(parents.shape[1]):
            acc += w[parents[y, k]] * share[y, k, None]
        w[y] = acc
        t = by[bounds[b]:bounds[b + 1]]
        w[targets[t], t] = 1.0
    return w[:-1].T


def contribution_to(parent, parent_contribution, order, targets) -> np.ndarray:
    """sgkit's ``contribution_to`` (the loop of the column-tiled ``pedigree_contribution``): row t
    the contribution of each sample to ``targets[t]``, pushed from each sample to its parents over
    ``order`` reversed, ``C[p] += C[j] * share`` in sgkit's order: within a block each parent's
    terms in rounds, its first term in the first. ``parent_contribution`` as
    :func:`contribution_from`'s."""
    order, targets, blocks, parents, _, w = _columns(parent, order, targets)
    n, n_parent = parents.shape
    share = np.asarray(parent_contribution, dtype=np.float64)
    w[targets, np.arange(len(targets))] = 1.0
    # sgkit's terms: sample j (positions descending), then its parents in their column order
    at = np.repeat(np.arange(n - 1, -1, -1), n_parent)
    col = np.tile(np.arange(n_parent), n)
    j = order[at]
    p = parents[j, col]
    keep = p < n
    at, col, j, p = at[keep], col[keep], j[keep], p[keep]
    block = np.repeat(np.arange(len(blocks)), [e - s for s, e in blocks])[at]
    # each term's round: how many terms to the same parent came before it in its block
    key = block * (n + 1) + p
    by = np.argsort(key, kind="stable")
    first = np.ones(len(by), bool)
    first[1:] = key[by][1:] != key[by][:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(by)), 0))
    rounds = np.empty(len(by), np.int64)
    rounds[by] = np.arange(len(by)) - start
    # the blocks in sgkit's order (descending), each by rounds: within a round a parent once
    step = np.lexsort((rounds, -block))
    col, j, p, block, rounds = col[step], j[step], p[step], block[step], rounds[step]
    new = np.flatnonzero((block[1:] != block[:-1]) | (rounds[1:] != rounds[:-1])) + 1
    edges = [0, *new.tolist(), len(j)] if len(j) else []
    for a, z in zip(edges[:-1], edges[1:]):
        w[p[a:z]] += w[j[a:z]] * share[j[a:z], col[a:z], None]
    return w[:-1].T
