"""Pedigrees: sgkit's ``parent_indices``, ``pedigree_kinship``, ``pedigree_inbreeding``,
``pedigree_inverse_kinship``, ``pedigree_contribution``, ``pedigree_sel``, ``simulate_genedrop``
and ``display_pedigree``.

A pedigree is small beside the genotypes (samples x parents), and its recursions visit the samples
in an order that only the whole pedigree gives, so, as sgkit's, these run on the host: Numba loops
(sgkit's, compiled on first use and cached on disk) over the whole ``parent`` array, in one Dask
task, lazily. The samples' order and ``pedigree_sel``'s depths are plain Python up to
``PLAIN_SAMPLES`` samples (the loops compile the same source), so that what needs only them
imports no Numba. Up to ``PLAIN_MATRIX_SAMPLES`` samples the diploid kinship, inbreeding and
inverse kinship, and the "even" contributions, are NumPy's (:mod:`._pedigree_plain`: sgkit's
values bit for bit, computed block by block of the samples' order), so that these import no Numba
and a machine's first run compiles nothing; Hamilton-Kerr, the "variable" contributions, kinship in
tiles (``chunks``), ``founder_kinship`` and larger pedigrees run the loops.

The one genotype-sized step, ``simulate_genedrop``, works block by block of variants and gives
its results on the backend of ``call_genotype``: the diploid method by the kernel
``genedrop_diploid`` (:mod:`pipeline.kernels.pedigree`: sgkit's loop on the CPU, a CUDA C kernel
on the GPU that reproduces Numba's generator), over the samples' order computed once on the host;
Hamilton-Kerr's blocks cross to the host for sgkit's loop and back.

sgkit's errors are kept (a ``ValueError`` is an :class:`~pipeline.errors.InputError` here, which
is one too): those of the loops, raised when the results are computed, name the function.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Hashable, Literal

import numpy as np
import xarray as xr

from ... import kernels
from ...backend import backend_of, meta, to_backend, to_numpy, xp_of
from ...deferred import module as _deferred
from ...errors import InputError, MissingLibraryInputError, NotImplementedInputError, UnknownKeyInputError
from . import _pedigree_plain as plain
from ._dataset import merge as _merge, variable

da = _deferred("dask.array")  # imported when the first graph is built

EST_DIPLOID = "diploid"
EST_HAMILTON_KERR = "Hamilton-Kerr"
EST_EVEN = "even"
EST_VARIABLE = "variable"

COMMENTS = {  # sgkit's documentation of its variables, which it sets as their "comment"
    "parent": "Indices of parent samples with negative values indicating unknown parents.",
    "stat_pedigree_kinship": "Pairwise estimates of expected kinship among samples based on pedigree structure\n"
    "with self-kinship values on the diagonal.",
    "stat_pedigree_relationship": "Relationship matrix derived from pedigree structure.",
    "stat_pedigree_inbreeding": "Expected inbreeding coefficients of samples based on pedigree structure.",
    "stat_pedigree_inverse_kinship": "Inverse of a kinship matrix calculated from pedigree structure.",
    "stat_pedigree_inverse_relationship": "Inverse of a relationship matrix calculated from pedigree structure.",
    "stat_pedigree_contribution": "Expected proportional genomic contribution to and from each pair of samples\n"
    "based on pedigree structure. This is an asymmetric matrix in which the\n"
    "element [x, y] is the expected contribution of sample x to sample y.\n"
    "Diagonal values are always 1.",
    "call_genotype": "Call genotype. Encoded as allele values (0 for the reference, 1 for\n"
    "the first allele, 2 for the second allele), -1 to indicate a\n"
    "missing value, or -2 to indicate a non allele in mixed ploidy datasets.",
    "call_genotype_mask": "A flag for each call indicating which values are missing.",
    "call_genotype_fill": "A flag for each allele position within mixed ploidy call genotypes\n"
    "indicating fill (non-allele) values of lower ploidy calls.",
}


def _new(variables: dict[str, tuple]) -> xr.Dataset:
    return xr.Dataset({name: (dims, data, {"comment": COMMENTS[name]}) for name, (dims, data) in variables.items()})


def _method(method, allowed, op: str) -> None:
    if method not in allowed:
        raise InputError(f"{op}: unknown method {method!r} (expected one of {', '.join(map(repr, sorted(allowed)))})")


def _host(ds: xr.Dataset, name: str, op: str, kind: str, ndim: int) -> "da.Array":
    """``ds[name]`` checked (``ndim`` dimensions, values of ``kind``) as one host block."""
    x = variable(ds, name, kind=kind, op=op)
    if x.ndim != ndim:
        raise InputError(f"{op}: variable {name!r} has dimensions {tuple(map(str, x.dims))}, expected {ndim}")
    data = x.data if isinstance(x.data, da.Array) else da.from_array(x.data, chunks=-1, asarray=False)
    data = data.rechunk(-1)
    if xp_of(data._meta) is not np:  # the loops run on the host
        data = data.map_blocks(to_numpy, meta=meta("cpu", data.dtype, ndim))
    return data


def _with_parent(ds: xr.Dataset, parent: Hashable, op: str) -> tuple[xr.Dataset, "da.Array"]:
    """sgkit's ``define_variable_if_absent`` for ``parent`` (from ``parent_id``), and its data as
    one host block of int64."""
    if parent not in ds.variables:
        if parent != "parent":
            raise InputError(f"{op}: the dataset has no variable {parent!r} (only 'parent' is computed where missing)")
        ds = parent_indices(ds)
    data = _host(ds, parent, op, "i", 2).astype(np.int64)
    return ds, data.map_blocks(_parents_in_range, variable_name=parent, op=op, dtype=np.int64)


def _parents_in_range(parent: np.ndarray, *, variable_name, op: str) -> np.ndarray:
    """``parent`` (samples, parents), checked to index samples (negative: unknown): sgkit's loops
    would read beyond their arrays."""
    n = len(parent)
    if parent.size and parent.max() >= n:
        raise InputError(f"{op}: variable {variable_name!r} has a parent index {int(parent.max())}, beyond the {n} samples "
                         "(a parent is the index of a sample, or negative where unknown)")
    return parent


def _sizes_check(ds: xr.Dataset, method: str, op: str) -> None:
    if method == EST_DIPLOID:
        if ds.sizes.get("ploidy", 2) != 2:
            raise InputError(f"{op}: the 'diploid' method needs a diploid dataset, not ploidy {ds.sizes['ploidy']}")


def _hamilton_kerr(ds: xr.Dataset, tau: Hashable, lambda_: Hashable, n: tuple[int, int], op: str):
    """The Hamilton-Kerr parameters, checked against ``parent``'s shape ``n``."""
    # one type for tau (sgkit's), so that each loop is compiled once
    t = _host(ds, tau, op, "iu", 2).astype(np.uint64)
    lam = _host(ds, lambda_, op, "f", 2).astype(np.float64)
    for name, x in ((tau, t), (lambda_, lam)):
        if x.shape != n:
            raise InputError(f"{op}: variable {name!r} has shape {x.shape}, expected the shape of 'parent', {n}")
    return t, lam


# --- the samples' order and depths: plain Python, and the same source compiled for the loops ------
#
# sgkit's topological_argsort, _ancestor_depth and _descendent_depth, each as a walk over flat
# sequences that plain Python runs over lists (the GPU's genedrop and pedigree_sel need no Numba)
# and that _kernels() compiles for its loops, over arrays: one source for both.


def _ancestor_walk(depth, parent, n_parents: int, order) -> None:
    """sgkit's ``_ancestor_depth`` on ``depth`` (``initial - 1``), in place."""
    for idx in range(len(order) - 1, -1, -1):
        i = order[idx]
        depth_i = depth[i]
        if depth_i >= 0:
            for j in range(n_parents):
                p = parent[i * n_parents + j]
                if p >= 0:
                    depth_p = depth[p]
                    if depth_p < 0:
                        depth[p] = depth_i + 1
                    else:
                        depth[p] = min(depth_p, depth_i + 1)


