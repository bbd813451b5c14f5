"""Detrending a block that holds the whole axis, on the GPU, reading it once: CUDA C.

The Numba CUDA kernel of :mod:`pipeline.kernels.fields` (one thread per grid point: fit, solve,
subtract) reads each point's series twice, as the fit needs every step before the first
subtraction: 43-50% of the copy bandwidth on an H200 (benchmarks/ops_bandwidth.py, counting one
read and one write). This kernel holds a tile of ``P`` neighbouring points over all the steps in
shared memory, filled by asynchronous copies (``cp.async``: the whole tile's loads in flight at
once, no registers held), with the steps' coordinates beside it. Where the tile and its
coordinates fit 100 KB (730 float32 steps of 32 points), one block holds the whole tile; longer
series, on GPUs of compute capability 9.0, split the tile along the steps over a cluster of ``C``
blocks (one slab of steps each), whose sums meet through distributed shared memory:

1. thread (q, g) sums the data's normal equations of point q (sums of u^k x, and the count) over
   steps g, g + G, ... of its block's slab (G = THREADS / P groups of steps), from shared memory;
   the sums of u^k alone are the same for every group without NaN, so they are made once per
   launch (``pipeline_detrend_whole``), and a group with NaNs makes its own in a second look;
2. each block adds its groups in order g = 0, 1, ...; then every block of the tile adds the
   blocks' totals in order (block 0's first), so all hold the same sums, and one thread per point
   solves the (deg + 1)^2 system (Gaussian elimination with partial pivoting, as the Numba kernel);
3. thread (q, g) writes x - trend over its steps of the slab, again from shared memory.

What bounds it (730 x 1038240 float32 with a masked region, H200, share of the copy bandwidth):
the width of a tile's rows, and the float64 work. Copying tiles through shared memory without
any arithmetic reached 66% with rows of 16 points (64 bytes), 82-84% with 32 and 86-96% with 64
to 512. Conversions to and from float64 issue at a quarter of the rate of float64 additions (16
against 64 a clock per multiprocessor, in the CUDA programming guide's table), and the coordinate
was read from global memory at every step. With the coordinates in shared memory and NaN tested
on the stored value, before any conversion, one block a tile of 32 points went from 58-67% to 81.5-81.8% (two
blocks a multiprocessor), and of 16 points from 65-66% to 72.4-74.2%. Clusters gain less: 32
points over 2 blocks 70.6-70.7%, over 3 blocks 66-68% (both before and after); for 1460 steps,
32 points over 4 or 5 blocks 69.4-69.9%, 16 points over 2 to 4 blocks 62.5-65.3%. Not kept: 64
points over 3 to 8 blocks (51-64%), 128 over 8 (45-49%); a persistent grid of blocks looping
over tiles with two tile buffers each, the next tile's copies in flight during this one's sums
(22-55%); reading each tile twice, the second time from L2, with no tile in shared memory
(40-53%); series held in registers (35-60%).

Rows of a tile are ``P`` consecutive points: whole 32-byte sectors, and 16-byte copies where the
addresses allow. Blocks whose series do not fit (``plan`` returns None) use the Numba kernel. The
twin (:func:`detrend_tile_twin`, Numba on the CPU) does the same float64 operations in the same
order; without fused multiply-adds (``--fmad=false``) the two agree bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

THREADS = 256
TILE_BYTES = 40 * 1024  # a block's share of a tile at most: four blocks fit a multiprocessor
ONE_BLOCK_BYTES = 100 * 1024  # a whole tile and its coordinates in one block: two blocks fit a multiprocessor
MAX_CLUSTER = 8  # the largest cluster that every GPU of compute capability 9.0 schedules
ROW_BYTES = (128, 64)  # widths of a tile's rows, widest first (256 measured slower, see above)

_SOURCE = r"""
typedef {in_t} in_t;
typedef {out_t} out_t;
#define P {points}
#define THREADS {threads}
#define G (THREADS / P)
#define M {m}
#define N (2 * M - 1)
#define C {cluster}
#define VEC (16 / (int)sizeof(in_t))

