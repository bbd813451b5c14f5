"""Detrending a block that holds the whole axis, on the GPU, reading it once: CUDA C.

The Numba CUDA kernel of :mod:`pipeline.kernels.fields` (one thread per grid point: fit, solve,
subtract) reads each point's series twice, as the fit needs every step before the first
subtraction: 46-50% of the copy bandwidth on an H200 (benchmarks/ops_bandwidth.py, counting one
read and one write). This kernel keeps a tile of ``P`` neighbouring points over all the steps in
shared memory, filled by asynchronous copies (``cp.async``: the whole tile's loads in flight at
once, no registers held), one block a tile:

1. thread (q, g) sums the data's normal equations of point q (sums of u^k x, and the count) over
   steps g, g + G, ... (G = THREADS / P groups of steps), from shared memory; the sums of u^k
   alone are the same for every point without NaN, so they are made once per launch
   (``pipeline_detrend_whole``), and a point with NaNs makes its own in a second look at its tile;
2. the groups' sums are added in order g = 0, 1, ..., and one thread per point solves the
   (deg + 1)^2 system (Gaussian elimination with partial pivoting, as the Numba kernel);
3. thread (q, g) writes x - trend over its steps, again from shared memory.

Measured on 730 x 1038240 float32 (benchmarks/ops_bandwidth.py, share of the copy bandwidth):
16 points a tile, 66% (in two runs, with and without the shared sums of u^k); 32 points, 58-67%;
blocks looping over tiles instead of one a tile, 47-65%; a second tile buffer per block, copied
while the first is worked on, 33-51%; the tile's copies in 2, 4 or 8 pieces, the sums over a piece
begun while the later ones are in flight, 65%, 61% and 55% (one piece, the same run: 65%). Under the 70% the other kernels reach: the phases of a
block run one after the other, and three blocks a multiprocessor do not hide them all.

Rows of a tile are ``P`` consecutive points: whole 32-byte sectors, and 16-byte copies where the
addresses allow. Blocks whose series do not fit (``plan`` returns 0) use the Numba kernel. The
twin (:func:`detrend_tile_twin`, Numba on the CPU) does the same float64 operations in the same
order; without fused multiply-adds (``--fmad=false``) the two agree bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

THREADS = 256
TILE_BYTES = 100 * 1024  # a tile at most: two blocks fit a multiprocessor (228 KB)

_SOURCE = r"""
typedef {in_t} in_t;
typedef {out_t} out_t;
#define P {points}
#define THREADS {threads}
#define G (THREADS / P)
#define M {m}
#define N (2 * M - 1)
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

__device__ __forceinline__ double trend(const double* c, double uu) {{
    double r = c[M - 1];
#pragma unroll
    for (int k = M - 2; k >= 0; --k) r = r * uu + c[k];
    return r;
}}

__device__ __forceinline__ void load_tile(in_t* tile, const in_t* __restrict__ x, int nt, long long npts, long long p0,
                                          int np, int vectors) {{
    // row t of the tile is x[t, p0 .. p0 + np), by asynchronous copies
    if (vectors && np == P) {{
        const int per_row = P / VEC;
        for (int k = threadIdx.x; k < nt * per_row; k += THREADS) {{
            const int t = k / per_row, j = (k - t * per_row) * VEC;
            copy16(tile + t * P + j, x + (long long)t * npts + p0 + j);
        }}
    }} else {{
        for (int k = threadIdx.x; k < nt * P; k += THREADS) {{
            const int t = k / P, j = k - t * P;
            if (j < np) copy1(tile + k, x + (long long)t * npts + p0 + j);
        }}
    }}
}}

extern "C" __global__ void pipeline_detrend_whole(const double* __restrict__ u, double* __restrict__ whole, int nt) {{
    // whole[g * N + k]: the sum of u^k over steps g, g + G, ..., by the operations, in the order, of
    // a point's own sums in pipeline_detrend_tile
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= G * N) return;
    const int gg = w / N, k = w % N;
    double acc = 0.0;
    for (int t = gg; t < nt; t += G) {{
        double pw = 1.0;
        for (int j = 0; j < k; ++j) pw *= u[t];
        acc += pw;
    }}
    whole[w] = acc;
}}