def _descendant_walk(depth, parent, n_parents: int, order) -> None:
    """sgkit's ``_descendent_depth`` on ``depth`` (``initial - 1``), in place."""
    for idx in range(len(order)):
        i = order[idx]
        depth_i = depth[i]
        for j in range(n_parents):
            p = parent[i * n_parents + j]
            if p >= 0:
                depth_p = depth[p]
                if depth_p >= 0:
                    if depth_i < 0 or depth_i > depth_p:
                        depth_i = depth_p + 1
                        depth[i] = depth_i


# Above this many samples the order and depths come from the Numba loops instead. Measured on
# random pedigrees of two parents a sample: in plain Python over lists, the order took 0.005 s at
# 10,000 samples, 0.064 s at 100,000, 0.26 s at 300,000 and 1.17 s at 1,000,000 (over NumPy's
# scalars, 0.14 s at 100,000), both depths 0.04 s at 100,000, 0.18 s at 300,000 and 0.78 s at
# 1,000,000; a process importing Numba and loading the loops from its disk cache took 0.34-0.38 s
# to give the order (0.03 s of it the sort at 1,000,000) and a few ms more for the depths; with
# the cache cold, 1.0 s and 0.5 s more. So plain Python up to about 250,000 samples.
PLAIN_SAMPLES = 250_000

# Up to this many samples the diploid kinship, inbreeding, inverse kinship and the "even"
# contributions are NumPy's (:mod:`._pedigree_plain`, sgkit's values bit for bit), beyond it sgkit's
# loops. The NumPy functions hold dense (n, n) matrices, 800 MB at 10,000 samples, inbreeding too
# (sgkit's loop keeps only the pairs it needs). Measured warm on 2 cores, on the random pedigrees of
# benchmarks/genomics_sgkit.py (stored sorted / out of order), NumPy against the loops: at 3,000
# samples kinship 0.015 / 0.047 s against 0.042 / 0.059 s, inbreeding 0.028 s against 0.007 s, the
# inverse 0.006 s against 0.032 s, the contributions to / from 0.048 / 0.032 s against 0.044 /
# 0.086 s; at 10,000 kinship 0.16 / 0.52 s against 0.55 / 0.75 s, inbreeding 0.30 s against
# 0.04 s, the inverse 0.05 s against 0.34 s, the contributions 0.54 / 0.45 s against 0.53 / 1.04 s
# (on a chain 10,000 generations deep, inbreeding 0.39 s against 7.0 s); at 20,000 inbreeding 2.6 s
# against 0.1 s. Numba's import and the loops loaded from its disk cache take about 0.35 s; on a
# machine's first run, Numba's import 0.6 s and compiling 1.7 s (kinship), 7.5 s (inbreeding),
# 1.1 s (inverse), 0.15 s (each contribution). So NumPy up to 10,000 samples.
PLAIN_MATRIX_SAMPLES = 10_000


def topological_argsort(parent) -> np.ndarray:
    """sgkit's ``topological_argsort``: the samples of ``parent`` (samples, parents) ordered with
    every parent before its children, uint64; ``ValueError`` where the pedigree has a loop."""
    parent = np.asarray(parent)
    if len(parent) > PLAIN_SAMPLES:
        return _kernels()["topological_argsort"](np.ascontiguousarray(parent, dtype=np.int64))
    return plain.topological_argsort(parent).astype(np.uint64)


def _depth(walk: str, initial, parent, order) -> np.ndarray:
    parent = np.asarray(parent)
    if len(parent) > PLAIN_SAMPLES:
        name = "_ancestor_depth" if walk == "ancestors" else "_descendent_depth"
        return _kernels()[name](np.asarray(initial), np.ascontiguousarray(parent, dtype=np.int64), np.asarray(order))
    depth = (np.asarray(initial, dtype=np.int64) - 1).tolist()
    fn = _ancestor_walk if walk == "ancestors" else _descendant_walk
    fn(depth, parent.ravel().tolist(), parent.shape[1], np.asarray(order, dtype=np.int64).tolist())
    return np.array(depth, dtype=np.int64)