__device__ __forceinline__ unsigned smem_addr(const void* p) {{ return (unsigned)__cvta_generic_to_shared(p); }}

__device__ __forceinline__ void copy16(in_t* dst, const in_t* src) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}}

__device__ __forceinline__ void copy1(in_t* dst, const in_t* src) {{
    if (sizeof(in_t) == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}}

#if C > 1
__device__ __forceinline__ unsigned cluster_rank() {{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}}
__device__ __forceinline__ void cluster_sync() {{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}}
__device__ __forceinline__ double load_rank(const double* p, unsigned rank) {{
    // not volatile: the loads of one thread go out together (they follow a cluster barrier)
    unsigned a;
    double v;
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
    asm("ld.shared::cluster.f64 %0, [%1];\n" : "=d"(v) : "r"(a));
    return v;
}}
#define KERNEL_ATTRS __cluster_dims__(C, 1, 1) __launch_bounds__(THREADS)
#else
#define KERNEL_ATTRS __launch_bounds__(THREADS)
#endif

__device__ __forceinline__ double trend(const double* c, double uu) {{
    double r = c[M - 1];
#pragma unroll
    for (int k = M - 2; k >= 0; --k) r = r * uu + c[k];
    return r;
}}

extern "C" __global__ void pipeline_detrend_whole(const double* __restrict__ u, double* __restrict__ whole, int nt, int slab) {{
    // whole[(r * G + g) * N + k]: the sum of u^k over steps r * slab + g, + G, ... of slab r, by the
    // operations, in the order, of a point's own sums in pipeline_detrend_tile
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= C * G * N) return;
    const int gg = w / N, k = w % N, r = gg / G, g = gg % G;
    const int end = min(nt, (r + 1) * slab);
    double acc = 0.0;
    for (int t = r * slab + g; t < end; t += G) {{
        double pw = 1.0;
        for (int j = 0; j < k; ++j) pw *= u[t];
        acc += pw;
    }}
    whole[w] = acc;
}}

