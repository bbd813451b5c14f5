"""The diploid genedrop (``pipeline/kernels/pedigree.py``, ``cuda/pedigree.cu``) and the samples'
order and depths of ``ops/genomics/pedigree.py`` in plain Python.

Without a GPU: a pure-Python transcription of Numba's generator (MT19937 as ``numba/_random.c``
seeds and draws it, ``np.random.randint(2)`` its low bit) gives Numba's numbers and the Numba
loop's calls; the CUDA source, compiled for the host by a C++ compiler, gives them too; the plain
order and depths are those of sgkit's Numba functions. On a GPU: the kernel equals the Numba loop
bit for bit, and ``simulate_genedrop`` on CuPy data imports no Numba and compiles no CuPy kernel."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import pipeline.genomics as sg
from pipeline import backend as B, kernels
from pipeline.errors import InputError
from pipeline.kernels import launch, pedigree as K
from pipeline.ops.genomics import pedigree as P

CALL_TYPES = [np.int8, np.int16, np.int32, np.int64]


# --- the reference: Numba's generator and sgkit's loop, in plain Python ------------------------------


def mt_words(seed: int):
    """The tempered 32-bit words of Numba's generator after ``np.random.seed(seed)``: numba_rnd_init
    (Knuth's initialisation, the state's index at 624), then for each draw, where the index has
    reached 624, numba_rnd_shuffle's twist of all 624 words, and get_next_int32's tempering."""
    mt = [0] * 624
    s = int(seed) & 0xFFFFFFFF
    for pos in range(624):
        mt[pos] = s
        s = (1812433253 * (s ^ (s >> 30)) + pos + 1) & 0xFFFFFFFF
    while True:
        for i in range(624):  # in place: words past i - 227 are already the new ones, as in the C loops
            y = (mt[i] & 0x80000000) | (mt[(i + 1) % 624] & 0x7FFFFFFF)
            mt[i] = mt[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        for y in mt:
            y ^= y >> 11
            y ^= (y << 7) & 0x9D2C5680
            y ^= (y << 15) & 0xEFC60000
            y ^= y >> 18
            yield y


def genedrop_reference(genotypes, parent, order, seeds):
    """sgkit's loop with each ``np.random.randint(2)`` the low bit of the next word of
    :func:`mt_words` (Numba's NumPy mode: one bit, masked from the low end, never rejected)."""
    out = np.empty_like(genotypes)
    for v in range(len(genotypes)):
        words = mt_words(seeds[v])
        for t in order:
            unknown_parent = 0
            for j in range(2):
                p = parent[t, j]
                if p < 0:
                    unknown_parent += 1
                else:
                    out[v, t, j] = out[v, p, next(words) & 1]
            if unknown_parent == 1:
                raise ValueError("Pedigree contains half-founders")
            elif unknown_parent == 2:
                out[v, t] = genotypes[v, t]
    return out


def pedigree(n: int = 400, founders: int = 40, seed: int = 0) -> np.ndarray:
    """A pedigree of many generations (each sample's parents drawn among those before it, selfing
    included), ``founders`` founders, stored out of order: parent (n, 2) int64."""
    rng = np.random.default_rng(seed)
    parent = np.full((n, 2), -1, np.int64)
    for i in range(founders, n):
        parent[i] = rng.integers(0, i, 2)
    perm = rng.permutation(n)
    new = np.argsort(perm)  # the new index of each old sample
    return np.ascontiguousarray(np.where(parent >= 0, new[np.maximum(parent, 0)], -1)[perm])


def calls(parent, variants: int, dtype=np.int8, seed: int = 1) -> np.ndarray:
    """Calls (variants, samples, 2): alleles 0-2, missing (-1), and fill (-2) in some founders'."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-1, 3, (variants, len(parent), 2))
    founders = np.flatnonzero((parent < 0).all(axis=1))
    g[:, founders[::3], 1] = -2
    return g.astype(dtype)


SEEDS = np.array([0, 1, 7, 2**31, 2**32 - 1, 123456789], np.uint32)


def test_the_reference_draws_numbas_numbers():
    import numba

    @numba.njit
    def draws(seed, n):
        np.random.seed(seed)
        out = np.empty(n, np.int64)
        for i in range(n):
            out[i] = np.random.randint(2)
        return out

    for seed in SEEDS:
        words = mt_words(seed)
        reference = [next(words) & 1 for _ in range(2000)]  # three twists
        np.testing.assert_array_equal(draws(seed, 2000), reference)


@pytest.mark.parametrize("variants", [1, 45])
def test_the_reference_is_the_numba_loop(variants):
    parent = pedigree()  # 360 non-founders: 720 draws a variant, past the first 624 words
    order = P.topological_argsort(parent)
    for seed in (0, 5):
        g = calls(parent, variants, seed=seed)
        seeds = np.random.default_rng(seed).integers(2**32, size=variants, dtype=np.uint32)
        seeds[0] = SEEDS[seed % len(SEEDS)]
        twin = K.genedrop_diploid_cpu(g, parent, order, seeds)
        np.testing.assert_array_equal(twin, genedrop_reference(g, parent, order, seeds))
        assert twin.dtype == np.int8
        founders = (parent < 0).all(axis=1)
        np.testing.assert_array_equal(twin[:, founders], g[:, founders])


def test_the_numba_loop_raises_sgkits_errors():
    parent = pedigree(60, 10)
    order = P.topological_argsort(parent)
    g = calls(parent, 3)
    half = parent.copy()
    half[np.flatnonzero(half[:, 0] >= 0)[0], 1] = -1
    with pytest.raises(ValueError, match="^Pedigree contains half-founders$"):
        K.genedrop_diploid_cpu(g, half, order, SEEDS[:3])
    assert K.genedrop_diploid_cpu(g[:0], half, order, SEEDS[:0]).shape == (0, 60, 2)  # no variant: no draw
    with pytest.raises(ValueError, match="^Genotypes are not diploid$"):
        K.genedrop_diploid_cpu(np.zeros((3, 60, 3), np.int8), parent, order, SEEDS[:3])
    with pytest.raises(ValueError, match="^The parents dimension must be length 2$"):
        K.genedrop_diploid_cpu(g, np.full((60, 3), -1), order, SEEDS[:3])


# --- the CUDA source, compiled for the host --------------------------------------------------------

HOST_SHIM = """
struct pipeline_dim3 { unsigned int x, y, z; };
static pipeline_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
"""

HOST_RUN = """
extern "C" void pipeline_run(const call_t* g, call_t* out, const long long* parent, const long long* order,
                             const unsigned int* seeds, long long variants, long long samples, int* half,
                             unsigned int threads, unsigned int blocks) {
    blockDim.x = threads;
    gridDim.x = blocks;
    for (unsigned int b = 0; b < blocks; ++b)
        for (unsigned int t = 0; t < threads; ++t) {
            blockIdx.x = b;
            threadIdx.x = t;
            pipeline_genedrop_diploid(g, out, parent, order, seeds, variants, samples, half);
        }
}
"""


def _host_kernel(tmp_path, dtype):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / f"genedrop_{np.dtype(dtype).name}.cpp"
    src.write_text(HOST_SHIM + launch.cuda_source("pedigree.cu", call_t=launch.c_type(dtype)) + HOST_RUN)
    lib = src.with_suffix(".so")
    done = subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    run = ctypes.CDLL(str(lib)).pipeline_run

    def genedrop(g, parent, order, seeds, threads=32):
        g = np.ascontiguousarray(g, dtype)
        out = np.full(g.shape, 99, dtype)
        parent, order = np.ascontiguousarray(parent, np.int64), np.ascontiguousarray(order, np.int64)
        seeds = np.ascontiguousarray(seeds, np.uint32)
        half = np.zeros(1, np.int32)
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        run(ptr(g), ptr(out), ptr(parent), ptr(order), ptr(seeds), ctypes.c_longlong(g.shape[0]),
            ctypes.c_longlong(g.shape[1]), ptr(half), ctypes.c_uint(threads),
            ctypes.c_uint(launch.blocks(len(g), threads)))
        return out, int(half[0])

    return genedrop


@pytest.mark.parametrize("dtype", CALL_TYPES)
def test_the_cuda_source_compiled_for_the_host_is_the_numba_loop(tmp_path, dtype):
    genedrop = _host_kernel(tmp_path, dtype)
    parent = pedigree()
    order = P.topological_argsort(parent)
    g = calls(parent, 45, dtype)
    seeds = np.random.default_rng(3).integers(2**32, size=45, dtype=np.uint32)
    seeds[:len(SEEDS)] = SEEDS
    out, half = genedrop(g, parent, order, seeds)
    assert half == 0
    np.testing.assert_array_equal(out, K.genedrop_diploid_cpu(g, parent, order, seeds))
    parent[np.flatnonzero(parent[:, 0] >= 0)[5], 0] = -1
    assert genedrop(g, parent, order, seeds)[1] == 1


# --- the samples' order and depths, plain and compiled ----------------------------------------------


def _sgkit_functions():
    """sgkit's topological_argsort, _ancestor_depth and _descendent_depth as sgkit writes them."""
    import numba

    @numba.njit
    def topological_argsort(parent):
        n_samples, n_parents = parent.shape
        node_children = np.zeros(n_samples, dtype=np.uint64)
        for i in range(n_samples):
            for j in range(n_parents):
                p = parent[i, j]
                if p >= 0:
                    node_children[p] += 1
        order = np.empty(n_samples, dtype=np.uint64)
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
                p = parent[c, j]
                if p >= 0:
                    node_children[p] -= 1
                    if node_children[p] == 0:
                        order[insert] = p
                        insert += 1
        if i < n_samples:
            raise ValueError('Pedigree contains a directed loop')
        return order[::-1]

    @numba.njit
    def ancestor_depth(initial, parent, order):
        depth = initial - 1
        n_samples, n_parents = parent.shape
        order = order[::-1]
        for idx in range(n_samples):
            i = order[idx]
            depth_i = depth[i]
            if depth_i >= 0:
                for j in range(n_parents):
                    p = parent[i, j]
                    if p >= 0:
                        depth_p = depth[p]
                        if depth_p < 0:
                            depth[p] = depth_i + 1
                        else:
                            depth[p] = min(depth_p, depth_i + 1)
        return depth

    @numba.njit
    def descendent_depth(initial, parent, order):
        depth = initial - 1
        n_samples, n_parents = parent.shape
        for idx in range(n_samples):
            i = order[idx]
            depth_i = depth[i]
            for j in range(n_parents):
                p = parent[i, j]
                if p >= 0:
                    depth_p = depth[p]
                    if depth_p >= 0:
                        if depth_i < 0 or depth_i > depth_p:
                            depth_i = depth_p + 1
                            depth[i] = depth_i
        return depth

    return topological_argsort, ancestor_depth, descendent_depth


def _random_pedigree(rng, n: int, n_parents: int) -> np.ndarray:
    """Parents among the samples before each (some unknown, some half-founders), stored out of order."""
    parent = np.where(rng.random((n, n_parents)) < 0.2, -1, (rng.random((n, n_parents)) * np.arange(n)[:, None]))
    parent = np.where(np.arange(n)[:, None] == 0, -1, parent).astype(np.int64)
    perm = rng.permutation(n)
    new = np.argsort(perm)
    return np.ascontiguousarray(np.where(parent >= 0, new[np.maximum(parent, 0)], -1)[perm])


@pytest.mark.parametrize("numba_above", [None, 0], ids=["plain", "numba"])
def test_the_order_and_depths_are_sgkits(monkeypatch, numba_above):
    if numba_above is not None:  # the large pedigrees' path: the loops of _kernels(), of the same source
        monkeypatch.setattr(P, "PLAIN_SAMPLES", numba_above)
    argsort, ancestors, descendants = _sgkit_functions()
    compiled = P._kernels()
    rng = np.random.default_rng(0)
    for n, n_parents in [(0, 2), (1, 2), (7, 1), (50, 2), (300, 2), (300, 3), (1000, 2)]:
        parent = _random_pedigree(rng, n, n_parents)
        expected = argsort(parent)
        for order in (P.topological_argsort(parent), compiled["topological_argsort"](parent)):
            assert order.dtype == np.uint64
            np.testing.assert_array_equal(order, expected)
        initial = rng.random(n) < 0.03
        for name, walk, sgkit in [("_ancestor_depth", "ancestors", ancestors),
                                  ("_descendent_depth", "descendants", descendants)]:
            depth = sgkit(initial, parent, expected)
            for mine in (P._depth(walk, initial, parent, expected), compiled[name](initial, parent, expected)):
                assert mine.dtype == np.int64
                np.testing.assert_array_equal(mine, depth)
    loop = np.array([[-1, -1], [0, 3], [1, -1], [2, 0]])
    for fn in (argsort, P.topological_argsort, compiled["topological_argsort"]):
        with pytest.raises(ValueError, match="^Pedigree contains a directed loop$"):
            fn(loop)


_SEL_ALONE = """
import sys
import numpy as np, xarray as xr
import pipeline.genomics as sg
ids = np.array([f"S{i}" for i in range(6)], dtype=object)
parents = np.array([[".", "."], [".", "."], ["S0", "S1"], ["S0", "S2"], ["S3", "S1"], [".", "."]], dtype=object)
ds = xr.Dataset({"sample_id": ("samples", ids), "parent_id": (("samples", "parents"), parents)})
out = sg.pedigree_sel(ds.assign_coords(samples=ids), samples=["S3"], ancestor_depth=1, descendant_depth=-1)
print(list(out.samples.values), sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")))
"""


def test_pedigree_sel_imports_no_numba(tmp_path):
    done = subprocess.run([sys.executable, "-c", _SEL_ALONE], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['S0', 'S2', 'S3', 'S4'] []", done.stdout


# --- simulate_genedrop -------------------------------------------------------------------------------


def dataset(parent, g, backend: str = "cpu", chunk: int = 45) -> xr.Dataset:
    data = B.to_backend(da.from_array(g, chunks=(chunk, -1, -1)), backend)
    return xr.Dataset({"parent": (("samples", "parents"), parent),
                       "call_genotype": (("variants", "samples", "ploidy"), data)})


def test_simulate_genedrop_gives_the_loops_calls_for_the_seed():
    parent = pedigree()
    g = calls(parent, 100)
    with kernels.recording() as ran:
        out = sg.simulate_genedrop(dataset(parent, g), seed=11, merge=False)
        drop = out.call_genotype.values
    assert ran[("genedrop_diploid", "cpu")] == 3  # blocks of 45, 45 and 10 variants
    seeds = np.random.default_rng(11).integers(2**32, size=100, dtype=np.uint32)  # sgkit's seeds for seed=11
    np.testing.assert_array_equal(drop, genedrop_reference(g, parent, P.topological_argsort(parent), seeds))
    np.testing.assert_array_equal(out.call_genotype_mask.values, drop < 0)
    np.testing.assert_array_equal(out.call_genotype_fill.values, drop < -1)
    given = sg.simulate_genedrop(dataset(parent, g), seed=seeds).call_genotype.values
    np.testing.assert_array_equal(given, drop)


def test_simulate_genedrop_raises_the_pedigrees_errors():
    parent = pedigree(60, 10)
    half = parent.copy()
    half[np.flatnonzero(half[:, 0] >= 0)[0], 0] = -1
    with pytest.raises(InputError, match="^simulate_genedrop: Pedigree contains half-founders$"):
        sg.simulate_genedrop(dataset(half, calls(half, 5)), seed=1).call_genotype.values
    loop = parent.copy()
    child = np.flatnonzero(parent[:, 0] >= 0)[0]
    loop[parent[child, 0]] = [child, child]  # a parent its child's child
    with pytest.raises(InputError, match="^simulate_genedrop: Pedigree contains a directed loop$"):
        sg.simulate_genedrop(dataset(loop, calls(loop, 5)), seed=1).call_genotype.values
    with pytest.raises(InputError, match="^simulate_genedrop: The parents dimension must be length 2$"):
        wide = np.hstack([parent, np.full((60, 1), -1)])
        sg.simulate_genedrop(dataset(wide, calls(parent, 5)), seed=1).call_genotype.values


# --- on a GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CALL_TYPES)
def test_the_cuda_kernel_is_the_numba_loop(dtype):
    import cupy

    parent = pedigree(1000, 60, seed=2)  # 1880 draws a variant: three twists
    order = P.topological_argsort(parent)
    for variants in (1, 31, 45, 1000):
        g = calls(parent, variants, dtype, seed=variants)
        seeds = np.random.default_rng(variants).integers(2**32, size=variants, dtype=np.uint32)
        seeds[: min(variants, len(SEEDS))] = SEEDS[:variants]
        out = K.genedrop_diploid_gpu(cupy.asarray(g), parent, order, seeds)
        assert isinstance(out, cupy.ndarray) and out.dtype == dtype and out.shape == g.shape
        np.testing.assert_array_equal(out.get(), K.genedrop_diploid_cpu(g, parent, order, seeds))
        # parent, order and seeds already on the device (as simulate_genedrop hands them over)
        on_device = K.genedrop_diploid_gpu(cupy.asarray(g), cupy.asarray(parent), cupy.asarray(order.astype(np.int64)),
                                           cupy.asarray(seeds))
        np.testing.assert_array_equal(on_device.get(), out.get())


@pytest.mark.gpu
def test_the_cuda_kernel_raises_on_half_founders_and_takes_empty_blocks():
    import cupy

    parent = pedigree(60, 10)
    order = P.topological_argsort(parent)
    half = parent.copy()
    half[np.flatnonzero(half[:, 1] >= 0)[3], 1] = -1
    g = cupy.asarray(calls(parent, 40))
    with pytest.raises(ValueError, match="^Pedigree contains half-founders$"):
        K.genedrop_diploid_gpu(g, half, order, SEEDS[[0] * 40])
    empty = K.genedrop_diploid_gpu(g[:0], half, order, SEEDS[:0])  # no variant: no draw, no error
    assert isinstance(empty, cupy.ndarray) and empty.shape == (0, 60, 2) and empty.dtype == np.int8
    none = K.genedrop_diploid_gpu(g[:, :0], np.zeros((0, 2), np.int64), np.zeros(0, np.int64), SEEDS[[0] * 40])
    assert none.shape == (40, 0, 2)
    with pytest.raises(ValueError, match="^Genotypes are not diploid$"):
        K.genedrop_diploid_gpu(cupy.zeros((3, 60, 3), np.int8), parent, order, SEEDS[:3])


@pytest.mark.gpu
def test_simulate_genedrop_on_the_gpu_is_the_hosts():
    parent = pedigree()
    g = calls(parent, 100)
    with kernels.recording() as ran:
        out = sg.simulate_genedrop(dataset(parent, g, "gpu"), seed=11, merge=False)
        assert B.backend_of(out.call_genotype.data) == "gpu"
        drop = B.to_numpy(out.call_genotype.data)
    assert set(ran) == {("genedrop_diploid", "gpu")} and ran[("genedrop_diploid", "gpu")] == 3
    host = sg.simulate_genedrop(dataset(parent, g), seed=11, merge=False).call_genotype.values
    np.testing.assert_array_equal(drop, host)
    np.testing.assert_array_equal(B.to_numpy(out.call_genotype_mask.data), host < 0)
    half = parent.copy()
    half[np.flatnonzero(half[:, 0] >= 0)[0], 0] = -1
    with pytest.raises(InputError, match="^simulate_genedrop: Pedigree contains half-founders$"):
        B.to_numpy(sg.simulate_genedrop(dataset(half, g, "gpu"), seed=1).call_genotype.data)


_GENEDROP_ALONE = """
import logging, sys
logging.basicConfig(level=logging.WARNING)
logging.getLogger("pipeline").setLevel(logging.DEBUG)
import dask.array as da, numpy as np, xarray as xr
import pipeline.genomics as sg
from pipeline import backend as B
parent, g = np.load(sys.argv[1]), np.load(sys.argv[2])
ids = np.array([f"S{i}" for i in range(len(parent))], dtype=object)
parent_id = np.where(parent >= 0, ids[np.maximum(parent, 0)], ".")
data = B.to_backend(da.from_array(g, chunks=(45, -1, -1)), "gpu")
ds = xr.Dataset({"sample_id": ("samples", ids), "parent_id": (("samples", "parents"), parent_id),
                 "call_genotype": (("variants", "samples", "ploidy"), data)})
out = sg.simulate_genedrop(ds, seed=11, merge=False).call_genotype.data
np.save(sys.argv[3], B.to_numpy(out))
print(type(out._meta).__module__, sorted(m for m in sys.modules if m == "numba" or m.startswith("numba.")))
"""


@pytest.mark.gpu
def test_simulate_genedrop_on_the_gpu_imports_no_numba_and_compiles_no_cupy_kernel(tmp_path):
    """A fresh process with empty kernel caches drops genes through a pedigree (its ``parent`` from
    ``parent_id``) on CuPy data: the kernel shipped compiled, no Numba imported, no CuPy kernel
    compiled, and the Numba loop's calls."""
    parent = pedigree()
    g = calls(parent, 100)
    np.save(tmp_path / "parent.npy", parent)
    np.save(tmp_path / "g.npy", g)
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    args = [str(tmp_path / name) for name in ("parent.npy", "g.npy", "out.npy")]
    done = subprocess.run([sys.executable, "-c", _GENEDROP_ALONE, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    module, numba_modules = done.stdout.split(None, 1)
    assert module.startswith("cupy") and numba_modules.strip() == "[]", done.stdout
    compiles = [line for line in done.stderr.splitlines() if "CuPy kernel" in line]
    assert compiles == [], "\n".join(compiles)
    seeds = np.random.default_rng(11).integers(2**32, size=100, dtype=np.uint32)
    expected = K.genedrop_diploid_cpu(g, parent, P.topological_argsort(parent), seeds)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