@functools.cache
def _kernels() -> dict:
    """sgkit's Numba loops for pedigrees, compiled on first call (and cached on disk)."""
    from ...kernels.launch import cpu_jit as jit

    order_walk = jit(plain.topological_order)

    @jit
    def topological_argsort(parent):
        n_samples, n_parents = parent.shape
        order = np.empty(n_samples, dtype=np.int64)
        order_walk(parent.ravel(), n_parents, np.zeros(n_samples, dtype=np.int64), order)
        return order[::-1].astype(np.uint64)

    @jit
    def _is_pedigree_sorted(parent):
        n_samples, n_parents = parent.shape
        for i in range(n_samples):
            for j in range(n_parents):
                p = parent[i, j]
                if p >= i:
                    return False
        return True

    @jit
    def _raise_on_half_founder(parent, tau=None):
        for i in range(len(parent)):
            p = parent[i, 0]
            q = parent[i, 1]
            if tau is None:
                tau_p = 1
                tau_q = 1
            else:
                tau_p = tau[i, 0]
                tau_q = tau[i, 1]
            if (p < 0 and q >= 0) and tau_p > 0:
                raise ValueError('Pedigree contains half-founders')
            elif (q < 0 and p >= 0) and tau_q > 0:
                raise ValueError('Pedigree contains half-founders')

    @jit
    def _insert_diploid_self_kinship(kinship, parent, i):
        p = parent[i, 0]
        q = parent[i, 1]
        if p < 0 or q < 0:
            kinship[i, i] = 0.5
        else:
            kinship[i, i] = (1 + kinship[p, q]) / 2

    @jit
    def _insert_diploid_pair_kinship(kinship, parent, i, j):
        p = parent[i, 0]
        q = parent[i, 1]
        kinship_pj = kinship[p, j] if p >= 0 else 0
        kinship_qj = kinship[q, j] if q >= 0 else 0
        kinship_ij = (kinship_pj + kinship_qj) / 2
        kinship[i, j] = kinship_ij
        kinship[j, i] = kinship_ij

    @jit
    def _kinship_diploid(parent, out, allow_half_founders=False):
        if parent.shape[1] != 2:
            raise ValueError('The parents dimension must be length 2')
        if not allow_half_founders:
            _raise_on_half_founder(parent)
        ordered = _is_pedigree_sorted(parent)
        n = len(parent)
        if ordered:
            for i in range(n):
                _insert_diploid_self_kinship(out, parent, i)
                for j in range(i):
                    _insert_diploid_pair_kinship(out, parent, i, j)
        else:
            order = topological_argsort(parent)
            for idx in range(n):
                i = order[idx]
                _insert_diploid_self_kinship(out, parent, i)
                for jdx in range(idx):
                    j = order[jdx]
                    _insert_diploid_pair_kinship(out, parent, i, j)

    @jit
    def kinship_diploid(parent, allow_half_founders=False, dtype=np.float64):
        n = len(parent)
        out = np.zeros((n, n), dtype=dtype)
        _kinship_diploid(parent, out, allow_half_founders)
        return out

    @jit
    def _identify_founders_diploid(parent):
        n = len(parent)
        out = np.zeros(n, dtype=np.bool_)
        for i in range(n):
            if parent[i, 0] < 0 or parent[i, 1] < 0:
                out[i] = True
        return out

    @jit
    def project_kinship_diploid(initial, parent, allow_half_founders=False):
        kinship = initial.copy()
        n_sample = len(parent)
        assert kinship.shape == (n_sample, n_sample)
        if parent.shape[1] != 2:
            raise ValueError('The parents dimension must be length 2')
        if not allow_half_founders:
            _raise_on_half_founder(parent)
        is_founder = _identify_founders_diploid(parent)
        n_founder = is_founder.sum()
        order = topological_argsort(parent)
        order = np.concatenate((order[is_founder[order]], order[~is_founder[order]]))
        for idx in range(n_founder, n_sample):
            i = order[idx]
            _insert_diploid_self_kinship(kinship, parent, i)
            for jdx in range(idx):
                j = order[jdx]
                _insert_diploid_pair_kinship(kinship, parent, i, j)
        return kinship

    @jit
    def _inbreeding_as_self_kinship(inbreeding, ploidy):
        return (1 + (ploidy - 1) * inbreeding) / ploidy

    @jit
    def _hamilton_kerr_inbreeding_founder(lambda_p, lambda_q, ploidy_i):
        num = (lambda_p + lambda_q) * (ploidy_i / 2 - 1)
        denom = ploidy_i + (lambda_p + lambda_q) * (ploidy_i / 2 - 1)
        return num / denom

    @jit
    def _hamilton_kerr_inbreeding_non_founder(tau_p, lambda_p, ploidy_p, kinship_pp, tau_q, lambda_q, ploidy_q,
                                              kinship_qq, kinship_pq):
        pat = tau_p * (tau_p - 1.0) * (lambda_p + (1.0 - lambda_p) * ((ploidy_p * kinship_pp - 1.0) / (ploidy_p - 1.0)))
        mat = tau_q * (tau_q - 1.0) * (lambda_q + (1.0 - lambda_q) * ((ploidy_q * kinship_qq - 1.0) / (ploidy_q - 1.0)))
        num = pat + mat + 2.0 * tau_p * tau_q * kinship_pq
        denom = tau_p * (tau_p - 1.0) + tau_q * (tau_q - 1.0) + 2.0 * tau_p * tau_q
        return num / denom

    @jit
    def _hamilton_kerr_inbreeding_half_founder(tau_p, lambda_p, ploidy_p, kinship_pp, tau_q, lambda_q):
        ploidy_q = tau_q * 2
        inbreeding_q = _hamilton_kerr_inbreeding_founder(lambda_q, lambda_q, ploidy_q)
        kinship_qq = _inbreeding_as_self_kinship(inbreeding_q, ploidy_q)
        kinship_pq = 0.0
        return _hamilton_kerr_inbreeding_non_founder(tau_p=tau_p, lambda_p=lambda_p, ploidy_p=ploidy_p,
                                                     kinship_pp=kinship_pp, tau_q=tau_q, lambda_q=lambda_q,
                                                     ploidy_q=ploidy_q, kinship_qq=kinship_qq, kinship_pq=kinship_pq)

    @jit
    def _insert_hamilton_kerr_self_kinship(kinship, parent, tau, lambda_, i):
        p = parent[i, 0]
        q = parent[i, 1]
        tau_p = tau[i, 0]
        tau_q = tau[i, 1]
        lambda_p = lambda_[i, 0]
        lambda_q = lambda_[i, 1]
        ploidy_i = tau_p + tau_q
        ploidy_p = tau[p, 0] + tau[p, 1]
        ploidy_q = tau[q, 0] + tau[q, 1]
        if p < 0 and q < 0:
            inbreeding_i = _hamilton_kerr_inbreeding_founder(lambda_p=lambda_p, lambda_q=lambda_q, ploidy_i=ploidy_i)
        elif p < 0 and tau_p > 0:
            inbreeding_i = _hamilton_kerr_inbreeding_half_founder(tau_p=tau_q, lambda_p=lambda_q, ploidy_p=ploidy_q,
                                                                  kinship_pp=kinship[q, q], tau_q=tau_p,
                                                                  lambda_q=lambda_p)
        elif q < 0 and tau_q > 0:
            inbreeding_i = _hamilton_kerr_inbreeding_half_founder(tau_p=tau_p, lambda_p=lambda_p, ploidy_p=ploidy_p,
                                                                  kinship_pp=kinship[p, p], tau_q=tau_q,
                                                                  lambda_q=lambda_q)
        else:
            inbreeding_i = _hamilton_kerr_inbreeding_non_founder(tau_p=tau_p, lambda_p=lambda_p, ploidy_p=ploidy_p,
                                                                 kinship_pp=kinship[p, p] if p >= 0 else 0, tau_q=tau_q,
                                                                 lambda_q=lambda_q, ploidy_q=ploidy_q,
                                                                 kinship_qq=kinship[q, q] if q >= 0 else 0,
                                                                 kinship_pq=kinship[p, q] if p >= 0 and q >= 0 else 0)
        kinship[i, i] = _inbreeding_as_self_kinship(inbreeding_i, ploidy_i)

    @jit
    def _hamilton_kerr_pair_kinship(tau_p, tau_q, kinship_pj, kinship_qj):
        ploidy_i = tau_p + tau_q
        return tau_p / ploidy_i * kinship_pj + tau_q / ploidy_i * kinship_qj

    @jit
    def _insert_hamilton_kerr_pair_kinship(kinship, parent, tau, i, j):
        p = parent[i, 0]
        q = parent[i, 1]
        tau_p = tau[i, 0]
        tau_q = tau[i, 1]
        kinship_pj = kinship[p, j] if p >= 0 else 0
        kinship_qj = kinship[q, j] if q >= 0 else 0
        kinship_ij = _hamilton_kerr_pair_kinship(tau_p, tau_q, kinship_pj, kinship_qj)
        kinship[i, j] = kinship_ij
        kinship[j, i] = kinship_ij

    @jit
    def _compress_hamilton_kerr_parameters(parent, tau, lambda_):
        n_sample, n_parent = parent.shape
        new_parent = parent[:, 0:2].copy()
        new_tau = tau[:, 0:2].copy()
        new_lambda = lambda_[:, 0:2].copy()
        p_empty = False
        q_empty = False
        for i in range(n_sample):
            for j in range(n_parent):
                if tau[i, j] == 0:
                    if j == 0:
                        p_empty = True
                    elif j == 1:
                        q_empty = True
                    else:
                        pass
                elif j == 0:
                    p_empty = False
                elif j == 1:
                    q_empty = False
                elif p_empty:
                    new_parent[i, 0] = parent[i, j]
                    new_tau[i, 0] = tau[i, j]
                    new_lambda[i, 0] = lambda_[i, j]
                    p_empty = False
                elif q_empty:
                    new_parent[i, 1] = parent[i, j]
                    new_tau[i, 1] = tau[i, j]
                    new_lambda[i, 1] = lambda_[i, j]
                    q_empty = False
                else:
                    raise ValueError('Sample with more than two parents.')
        return (new_parent, new_tau, new_lambda)

    @jit
    def _kinship_hamilton_kerr(parent, tau, lambda_, out, allow_half_founders=False):
        if parent.shape[1] != 2:
            parent, tau, lambda_ = _compress_hamilton_kerr_parameters(parent, tau, lambda_)
        if not allow_half_founders:
            _raise_on_half_founder(parent, tau)
        ordered = _is_pedigree_sorted(parent)
        n = len(parent)
        if ordered:
            for i in range(n):
                _insert_hamilton_kerr_self_kinship(out, parent, tau, lambda_, i)
                for j in range(i):
                    _insert_hamilton_kerr_pair_kinship(out, parent, tau, i, j)
        else:
            order = topological_argsort(parent)
            for idx in range(n):
                i = order[idx]
                _insert_hamilton_kerr_self_kinship(out, parent, tau, lambda_, i)
                for jdx in range(idx):
                    j = order[jdx]
                    _insert_hamilton_kerr_pair_kinship(out, parent, tau, i, j)

    @jit
    def kinship_Hamilton_Kerr(parent, tau, lambda_, allow_half_founders=False, dtype=np.float64):
        n = len(parent)
        out = np.zeros((n, n), dtype=dtype)
        _kinship_hamilton_kerr(parent=parent, tau=tau, lambda_=lambda_, out=out,
                               allow_half_founders=allow_half_founders)
        return out

    @jit
    def _identify_founders_Hamilton_Kerr(parent, tau):
        n, p = parent.shape
        out = np.zeros(n, dtype=np.bool_)
        for i in range(n):
            for j in range(p):
                if parent[i, j] < 0 and tau[i, j] > 0:
                    out[i] = True
        return out

    @jit
    def project_kinship_Hamilton_Kerr(initial, parent, tau, lambda_, allow_half_founders=False):
        kinship = initial.copy()
        n_sample = len(parent)
        assert kinship.shape == (n_sample, n_sample)
        if parent.shape[1] != 2:
            parent, tau, lambda_ = _compress_hamilton_kerr_parameters(parent, tau, lambda_)
        if not allow_half_founders:
            _raise_on_half_founder(parent, tau)
        is_founder = _identify_founders_Hamilton_Kerr(parent, tau)
        n_founder = is_founder.sum()
        order = topological_argsort(parent)
        order = np.concatenate((order[is_founder[order]], order[~is_founder[order]]))
        for idx in range(n_founder, n_sample):
            i = order[idx]
            _insert_hamilton_kerr_self_kinship(kinship, parent, tau, lambda_, i)
            for jdx in range(idx):
                j = order[jdx]
                _insert_hamilton_kerr_pair_kinship(kinship, parent, tau, i, j)
        return kinship

    @jit
    def _position_sort_pair(x, y, position):
        if x < 0:
            return (x, y)
        elif y < 0:
            return (y, x)
        elif position[x] < position[y]:
            return (x, y)
        else:
            return (y, x)

    @jit
    def inbreeding_Hamilton_Kerr(parent, tau, lambda_, allow_half_founders=False):
        if parent.shape[1] != 2:
            parent, tau, lambda_ = _compress_hamilton_kerr_parameters(parent, tau, lambda_)
        if not allow_half_founders:
            _raise_on_half_founder(parent, tau)
        n_samples = len(parent)
        ploidy = tau.sum(axis=-1)
        order = topological_argsort(parent)
        parental_self = np.unique(parent)
        parental_self = np.broadcast_to(parental_self, (2, len(parental_self))).T
        n_stack = n_samples + len(parental_self)
        stack = np.empty((n_stack, 2), parent.dtype)
        stack[0:n_samples] = parent[order]
        stack[n_samples:] = parental_self
        position = np.empty(n_samples, dtype=np.int64)
        for i in range(n_samples):
            position[order[i]] = i
        kinship = dict()
        idx = 0
        while idx < n_stack:
            assert idx >= 0
            ij_key = _position_sort_pair(stack[idx, 0], stack[idx, 1], position)
            i = ij_key[0]
            j = ij_key[1]
            if i < 0 or j < 0:
                kinship[i, j] = 0.0
                idx += 1
            elif i != j:
                p = parent[j, 0]
                q = parent[j, 1]
                if p < 0:
                    kinship_ip = 0.0
                else:
                    ip_key = _position_sort_pair(i, p, position)
                    kinship_ip = kinship.get(ip_key, np.nan)
                if q < 0:
                    kinship_iq = 0.0
                else:
                    iq_key = _position_sort_pair(i, q, position)
                    kinship_iq = kinship.get(iq_key, np.nan)
                dependencies = True
                if np.isnan(kinship_ip):
                    dependencies = False
                    idx -= 1
                    stack[idx, 0] = i
                    stack[idx, 1] = p
                if np.isnan(kinship_iq):
                    dependencies = False
                    idx -= 1
                    stack[idx, 0] = i
                    stack[idx, 1] = q
                if dependencies:
                    kinship[i, j] = _hamilton_kerr_pair_kinship(tau_p=tau[j, 0], tau_q=tau[j, 1], kinship_pj=kinship_ip,
                                                                kinship_qj=kinship_iq)
                    idx += 1
                else:
                    pass
            else:
                p = parent[i, 0]
                q = parent[i, 1]
                if p < 0 and q < 0:
                    inbreeding_i = _hamilton_kerr_inbreeding_founder(lambda_p=lambda_[i, 0], lambda_q=lambda_[i, 1],
                                                                     ploidy_i=ploidy[i])
                    kinship[i, i] = _inbreeding_as_self_kinship(inbreeding_i, ploidy[i])
                    idx += 1
                else:
                    pq_key = _position_sort_pair(parent[i, 0], parent[i, 1], position)
                    kinship_pq = 0.0 if p < 0 and q < 0 else kinship[pq_key]
                    kinship_pp = 0.0 if p < 0 else kinship.get((p, p), np.nan)
                    kinship_qq = 0.0 if q < 0 else kinship.get((q, q), np.nan)
                    dependencies = True
                    if np.isnan(kinship_pp):
                        dependencies = False
                        idx -= 1
                        stack[idx, 0] = p
                        stack[idx, 1] = p
                    if np.isnan(kinship_qq):
                        dependencies = False
                        idx -= 1
                        stack[idx, 0] = q
                        stack[idx, 1] = q
                    if dependencies:
                        if q < 0 and tau[i, 1] > 0:
                            inbreeding_i = _hamilton_kerr_inbreeding_half_founder(
                                tau_p=tau[i, 0], lambda_p=lambda_[i, 0], ploidy_p=ploidy[p], kinship_pp=kinship_pp,
                                tau_q=tau[i, 1], lambda_q=lambda_[i, 1])
                        elif p < 0 and tau[i, 0] > 0:
                            inbreeding_i = _hamilton_kerr_inbreeding_half_founder(
                                tau_p=tau[i, 1], lambda_p=lambda_[i, 1], ploidy_p=ploidy[q], kinship_pp=kinship_qq,
                                tau_q=tau[i, 0], lambda_q=lambda_[i, 0])
                        else:
                            inbreeding_i = _hamilton_kerr_inbreeding_non_founder(
                                tau_p=tau[i, 0], lambda_p=lambda_[i, 0], ploidy_p=ploidy[p], kinship_pp=kinship_pp,
                                tau_q=tau[i, 1], lambda_q=lambda_[i, 1], ploidy_q=ploidy[q], kinship_qq=kinship_qq,
                                kinship_pq=kinship[pq_key])
                        kinship[i, i] = _inbreeding_as_self_kinship(inbreeding_i, ploidy[i])
                        idx += 1
                    else:
                        pass
        inbreeding = np.empty(n_samples)
        parent_kinship = np.zeros(n_samples)
        for i in range(n_samples):
            p = parent[i, 0]
            q = parent[i, 1]
            if p < 0 and q < 0:
                inbreeding[i] = _hamilton_kerr_inbreeding_founder(lambda_p=lambda_[i, 0], lambda_q=lambda_[i, 1],
                                                                  ploidy_i=ploidy[i])
            elif q < 0 and tau[i, 1] > 0:
                inbreeding[i] = _hamilton_kerr_inbreeding_half_founder(
                    tau_p=tau[i, 0], lambda_p=lambda_[i, 0], ploidy_p=ploidy[p], kinship_pp=kinship[p, p],
                    tau_q=tau[i, 1], lambda_q=lambda_[i, 1])
            elif p < 0 and tau[i, 0] > 0:
                inbreeding[i] = _hamilton_kerr_inbreeding_half_founder(
                    tau_p=tau[i, 1], lambda_p=lambda_[i, 1], ploidy_p=ploidy[q], kinship_pp=kinship[q, q],
                    tau_q=tau[i, 0], lambda_q=lambda_[i, 0])
            else:
                pq_key = _position_sort_pair(parent[i, 0], parent[i, 1], position)
                kinship_pq = kinship[pq_key]
                parent_kinship[i] = kinship_pq
                inbreeding[i] = _hamilton_kerr_inbreeding_non_founder(tau_p=tau[i, 0], lambda_p=lambda_[i, 0],
                                                                      ploidy_p=ploidy[p], kinship_pp=kinship[p, p],
                                                                      tau_q=tau[i, 1], lambda_q=lambda_[i, 1],
                                                                      ploidy_q=ploidy[q], kinship_qq=kinship[q, q],
                                                                      kinship_pq=kinship_pq)
        return (inbreeding, parent_kinship)

    @jit
    def _update_inverse_kinship(mtx, parent, self_kinship, parent_kinship, i, tau, return_relationship=False):
        p, q = parent[i]
        tau_p, tau_q = (tau[i, 0], tau[i, 1])
        ploidy_i = tau_p + tau_q
        weight_p, weight_q = (tau_p / ploidy_i, tau_q / ploidy_i)
        prod = 0.0
        if p >= 0:
            prod += self_kinship[p] * weight_p ** 2
        if q >= 0:
            prod += self_kinship[q] * weight_q ** 2
        if p >= 0 and q >= 0:
            prod += parent_kinship[i] * weight_p * weight_q * 2
        try:
            scalar = 1 / (self_kinship[i] - prod)
        except:
            raise ValueError('Singular kinship matrix')
        if p >= 0:
            val_pp = weight_p ** 2 * scalar
            val_pi = weight_p * scalar
            if return_relationship:
                ploidy_p = tau[p, 0] + tau[p, 1]
                val_pp /= ploidy_p
                val_pi /= 2 * np.sqrt(ploidy_p / 2 * ploidy_i / 2)
            mtx[p, p] += val_pp
            mtx[p, i] -= val_pi
            mtx[i, p] -= val_pi
        if q >= 0:
            val_qq = weight_q ** 2 * scalar
            val_qi = weight_q * scalar
            if return_relationship:
                ploidy_q = tau[q, 0] + tau[q, 1]
                val_qq /= ploidy_q
                val_qi /= 2 * np.sqrt(ploidy_q / 2 * ploidy_i / 2)
            mtx[q, q] += val_qq
            mtx[q, i] -= val_qi
            mtx[i, q] -= val_qi
        if p >= 0 and q >= 0:
            val_pq = weight_p * weight_q * scalar
            if return_relationship:
                val_pq /= 2 * np.sqrt(ploidy_p / 2 * ploidy_q / 2)
            mtx[p, q] += val_pq
            mtx[q, p] += val_pq
        val_ii = scalar
        if return_relationship:
            val_ii /= ploidy_i
        mtx[i, i] += val_ii

    @jit
    def inverse_kinship_Hamilton_Kerr(parent, tau, self_kinship, parent_kinship, return_relationship=False):
        parent, tau, _ = _compress_hamilton_kerr_parameters(parent, tau, tau)
        order = topological_argsort(parent)
        n = len(parent)
        mtx = np.zeros((n, n))
        for i in order:
            _update_inverse_kinship(mtx, parent, self_kinship, parent_kinship, i, tau=tau,
                                    return_relationship=return_relationship)
        return mtx

    ancestor_walk = jit(_ancestor_walk)
    descendant_walk = jit(_descendant_walk)

    @jit
    def _ancestor_depth(initial, parent, order):
        depth = initial - 1
        ancestor_walk(depth, parent.ravel(), parent.shape[1], order.astype(np.int64))
        return depth

    @jit
    def _descendent_depth(initial, parent, order):
        depth = initial - 1
        descendant_walk(depth, parent.ravel(), parent.shape[1], order.astype(np.int64))
        return depth

    @jit
    def _chunk_sub_pedigree(parent, rows, cols):
        initial = np.zeros(len(parent), np.bool_)
        initial[rows] = True
        initial[cols] = True
        order = topological_argsort(parent)
        include = _ancestor_depth(initial, parent=parent, order=order) >= 0
        n_sample, n_parent = parent.shape
        assert len(include) == n_sample
        n_new = include.sum()
        old_to_new = np.full(n_sample + 1, -1, np.int64)
        new_to_old = np.full(n_new, -1, np.int64)
        new = 0
        for old in range(n_sample):
            if include[old]:
                old_to_new[old] = new
                new_to_old[new] = old
                new += 1
        assert new == n_new
        sub_ped = np.full((n_new, n_parent), -1, np.int64)
        for old in range(n_sample):
            if include[old]:
                new = old_to_new[old]
                for j in range(n_parent):
                    p_old = parent[old, j]
                    if include[p_old]:
                        p_new = old_to_new[p_old]
                        sub_ped[new, j] = p_new
        return (sub_ped, old_to_new[rows], old_to_new[cols], new_to_old)

    @jit
    def _random_inheritance_Hamilton_Kerr(genotypes, parent, tau, lambda_, marked, i):
        _, n_parent = parent.shape
        _, max_ploidy = genotypes.shape
        next_allele = 0
        ploidy_i = 0
        for j in range(n_parent):
            p = parent[i, j]
            tau_p = tau[i, j]
            ploidy_i += tau_p
            if p < 0:
                continue
            lambda_p = lambda_[i, j]
            ploidy_p = tau[p, 0] + tau[p, 1]
            if tau_p > ploidy_p:
                raise NotImplementedError('Gamete tau cannot exceed parental ploidy.')
            if lambda_p > 0.0:
                if tau_p != 2:
                    raise NotImplementedError('Non-zero lambda is only implemented for tau = 2.')
                homozygous_gamete = np.random.rand() < lambda_p
            else:
                homozygous_gamete = False
            if homozygous_gamete:
                uniform = np.random.rand()
                choice = int(uniform * ploidy_p)
                for k in range(max_ploidy):
                    parent_allele = genotypes[p, k]
                    if parent_allele < -1:
                        pass
                    elif choice > 0:
                        choice -= 1
                    else:
                        genotypes[i, next_allele] = parent_allele
                        genotypes[i, next_allele + 1] = parent_allele
                        next_allele += 2
                        break
            else:
                marked[:] = False
                for h in range(tau_p):
                    uniform = np.random.rand()
                    scale = ploidy_p - h
                    choice = int(uniform * scale)
                    k = 0
                    while choice >= 0:
                        parent_allele = genotypes[p, k]
                        if marked[k] > 0:
                            pass
                        elif parent_allele < -1:
                            pass
                        elif choice > 0:
                            choice -= 1
                        else:
                            genotypes[i, next_allele] = parent_allele
                            marked[k] = True
                            next_allele += 1
                            choice -= 1
                        k += 1
        if next_allele == 0:
            alleles_i = 0
            for k in range(max_ploidy):
                if genotypes[i, k] >= -1:
                    alleles_i += 1
            if alleles_i != ploidy_i:
                raise ValueError('Genotype ploidy does not match number of alleles.')
        elif next_allele != ploidy_i:
            raise ValueError('Pedigree contains half-founders.')
        elif next_allele < max_ploidy:
            genotypes[i, next_allele:] = -2
    # sgkit's gufuncs over a vector of targets (one call per target), as loops over the targets

    @jit
    def contribution_to(parent, parent_contribution, order, targets):
        n_samples, n_parents = parent.shape
        out = np.zeros((len(targets), n_samples))
        reverse_order = order[::-1]
        for t in range(len(targets)):
            i = targets[t]
            for jdx in range(n_samples):
                j = reverse_order[jdx]
                if i == j:
                    out[t, j] = 1.0
                con = out[t, j]
                if con > 0.0:
                    for pdx in range(n_parents):
                        p = parent[j, pdx]
                        if p >= 0:
                            out[t, p] += con * parent_contribution[j, pdx]
        return out

    @jit
    def contribution_from(parent, parent_contribution, order, targets):
        n_samples, n_parents = parent.shape
        out = np.zeros((len(targets), n_samples))
        for t in range(len(targets)):
            i = targets[t]
            for jdx in range(n_samples):
                j = order[jdx]
                if i == j:
                    out[t, j] = 1.0
                else:
                    for pdx in range(n_parents):
                        p = parent[j, pdx]
                        if p >= 0:
                            p_con = out[t, p]
                            if p_con >= 0.0:
                                out[t, j] += p_con * parent_contribution[j, pdx]
        return out

    @jit
    def _tile(kinship, rows, cols):
        out = np.empty((len(rows), len(cols)))
        for i in range(len(rows)):
            for j in range(len(cols)):
                out[i, j] = kinship[rows[i], cols[j]]
        return out

    @jit
    def kinship_diploid_chunk(parent, rows, cols, allow_half_founders):
        parent, rows, cols, _ = _chunk_sub_pedigree(parent, rows, cols)
        kinship = np.zeros((len(parent), len(parent)))
        _kinship_diploid(parent, kinship, allow_half_founders)
        return _tile(kinship, rows, cols)

    @jit
    def kinship_Hamilton_Kerr_chunk(parent, tau, lambda_, rows, cols, allow_half_founders):
        parent, rows, cols, kept = _chunk_sub_pedigree(parent, rows, cols)
        kinship = np.zeros((len(parent), len(parent)))
        _kinship_hamilton_kerr(parent, tau[kept], lambda_[kept], kinship, allow_half_founders)
        return _tile(kinship, rows, cols)

    @jit
    def genedrop_Hamilton_Kerr(genotypes, parent, tau, lambda_, seeds):
        if parent.shape[1] != 2:
            parent, tau, lambda_ = _compress_hamilton_kerr_parameters(parent, tau, lambda_)
        out = genotypes.copy()
        n_sample = len(parent)
        max_ploidy = genotypes.shape[2]
        order = topological_argsort(parent)
        marked = np.zeros(max_ploidy, dtype=np.bool_)
        for v in range(len(genotypes)):
            np.random.seed(seeds[v])
            for idx in range(n_sample):
                _random_inheritance_Hamilton_Kerr(out[v], parent, tau, lambda_, marked, order[idx])
        return out

    return {name: fn for name, fn in locals().items() if callable(fn)}