extern "C" __global__ void __launch_bounds__(THREADS) pipeline_detrend_tile(
        const in_t* __restrict__ x, const double* __restrict__ u, const double* __restrict__ whole_in,
        out_t* __restrict__ out, int nt, long long npts, int vectors) {{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ double red[G][N + M][P];
    __shared__ double whole[G][N];  // sums of u^k over each group's steps: S of a point with no NaN
    __shared__ int valid[G][P];
    __shared__ double coef[M][P];
    in_t* tile = (in_t*)smem_raw;
    const int q = threadIdx.x % P, g = threadIdx.x / P;
    const long long p0 = (long long)blockIdx.x * P;
    const int np = (int)min((long long)P, npts - p0);
    load_tile(tile, x, nt, npts, p0, np, vectors);

    // while the copies are in flight: the sums of u^k over each group's steps (made once for all
    // blocks by pipeline_detrend_whole)
    for (int w = threadIdx.x; w < G * N; w += THREADS) whole[w / N][w % N] = whole_in[w];
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();

    // the data's sums of point q over the steps of group g: T_k = sum u^k x, and the count
    double b[M];
#pragma unroll
    for (int k = 0; k < M; ++k) b[k] = 0.0;
    int count = 0;
    if (q < np) {{
        for (int t = g; t < nt; t += G) {{
            const double v = (double)tile[t * P + q];
            if (v == v) {{
                const double uu = u[t];
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
    valid[g][q] = count;
    __syncthreads();

    // a point with NaNs sums u^k over its valid steps itself (a second look at its tile)
    int total = 0;
    for (int h = 0; h < G; ++h) total += valid[h][q];
    const bool full = total == nt;
    if (q < np && !full) {{
        double s[N];
#pragma unroll
        for (int k = 0; k < N; ++k) s[k] = 0.0;
        for (int t = g; t < nt; t += G) {{
            const double v = (double)tile[t * P + q];
            if (v == v) {{
                const double uu = u[t];
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

    // the groups in order, then the solve, one thread per point
    if (threadIdx.x < np) {{
        const int r = threadIdx.x;
        double S[N], c[M], a[M][M];
#pragma unroll
        for (int k = 0; k < N; ++k) {{
            double acc = 0.0;
            for (int h = 0; h < G; ++h) acc += full ? whole[h][k] : red[h][k][r];
            S[k] = acc;
        }}
#pragma unroll
        for (int k = 0; k < M; ++k) {{
            double acc = 0.0;
            for (int h = 0; h < G; ++h) acc += red[h][N + k][r];
            c[k] = acc;
        }}
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

    // x - trend, from the tile
    if (q < np) {{
        double c[M];
#pragma unroll
        for (int k = 0; k < M; ++k) c[k] = coef[k][q];
        out_t* o = out + p0 + q;
        for (int t = g; t < nt; t += G) o[(long long)t * npts] = (out_t)((double)tile[t * P + q] - trend(c, u[t]));
    }}
}}
"""


def source(in_dtype, out_dtype, deg: int, points: int = 16, threads: int = THREADS) -> str:
    """The CUDA source of the kernel (the tests compile it with nvcc too)."""
    from .streaming import C_TYPES

    return _SOURCE.format(
        in_t=C_TYPES[np.dtype(in_dtype)], out_t=C_TYPES[np.dtype(out_dtype)], points=points, threads=threads, m=deg + 1,
    )


@functools.cache
def _raw_kernel(in_dtype, out_dtype, deg: int, points: int, threads: int, name: str = "pipeline_detrend_tile"):
    import cupy

    src = source(in_dtype, out_dtype, deg, points, threads)  # both kernels of one source: compiled once
    return cupy.RawKernel(src, name, options=("--fmad=false", "-std=c++17"))


def plan(nt: int, itemsize: int, dtype_ok: bool = True) -> int:
    """Points per tile: 16, else 8, in a tile of at most ``TILE_BYTES``; 0 where none fits (the
    block's series are too long: the Numba kernel reads it twice instead). 16 points measured
    best (see the module's notes)."""
    if dtype_ok and nt >= 1:
        for points in (16, 8):
            if nt * points * itemsize <= TILE_BYTES:
                return points
    return 0


def supported(dtype) -> bool:
    return np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.float64))


def detrend_tile(x2d, u1d, out2d, deg: int, *, points: int | None = None, threads: int = THREADS) -> bool:
    """Detrend the C-contiguous (steps, points) CuPy array ``x2d`` into ``out2d`` by the tile
    kernel (``u1d`` the float64 coordinate of the steps); False, doing nothing, where
    :func:`plan` says the series do not fit. ``points`` defaults to the plan's."""
    nt, npts = x2d.shape
    points = plan(nt, x2d.dtype.itemsize, supported(x2d.dtype)) if points is None else points
    if not points:
        return False
    if npts == 0:
        return True
    import cupy

    types = (np.dtype(x2d.dtype), np.dtype(out2d.dtype), deg, points, threads)
    groups, n = threads // points, 2 * deg + 1
    whole = cupy.empty(groups * n, dtype=np.float64)
    _raw_kernel(*types, "pipeline_detrend_whole")((-(-groups * n // 128),), (128,), (u1d, whole, np.int32(nt)))
    kernel = _raw_kernel(*types)
    smem = nt * points * x2d.dtype.itemsize
    # with its static arrays a block may need more than the default 48 KB: ask for it each time
    kernel.max_dynamic_shared_size_bytes = smem
    # 16-byte copies need 16-byte aligned rows: the array's start and its row length
    vectors = int(x2d.data.ptr % 16 == 0 and (npts * x2d.dtype.itemsize) % 16 == 0)
    grid = (-(-npts // points),)
    kernel(grid, (threads,), (x2d, u1d, whole, out2d, np.int32(nt), np.int64(npts), np.int32(vectors)), shared_mem=smem)
    return True


# --- the same algorithm on the CPU: the twin of the CUDA C kernel -------------------------------------


@functools.cache
def _twin(deg: int, groups: int):
    import numba

    from .fields import make_trend_columns

    m, n = deg + 1, 2 * deg + 1
    _, solve, _ = make_trend_columns(numba.njit, deg)

    @numba.njit
    def run(x, u, out):
        nt, npts = x.shape
        red = np.zeros((groups, n + m))
        s = np.zeros(n)
        b = np.zeros(m)
        a = np.zeros((m, m))
        for p in range(npts):
            for g in range(groups):
                for k in range(n + m):
                    red[g, k] = 0.0
                for t in range(g, nt, groups):
                    v = float(x[t, p])
                    if v == v:
                        pw = 1.0
                        for k in range(n):
                            red[g, k] += pw
                            if k < m:
                                red[g, n + k] += pw * v
                            pw *= u[t]
            for k in range(n):
                acc = 0.0
                for g in range(groups):
                    acc += red[g, k]
                s[k] = acc
            for k in range(m):
                acc = 0.0
                for g in range(groups):
                    acc += red[g, n + k]
                b[k] = acc
            solve(s, b, a)
            for t in range(nt):
                r = b[m - 1]
                for k in range(m - 2, -1, -1):
                    r = r * u[t] + b[k]
                out[t, p] = float(x[t, p]) - r

    return run


def detrend_tile_twin(x2d, u1d, deg: int, out_dtype, *, points: int, threads: int = THREADS):
    """What :func:`detrend_tile` computes, on the CPU, in the kernel's order of operations."""
    out = np.empty(x2d.shape, dtype=out_dtype)
    _twin(deg, threads // points)(np.ascontiguousarray(x2d), np.ascontiguousarray(u1d, dtype=np.float64), out)
    return out