extern "C" __global__ void KERNEL_ATTRS pipeline_detrend_tile(
        const in_t* __restrict__ x, const double* __restrict__ u, const double* __restrict__ whole_in,
        out_t* __restrict__ out, int nt, long long npts, int slab, int vectors) {{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ double red[G][N + M][P];  // group g's sums of point q: N of u^k, then M of u^k x
    __shared__ double part[N + M][P];   // this block's groups added
#if C > 1
    __shared__ double total[N + M][P];  // every block's added
#else
    double (*total)[P] = part;
#endif
    __shared__ double coef[M][P];
    in_t* tile = (in_t*)smem_raw;
#if C > 1
    const int rank = (int)cluster_rank();
#else
    const int rank = 0;
#endif
    const int q = threadIdx.x % P, g = threadIdx.x / P;
    const long long p0 = (long long)(blockIdx.x / C) * P;
    const int np = (int)min((long long)P, npts - p0);
    const int t0 = rank * slab;
    const int steps = max(0, min(slab, nt - t0));

    // rows t0 .. t0 + steps of points p0 .. p0 + np, by asynchronous copies
    if (vectors && np == P) {{
        const int per_row = P / VEC;
        for (int k = threadIdx.x; k < steps * per_row; k += THREADS) {{
            const int t = k / per_row, j = (k - t * per_row) * VEC;
            copy16(tile + t * P + j, x + (long long)(t0 + t) * npts + p0 + j);
        }}
    }} else {{
        for (int k = threadIdx.x; k < steps * P; k += THREADS) {{
            const int t = k / P, j = k - t * P;
            if (j < np) copy1(tile + k, x + (long long)(t0 + t) * npts + p0 + j);
        }}
    }}
    // the slab's coordinates, after the tile: read from shared memory by every point
    double* us = (double*)(smem_raw + ((steps * P * (int)sizeof(in_t) + 7) & ~7));
    for (int k = threadIdx.x; k < steps; k += THREADS) us[k] = u[t0 + k];
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();

    // point q over the steps of group g (g, g + G, ... of this block's slab): T_k = sum u^k x, the
    // count, and the sums of u^k: made once per launch for a group without NaN (whole_in), else here
    double b[M];
#pragma unroll
    for (int k = 0; k < M; ++k) b[k] = 0.0;
    int count = 0;
    const int in_group = steps > g ? (steps - g + G - 1) / G : 0;
    if (q < np) {{
        for (int t = g; t < steps; t += G) {{
            const in_t xv = tile[t * P + q];
            if (xv == xv) {{  // tested before the conversion, which issues at a quarter of a float64 addition's rate
                const double v = (double)xv, uu = us[t];
                double pw = 1.0;
                count += 1;
#pragma unroll
                for (int k = 0; k < M; ++k) {{
                    b[k] += pw * v;
                    pw *= uu;
                }}
            }}
        }}
    }}
#pragma unroll
    for (int k = 0; k < M; ++k) red[g][N + k][q] = b[k];
    if (q >= np || count == in_group) {{
        const double* wh = whole_in + (rank * G + g) * N;
#pragma unroll
        for (int k = 0; k < N; ++k) red[g][k][q] = wh[k];
    }} else {{
        double s[N];
#pragma unroll
        for (int k = 0; k < N; ++k) s[k] = 0.0;
        for (int t = g; t < steps; t += G) {{
            const in_t xv = tile[t * P + q];
            if (xv == xv) {{
                const double uu = us[t];
                double pw = 1.0;
#pragma unroll
                for (int k = 0; k < N; ++k) {{
                    s[k] += pw;
                    pw *= uu;
                }}
            }}
        }}
#pragma unroll
        for (int k = 0; k < N; ++k) red[g][k][q] = s[k];
    }}
    __syncthreads();

    // this block's groups added in order, for each point and sum; then, across the blocks of the
    // tile, the blocks' totals in order (block 0's first): every block of the tile gets the same sums
    for (int w = threadIdx.x; w < (N + M) * P; w += THREADS) {{
        const int k = w / P, r = w - k * P;
        double acc = 0.0;
        for (int h = 0; h < G; ++h) acc += red[h][k][r];
        part[k][r] = acc;
    }}
#if C > 1
    cluster_sync();  // every block's totals are written
    for (int w = threadIdx.x; w < (N + M) * P; w += THREADS) {{
        const int k = w / P, r = w - k * P;
        double acc = 0.0;
#pragma unroll
        for (int cr = 0; cr < C; ++cr) acc += load_rank(&part[k][r], cr);
        total[k][r] = acc;
    }}
    cluster_sync();  // all have read every block's totals (none leaves before), and this block's are whole
#else
    __syncthreads();
#endif

    // the solve, one thread per point; each block of the tile solves alike, for its own rows
    if (threadIdx.x < np) {{
        const int r = threadIdx.x;
        double S[N], c[M], a[M][M];
#pragma unroll
        for (int k = 0; k < N; ++k) S[k] = total[k][r];
#pragma unroll
        for (int k = 0; k < M; ++k) c[k] = total[N + k][r];
        if (S[0] < M) {{
#pragma unroll
            for (int k = 0; k < M; ++k) c[k] = __longlong_as_double(0x7ff8000000000000LL);  /* NaN */
        }} else {{
#pragma unroll
            for (int ii = 0; ii < M; ++ii)
#pragma unroll
                for (int j = 0; j < M; ++j) a[ii][j] = S[ii + j];
#pragma unroll
            for (int cc = 0; cc < M; ++cc) {{
                int piv = cc;
#pragma unroll
                for (int rr = cc + 1; rr < M; ++rr)
                    if (fabs(a[rr][cc]) > fabs(a[piv][cc])) piv = rr;
                if (piv != cc) {{
#pragma unroll
                    for (int j = 0; j < M; ++j) {{ const double tmp = a[cc][j]; a[cc][j] = a[piv][j]; a[piv][j] = tmp; }}
                    const double tmp = c[cc]; c[cc] = c[piv]; c[piv] = tmp;
                }}
#pragma unroll
                for (int rr = cc + 1; rr < M; ++rr) {{
                    const double f = a[rr][cc] / a[cc][cc];
#pragma unroll
                    for (int j = cc; j < M; ++j) a[rr][j] -= f * a[cc][j];
                    c[rr] -= f * c[cc];
                }}
            }}
#pragma unroll
            for (int ii = M - 1; ii >= 0; --ii) {{
                double v = c[ii];
#pragma unroll
                for (int j = ii + 1; j < M; ++j) v -= a[ii][j] * c[j];
                c[ii] = v / a[ii][ii];
            }}
        }}
#pragma unroll
        for (int k = 0; k < M; ++k) coef[k][r] = c[k];
    }}
    __syncthreads();

    // x - trend over this block's rows, from the tile
    if (q < np) {{
        double c[M];
#pragma unroll
        for (int k = 0; k < M; ++k) c[k] = coef[k][q];
        out_t* o = out + p0 + q;
        for (int t = g; t < steps; t += G) o[(long long)(t0 + t) * npts] = (out_t)((double)tile[t * P + q] - trend(c, us[t]));
    }}
}}
"""


def source(in_dtype, out_dtype, deg: int, points: int = 64, threads: int = THREADS, cluster: int = 1) -> str:
    """The CUDA source of the kernel (the tests compile it with nvcc too)."""
    from .streaming import C_TYPES

    return _SOURCE.format(
        in_t=C_TYPES[np.dtype(in_dtype)], out_t=C_TYPES[np.dtype(out_dtype)], points=points, threads=threads,
        m=deg + 1, cluster=cluster,
    )


@functools.cache
def _raw_kernel(in_dtype, out_dtype, deg: int, points: int, threads: int, cluster: int, name: str = "pipeline_detrend_tile"):
    import cupy

    src = source(in_dtype, out_dtype, deg, points, threads, cluster)  # both kernels of one source: compiled once
    return cupy.RawKernel(src, name, options=("--fmad=false", "-std=c++17"))


def slab(nt: int, cluster: int) -> int:
    """Steps of the series that each block of a tile holds (the last block may hold fewer)."""
    return -(-nt // cluster)


@functools.cache
def _clusters_ok() -> bool:
    """Blocks in clusters need compute capability 9.0 (Hopper) or later."""
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= 90  # "90", "100": compare as numbers


def plan(nt: int, itemsize: int, dtype_ok: bool = True, clusters: bool = True) -> tuple[int, int] | None:
    """(points a tile, blocks a tile) for series of ``nt`` steps: one block a tile where the tile
    and its coordinates fit ``ONE_BLOCK_BYTES``, with rows of 128 or 64 bytes (64 or 32 before
    compute capability 9.0); otherwise (from 9.0) the widest rows of ``ROW_BYTES`` whose tile,
    split over at most ``MAX_CLUSTER`` blocks, keeps each block's share within ``TILE_BYTES``.
    None where none fits (the Numba kernel reads the block twice instead)."""
    if not dtype_ok or nt < 1:
        return None
    for row in (128, 64) if clusters else (64, 32):
        if nt * (row + 8) <= ONE_BLOCK_BYTES:  # the tile's rows and the steps' float64 coordinates
            return row // itemsize, 1
    if clusters:
        for row in ROW_BYTES:
            cluster = -(-nt * row // TILE_BYTES)
            if cluster <= MAX_CLUSTER:
                return row // itemsize, cluster
    return None


def supported(dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))


def detrend_tile(x2d, u1d, out2d, deg: int, *, points: int | None = None, cluster: int | None = None,
                 threads: int = THREADS) -> bool:
    """Detrend the C-contiguous (steps, points) CuPy array ``x2d`` into ``out2d`` by the tile
    kernel (``u1d`` the float64 coordinate of the steps); False, doing nothing, where
    :func:`plan` finds no tile. ``points`` and ``cluster`` are the plan's unless both are given."""
    nt, npts = x2d.shape
    if (points is None) != (cluster is None):
        raise ValueError("detrend_tile: give both points and cluster, or neither")
    if points is None:
        chosen = plan(nt, x2d.dtype.itemsize, supported(x2d.dtype), _clusters_ok())
        if chosen is None:
            return False
        points, cluster = chosen
    if npts == 0:
        return True
    import cupy

    types = (np.dtype(x2d.dtype), np.dtype(out2d.dtype), deg, points, threads, cluster)
    groups, n, steps = threads // points, 2 * deg + 1, slab(nt, cluster)
    whole = cupy.empty(cluster * groups * n, dtype=np.float64)
    _raw_kernel(*types, "pipeline_detrend_whole")((-(-whole.size // 128),), (128,), (u1d, whole, np.int32(nt), np.int32(steps)))
    kernel = _raw_kernel(*types)
    smem = -(-steps * points * x2d.dtype.itemsize // 8) * 8 + steps * 8  # the tile, then the slab's coordinates
    # with its static arrays a block may need more than the default 48 KB: ask for it each time
    kernel.max_dynamic_shared_size_bytes = smem
    # 16-byte copies need 16-byte aligned rows: the array's start and its row length
    vectors = int(x2d.data.ptr % 16 == 0 and (npts * x2d.dtype.itemsize) % 16 == 0)
    grid = (-(-npts // points) * cluster,)
    kernel(grid, (threads,), (x2d, u1d, whole, out2d, np.int32(nt), np.int64(npts), np.int32(steps), np.int32(vectors)),
           shared_mem=smem)
    return True


# --- the same algorithm on the CPU: the twin of the CUDA C kernel -------------------------------------


@functools.cache
def _twin(deg: int, groups: int, cluster: int):
    import numba

    from .fields import make_trend_columns

    m, n = deg + 1, 2 * deg + 1
    _, solve, _ = make_trend_columns(numba.njit, deg)

    @numba.njit
    def run(x, u, out, steps):
        nt, npts = x.shape
        red = np.zeros((cluster * groups, n + m))
        s = np.zeros(n)
        b = np.zeros(m)
        a = np.zeros((m, m))
        for p in range(npts):
            for r in range(cluster):
                end = min(nt, (r + 1) * steps)
                for g in range(groups):
                    row = r * groups + g
                    for k in range(n + m):
                        red[row, k] = 0.0
                    for t in range(r * steps + g, end, groups):
                        v = float(x[t, p])
                        if v == v:
                            pw = 1.0
                            for k in range(n):
                                red[row, k] += pw
                                if k < m:
                                    red[row, n + k] += pw * v
                                pw *= u[t]
            for k in range(n + m):
                total = 0.0
                for r in range(cluster):  # each block's groups in order, then the blocks in order
                    acc = 0.0
                    for g in range(groups):
                        acc += red[r * groups + g, k]
                    total += acc
                if k < n:
                    s[k] = total
                else:
                    b[k - n] = total
            solve(s, b, a)
            for t in range(nt):
                r = b[m - 1]
                for k in range(m - 2, -1, -1):
                    r = r * u[t] + b[k]
                out[t, p] = float(x[t, p]) - r

    return run


def detrend_tile_twin(x2d, u1d, deg: int, out_dtype, *, points: int, threads: int = THREADS, cluster: int = 1):
    """What :func:`detrend_tile` computes, on the CPU, in the kernel's order of operations."""
    out = np.empty(x2d.shape, dtype=out_dtype)
    steps = slab(x2d.shape[0], cluster)
    _twin(deg, threads // points, cluster)(np.ascontiguousarray(x2d), np.ascontiguousarray(u1d, dtype=np.float64), out, steps)
    return out