def _call(op: str, name: str):
    """Kernel ``name`` of :func:`_kernels`, its ``ValueError`` (a pedigree sgkit rejects) and
    ``NotImplementedError`` raised as pipeline's errors naming ``op``."""
    return _guarded(op, name)


def _guarded(op: str, kernel):
    """``kernel`` (a function, or the name of one of :func:`_kernels`, compiled when called) with
    its errors raised as :func:`_call` raises them."""
    def call(*args, **kwargs):
        fn = _kernels()[kernel] if isinstance(kernel, str) else kernel
        args = [np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a for a in args]
        try:
            return fn(*args, **kwargs)
        except InputError:
            raise
        except NotImplementedError as e:
            raise NotImplementedInputError(f"{op}: {e}") from None
        except (ValueError, ZeroDivisionError, AssertionError) as e:
            raise InputError(f"{op}: {e}") from None
    return call


def _square(kernel, n: int, chunks, small: list, **kwargs) -> "da.Array":
    """An (n, n) matrix of tiles ``chunks``: tile (rows, cols) is ``kernel(*small, rows, cols,
    **kwargs)``, ``small`` whole in every task."""
    grid = da.empty((n, n), chunks=chunks).chunks
    rows, cols = da.arange(n, chunks=(grid[0],)), da.arange(n, chunks=(grid[1],))
    args = [a for x in small for a in (x, "pq")]
    return da.blockwise(kernel, "ij", *args, rows, "i", cols, "j", concatenate=True, dtype=np.float64,
                        meta=np.empty((0, 0)), **kwargs)


def _one_block(kernel, shape: tuple, *arrays, dtype=np.float64, **kwargs) -> "da.Array":
    """``kernel(*arrays, **kwargs)`` of ``shape``: one task over the whole of each array."""
    args = []
    for k, a in enumerate(arrays):
        args += [a.rechunk(-1), tuple(f"in{k}.{d}" for d in range(a.ndim))]
    out = tuple(f"out.{d}" for d in range(len(shape)))
    return da.blockwise(kernel, out, *args, new_axes=dict(zip(out, shape)), concatenate=True, dtype=dtype,
                        meta=np.empty((0,) * len(shape), dtype=dtype), **kwargs)


def parent_indices(ds: xr.Dataset, *, sample_id: Hashable = "sample_id", parent_id: Hashable = "parent_id",
                   missing: Hashable = ".", merge: bool = True) -> xr.Dataset:
    """sgkit's ``parent_indices``: ``parent`` (samples, parents), the index of each parent
    identifier of ``parent_id`` among ``sample_id``, -1 where it is ``missing``."""
    op = "parent_indices"
    ids = to_numpy(variable(ds, sample_id, op=op).data)
    parents = variable(ds, parent_id, op=op)
    if parents.ndim != 2:
        raise InputError(f"{op}: variable {parent_id!r} has dimensions {tuple(map(str, parents.dims))}, "
                         "expected (samples, parents)")
    parents = to_numpy(parents.data)
    indices = {s: i for i, s in enumerate(ids)}
    if missing in indices:
        raise InputError(f"{op}: Missing value '{missing}' is a known sample identifier (in {sample_id!r})")
    indices[missing] = -1
    out = np.empty(parents.shape, np.int64)
    for (i, j), p in np.ndenumerate(parents):
        try:
            out[i, j] = indices[p]
        except KeyError:
            raise UnknownKeyInputError(
                f"{op}: Parent identifier '{p}' (of {parent_id!r}) is not a known sample identifier") from None
    return _merge(ds, _new({"parent": (("samples", "parents"), out)}), merge)


def pedigree_kinship(ds: xr.Dataset, *, method: Literal["diploid", "Hamilton-Kerr"] = EST_DIPLOID,
                     parent: Hashable = "parent", stat_Hamilton_Kerr_tau: Hashable = "stat_Hamilton_Kerr_tau",
                     stat_Hamilton_Kerr_lambda: Hashable = "stat_Hamilton_Kerr_lambda", chunks: Hashable | None = None,
                     return_relationship: bool = False, allow_half_founders: bool = False,
                     founder_kinship: Hashable | None = None, founder_indices: Hashable | None = None,
                     merge: bool = True) -> xr.Dataset:
    """sgkit's ``pedigree_kinship``: ``stat_pedigree_kinship`` (samples_0, samples_1), and with
    ``return_relationship`` ``stat_pedigree_relationship``. ``chunks`` tiles the matrix: each tile
    is computed from the part of the pedigree its samples descend from."""
    op = "pedigree_kinship"
    _method(method, {EST_DIPLOID, EST_HAMILTON_KERR}, op)
    ds, parent_ = _with_parent(ds, parent, op)
    n = len(parent_)
    if founder_kinship is not None:
        kinship_ = _host(ds, founder_kinship, op, "f", 2).astype(np.float64)
        if founder_indices is not None:
            warnings.warn("The 'founder_indices' parameter is deprecated and, instead, the dimension sizes of "
                          "'founder_kinship' should equal the number of samples", DeprecationWarning, stacklevel=2)
            index = to_numpy(variable(ds, founder_indices, kind="iu", op=op).data)
            if kinship_.shape != (len(index), len(index)):
                raise InputError(
                    f"{op}: variables {founder_kinship!r} and {founder_indices!r} have mismatching dimensions")
            if len(index) > n:
                raise InputError(f"{op}: the number of founders ({len(index)}) exceeds the number of samples ({n})")
            kinship_ = kinship_.map_blocks(_founders_scattered, index=index, n=n, chunks=((n,), (n,)), dtype=np.float64)
        elif kinship_.shape != (n, n):
            raise InputError(f"{op}: variable {founder_kinship!r} has shape {kinship_.shape}: its dimension sizes "
                             f"should equal the number of samples, {n}")
    _sizes_check(ds, method, op)
    if method == EST_HAMILTON_KERR:
        tau, lambda_ = _hamilton_kerr(ds, stat_Hamilton_Kerr_tau, stat_Hamilton_Kerr_lambda, parent_.shape, op)
    if founder_kinship is not None and chunks is not None:
        raise NotImplementedInputError(f"{op}: chunks are not implemented with founder_kinship")
    if chunks is None:
        if method == EST_DIPLOID and founder_kinship is None:
            kernel = _guarded(op, plain.kinship_diploid) if n <= PLAIN_MATRIX_SAMPLES else _call(op, "kinship_diploid")
            kinship = _one_block(kernel, (n, n), parent_, allow_half_founders=allow_half_founders)
        elif method == EST_DIPLOID:
            kinship = _one_block(_call(op, "project_kinship_diploid"), (n, n), kinship_, parent_,
                                 allow_half_founders=allow_half_founders)
        elif founder_kinship is None:
            kinship = _one_block(_call(op, "kinship_Hamilton_Kerr"), (n, n), parent_, tau, lambda_,
                                 allow_half_founders=allow_half_founders)
        else:
            kinship = _one_block(_call(op, "project_kinship_Hamilton_Kerr"), (n, n), kinship_, parent_, tau, lambda_,
                                 allow_half_founders=allow_half_founders)
    elif method == EST_DIPLOID:
        kinship = _square(_call(op, "kinship_diploid_chunk"), n, chunks, [parent_],
                          allow_half_founders=allow_half_founders)
    else:
        kinship = _square(_call(op, "kinship_Hamilton_Kerr_chunk"), n, chunks, [parent_, tau, lambda_],
                          allow_half_founders=allow_half_founders)
    dims = ("samples_0", "samples_1")
    new = {"stat_pedigree_kinship": (dims, kinship)}
    if return_relationship:
        relationship = kinship * 2
        if method == EST_HAMILTON_KERR:
            ploidy = tau.sum(axis=-1)
            relationship *= np.sqrt(ploidy[None, :] / 2 * ploidy[:, None] / 2)
        new["stat_pedigree_relationship"] = (dims, relationship)
    return _merge(ds, _new(new), merge)


def _founders_scattered(kinship, *, index, n: int):
    """sgkit's founder kinship given with ``founder_indices``: NaN but at the founders' pairs."""
    out = np.full((n, n), np.nan)
    out[np.ix_(index, index)] = kinship
    return out


def _tau_lambda(ds, method, parent_, tau: Hashable, lambda_: Hashable, op: str):
    """Hamilton-Kerr's parameters, or the diploid ones (tau 1, lambda 0), as sgkit makes them."""
    _sizes_check(ds, method, op)
    if method == EST_DIPLOID:
        if parent_.shape[1] != 2:
            raise InputError(f"{op}: the parents dimension must be length 2, not {parent_.shape[1]}")
        return da.ones_like(parent_, dtype=np.uint64), da.zeros_like(parent_, dtype=np.float64)
    return _hamilton_kerr(ds, tau, lambda_, parent_.shape, op)


def _inbreeding(method, parent_, tau, lambda_, allow_half_founders: bool, op: str):
    """sgkit's ``inbreeding_Hamilton_Kerr``: each sample's inbreeding and its parents' kinship
    (diploid, up to ``PLAIN_MATRIX_SAMPLES``, NumPy's, from ``parent`` alone)."""
    n = len(parent_)
    if method == EST_DIPLOID and n <= PLAIN_MATRIX_SAMPLES:
        call, arrays = _guarded(op, plain.inbreeding_diploid), (parent_,)
    else:
        call, arrays = _call(op, "inbreeding_Hamilton_Kerr"), (parent_, tau, lambda_)
    both = _one_block(lambda *a, **k: np.stack(call(*a, **k), axis=1), (n, 2), *arrays,
                      allow_half_founders=allow_half_founders)
    return both[:, 0], both[:, 1]


def pedigree_inbreeding(ds: xr.Dataset, *, method: Literal["diploid", "Hamilton-Kerr"] = EST_DIPLOID,
                        parent: Hashable = "parent", stat_Hamilton_Kerr_tau: Hashable = "stat_Hamilton_Kerr_tau",
                        stat_Hamilton_Kerr_lambda: Hashable = "stat_Hamilton_Kerr_lambda",
                        allow_half_founders: bool = False, merge: bool = True) -> xr.Dataset:
    """sgkit's ``pedigree_inbreeding``: ``stat_pedigree_inbreeding`` (samples)."""
    op = "pedigree_inbreeding"
    _method(method, {EST_DIPLOID, EST_HAMILTON_KERR}, op)
    ds, parent_ = _with_parent(ds, parent, op)
    tau, lambda_ = _tau_lambda(ds, method, parent_, stat_Hamilton_Kerr_tau, stat_Hamilton_Kerr_lambda, op)
    inbreeding, _ = _inbreeding(method, parent_, tau, lambda_, allow_half_founders, op)
    return _merge(ds, _new({"stat_pedigree_inbreeding": (("samples",), inbreeding)}), merge)


def pedigree_inverse_kinship(ds: xr.Dataset, *, method: Literal["diploid", "Hamilton-Kerr"] = EST_DIPLOID,
                             parent: Hashable = "parent", stat_Hamilton_Kerr_tau: Hashable = "stat_Hamilton_Kerr_tau",
                             stat_Hamilton_Kerr_lambda: Hashable = "stat_Hamilton_Kerr_lambda",
                             return_relationship: bool = False, allow_half_founders: bool = False,
                             merge: bool = True) -> xr.Dataset:
    """sgkit's ``pedigree_inverse_kinship``: ``stat_pedigree_inverse_kinship`` (samples_0,
    samples_1), built from each sample's inbreeding and its parents' kinship without the kinship
    matrix; with ``return_relationship`` ``stat_pedigree_inverse_relationship``."""
    op = "pedigree_inverse_kinship"
    _method(method, {EST_DIPLOID, EST_HAMILTON_KERR}, op)
    ds, parent_ = _with_parent(ds, parent, op)
    tau, lambda_ = _tau_lambda(ds, method, parent_, stat_Hamilton_Kerr_tau, stat_Hamilton_Kerr_lambda, op)
    inbreeding, parent_kinship = _inbreeding(method, parent_, tau, lambda_, allow_half_founders, op)
    ploidy = tau.sum(axis=-1)
    self_kinship = (1 + (ploidy - 1) * inbreeding) / ploidy
    n = len(parent_)
    if method == EST_DIPLOID and n <= PLAIN_MATRIX_SAMPLES:
        inverse, arrays = _guarded(op, plain.inverse_kinship_diploid), (parent_, self_kinship, parent_kinship)
    else:
        inverse, arrays = _call(op, "inverse_kinship_Hamilton_Kerr"), (parent_, tau, self_kinship, parent_kinship)
    dims = ("samples_0", "samples_1")
    # the flag passed in both calls, so that Numba compiles one specialization (an omitted
    # argument is another type than a bool: 1.1 s more on a machine's first run)
    new = {"stat_pedigree_inverse_kinship": (
        dims, _one_block(inverse, (n, n), *arrays, return_relationship=False))}
    if return_relationship:
        new["stat_pedigree_inverse_relationship"] = (dims, _one_block(
            inverse, (n, n), *arrays, return_relationship=True))
    return _merge(ds, _new(new), merge)


def pedigree_contribution(ds: xr.Dataset, *, method: Literal["even", "variable"] = EST_EVEN, chunks: Hashable = -1,
                          parent: Hashable = "parent", stat_Hamilton_Kerr_tau: Hashable = "stat_Hamilton_Kerr_tau",
                          merge: bool = True) -> xr.Dataset:
    """sgkit's ``pedigree_contribution``: ``stat_pedigree_contribution`` (samples_0, samples_1),
    the expected contribution of sample x to sample y at [x, y], in tiles of rows or of columns."""
    op = "pedigree_contribution"
    _method(method, {EST_EVEN, EST_VARIABLE}, op)
    ds, parent_ = _with_parent(ds, parent, op)
    n, n_parent = parent_.shape
    if method == EST_EVEN:
        if ds.sizes.get("ploidy", 2) % 2:
            raise InputError(
                f"{op}: the 'even' method requires an even-ploidy dataset, not ploidy {ds.sizes['ploidy']}")
        if n_parent != 2:
            raise InputError(
                f"{op}: the 'even' method requires that the 'parents' dimension has a length of 2, not {n_parent}")
        share = da.ones_like(parent_, dtype=np.float64) / 2
    else:
        tau = _host(ds, stat_Hamilton_Kerr_tau, op, "u", 2)
        share = tau / tau.sum(axis=-1, keepdims=True)
    order = _one_block(_guarded(op, topological_argsort), (n,), parent_, dtype=np.uint64)
    rows, cols = da.empty((n, n), chunks=chunks).chunks
    if len(rows) > 1 and len(cols) > 1:
        raise NotImplementedInputError(f"{op}: chunking is only supported along a single axis (chunks {chunks!r})")
    by_columns = len(rows) == 1
    targets = da.arange(n, chunks=(cols if by_columns else rows,))
    name = "contribution_to" if by_columns else "contribution_from"
    if method == EST_EVEN and n <= PLAIN_MATRIX_SAMPLES:
        kernel = _guarded(op, getattr(plain, name))
    else:
        kernel = _call(op, name)
    contribution = da.blockwise(kernel, "ti", parent_, "pq", share, "pq", order, "o", targets, "t", new_axes={"i": n},
                                concatenate=True, dtype=np.float64, meta=np.empty((0, 0)))
    if by_columns:
        contribution = contribution.T
    return _merge(ds, _new({"stat_pedigree_contribution": (("samples_0", "samples_1"), contribution)}), merge)


def pedigree_sel(ds: xr.Dataset, *, samples, ancestor_depth: int = 0, descendant_depth: int = 0,
                 parent: Hashable = "parent", sample_id: Hashable = "sample_id", parent_id: Hashable = "parent_id",
                 sel_samples_0: bool = True, sel_samples_1: bool = True, update_parent_id: bool = True,
                 drop_parent: bool = True) -> xr.Dataset:
    """sgkit's ``pedigree_sel``: ``ds`` with ``samples`` (labels of the samples dimension) and their
    ancestors and descendants up to the given depths (negative: all), selected along ``samples``
    (and ``samples_0``/``samples_1``); parent identifiers not selected become '.'."""
    op = "pedigree_sel"
    ds, parent_ = _with_parent(ds, parent, op)
    parent_ = to_numpy(parent_)
    order = _guarded(op, topological_argsort)(parent_)
    n = len(parent_)
    ancestor_depth = n if ancestor_depth < 0 else ancestor_depth
    descendant_depth = n if descendant_depth < 0 else descendant_depth
    try:
        chosen = ds.samples.sel({"samples": samples}).values
    except (KeyError, IndexError) as e:
        raise InputError(
            f"{op}: samples {list(np.atleast_1d(samples))} are not all in the dataset's samples ({e})") from None
    initial = ds.samples.isin(chosen).values
    keep = initial.copy()
    if ancestor_depth > 0:
        depth = _depth("ancestors", initial, parent_, order)
        keep |= (depth >= 0) & (depth <= ancestor_depth)
    if descendant_depth > 0:
        depth = _depth("descendants", initial, parent_, order)
        keep |= (depth >= 0) & (depth <= descendant_depth)
    labels = ds.samples.values[keep]
    selection = {"samples": labels}
    if sel_samples_0 and "samples_0" in ds.sizes:
        selection["samples_0"] = labels
    if sel_samples_1 and "samples_1" in ds.sizes:
        selection["samples_1"] = labels
    new = ds.sel(selection)
    if update_parent_id:
        new[parent_id] = xr.where(new[parent_id].isin(new[sample_id]), new[parent_id], ".")
    if drop_parent:
        new = new.drop_vars(parent)
    return new


def simulate_genedrop(ds: xr.Dataset, *, method: Literal["diploid", "Hamilton-Kerr"] | None = EST_DIPLOID,
                      call_genotype: Hashable = "call_genotype", parent: Hashable = "parent",
                      stat_Hamilton_Kerr_tau: Hashable = "stat_Hamilton_Kerr_tau",
                      stat_Hamilton_Kerr_lambda: Hashable = "stat_Hamilton_Kerr_lambda", seed=None,
                      merge: bool = True) -> xr.Dataset:
    """sgkit's ``simulate_genedrop``: ``call_genotype`` (with its mask and fill) of the founders'
    alleles dropped through the pedigree, at random, variant by variant. A variant's draws come
    from Numba's generator seeded with its seed (``seed``: one per variant, or the seed of NumPy's
    ``default_rng`` that draws them), as sgkit's, so the same seed gives sgkit's genotypes (on the
    GPU too: the diploid method's CUDA C kernel reproduces that generator)."""
    op = "simulate_genedrop"
    _method(method, {EST_DIPLOID, EST_HAMILTON_KERR}, op)
    ds, parent_ = _with_parent(ds, parent, op)
    gt = variable(ds, call_genotype, kind="i", op=op)
    if gt.ndim != 3:
        raise InputError(f"{op}: variable {call_genotype!r} has dimensions {tuple(map(str, gt.dims))}, "
                         "expected (variants, samples, ploidy)")
    data = gt.data if isinstance(gt.data, da.Array) else da.from_array(gt.data, chunks=(-1, -1, -1), asarray=False)
    data = data.rechunk({1: -1, 2: -1})
    if gt.shape[1] != len(parent_):
        raise InputError(f"{op}: {call_genotype!r} has {gt.shape[1]} samples, {parent!r} {len(parent_)}")
    if hasattr(seed, "__len__"):
        seeds = np.asarray(seed)
        if seeds.shape != (len(gt),):
            raise InputError(f"{op}: seed has shape {seeds.shape}, expected one seed per variant ({len(gt)})")
    elif seed is not None:
        seeds = np.random.default_rng(seed).integers(2**32, size=len(gt), dtype=np.uint32)
    else:
        seeds = np.random.randint(2**32, size=len(gt), dtype=np.uint32)
    seeds = da.from_array(seeds.astype(np.uint32), chunks=(data.chunks[0],))
    if method == EST_DIPLOID:
        backend = backend_of(data)
        kernel = _guarded(op, kernels.get("genedrop_diploid", backend))
        # the samples' order once, on the host, for every block; with parent and the seeds, on the
        # blocks' backend (on the GPU, copied there once)
        order = _one_block(_guarded(op, _argsort), (len(parent_),), parent_, dtype=np.int64)
        small = [to_backend(x, backend) for x in (parent_, order, seeds)]
        sim = da.blockwise(kernel, "vsk", data, "vsk", small[0], "pq", small[1], "o", small[2], "v", concatenate=True,
                           dtype=data.dtype, meta=data._meta)
    else:
        tau, lambda_ = _hamilton_kerr(ds, stat_Hamilton_Kerr_tau, stat_Hamilton_Kerr_lambda, parent_.shape, op)
        small = [a for x in (parent_, tau, lambda_) for a in (x, "pq")]
        sim = da.blockwise(_dropped, "vsk", data, "vsk", *small, seeds, "v", kernel=_call(op, "genedrop_Hamilton_Kerr"),
                           concatenate=True, dtype=data.dtype, meta=data._meta)
    dims = gt.dims
    new = _new({"call_genotype": (dims, sim), "call_genotype_mask": (dims, sim < 0),
                "call_genotype_fill": (dims, sim < -1)})
    return _merge(ds, new.assign_coords(gt.coords), merge)


def _argsort(parent) -> np.ndarray:
    """:func:`topological_argsort` as int64, the type the genedrop kernels read."""
    return topological_argsort(parent).astype(np.int64)


def _dropped(gt, *args, kernel):
    """``kernel`` on a block of genotypes, on the host, and its result on the block's backend."""
    xp = xp_of(gt)
    out = kernel(to_numpy(gt), *args)
    return out if xp is np else xp.asarray(out)


def display_pedigree(ds: xr.Dataset, parent: Hashable = "parent", graph_attrs: dict | None = None,
                     node_attrs: dict | None = None, edge_attrs: dict | None = None) -> Any:
    """sgkit's ``display_pedigree``: a ``graphviz.Digraph`` of the pedigree, an edge from each
    parent to its child, nodes labelled by the samples' labels unless ``node_attrs`` say."""
    op = "display_pedigree"
    try:
        from graphviz import Digraph
    except ImportError:
        raise MissingLibraryInputError(f"{op}: Visualizing pedigrees requires the `graphviz` python library and the "
                                   "`graphviz` system library to be installed.") from None
    ds, parent_ = _with_parent(ds, parent, op)
    parent_ = to_numpy(parent_)
    n_samples, n_parent_types = parent_.shape
    graph_attrs = graph_attrs or {}
    node_attrs = dict(node_attrs or {})
    edge_attrs = edge_attrs or {}
    if "label" not in node_attrs and "samples" in ds.coords:
        node_attrs["label"] = ds.samples.values
    node_attrs = {k: np.broadcast_to(v, n_samples) for k, v in node_attrs.items()}
    edge_attrs = {k: np.broadcast_to(v, parent_.shape) for k, v in edge_attrs.items()}
    graph = Digraph()
    graph.attr(**graph_attrs)
    for i in range(n_samples):
        graph.node(str(i), **{k: str(v[i]) for k, v in node_attrs.items()})
    for i in range(n_samples):
        for j in range(n_parent_types):
            p = parent_[i, j]
            if p >= 0:
                graph.edge(str(p), str(i), **{k: str(v[i, j]) for k, v in edge_attrs.items()})
    return graph


__all__ = [
    "display_pedigree", "parent_indices", "pedigree_contribution", "pedigree_inbreeding", "pedigree_inverse_kinship",
    "pedigree_kinship", "pedigree_sel", "simulate_genedrop",
]
