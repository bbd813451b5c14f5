
typedef ${in_t} in_t;
typedef ${out_t} out_t;
#define P ${points}
#define THREADS ${threads}
#define G (THREADS / P)
#define M ${m}
#define N (2 * M - 1)
#define C ${cluster}
#define VEC (16 / (int)sizeof(in_t))

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void copy16(in_t* dst, const in_t* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void copy1(in_t* dst, const in_t* src) {
    if (sizeof(in_t) == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

#if C > 1
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ double load_rank(const double* p, unsigned rank) {
    // not volatile: the loads of one thread go out together (they follow a cluster barrier)
    unsigned a;
    double v;
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
    asm("ld.shared::cluster.f64 %0, [%1];\n" : "=d"(v) : "r"(a));
    return v;
}
#define KERNEL_ATTRS __cluster_dims__(C, 1, 1) __launch_bounds__(THREADS)
#else
#define KERNEL_ATTRS __launch_bounds__(THREADS)
#endif

__device__ __forceinline__ double trend(const double* c, double uu) {
    double r = c[M - 1];
#pragma unroll
    for (int k = M - 2; k >= 0; --k) r = r * uu + c[k];
    return r;
}

extern "C" __global__ void pipeline_detrend_whole(const double* __restrict__ u, double* __restrict__ whole, int nt, int slab) {
    // whole[(r * G + g) * N + k]: the sum of u^k over steps r * slab + g, + G, ... of slab r, by the
    // operations, in the order, of a point's own sums in pipeline_detrend_tile
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= C * G * N) return;
    const int gg = w / N, k = w % N, r = gg / G, g = gg % G;
    const int end = min(nt, (r + 1) * slab);
    double acc = 0.0;
    for (int t = r * slab + g; t < end; t += G) {
        double pw = 1.0;
        for (int j = 0; j < k; ++j) pw *= u[t];
        acc += pw;
    }
    whole[w] = acc;
}

extern "C" __global__ void KERNEL_ATTRS pipeline_detrend_tile(
        const in_t* __restrict__ x, const double* __restrict__ u, const double* __restrict__ whole_in,
        out_t* __restrict__ out, int nt, long long npts, int slab, int vectors) {
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
    if (vectors && np == P) {
        const int per_row = P / VEC;
        for (int k = threadIdx.x; k < steps * per_row; k += THREADS) {
            const int t = k / per_row, j = (k - t * per_row) * VEC;
            copy16(tile + t * P + j, x + (long long)(t0 + t) * npts + p0 + j);
        }
    } else {
        for (int k = threadIdx.x; k < steps * P; k += THREADS) {
            const int t = k / P, j = k - t * P;
            if (j < np) copy1(tile + k, x + (long long)(t0 + t) * npts + p0 + j);
        }
    }
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
    if (q < np) {
        for (int t = g; t < steps; t += G) {
            const in_t xv = tile[t * P + q];
            if (xv == xv) {  // tested before the conversion, which issues at a quarter of a float64 addition's rate
                const double v = (double)xv, uu = us[t];
                double pw = 1.0;
                count += 1;
#pragma unroll
                for (int k = 0; k < M; ++k) {
                    b[k] += pw * v;
                    pw *= uu;
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < M; ++k) red[g][N + k][q] = b[k];
    if (q >= np || count == in_group) {
        const double* wh = whole_in + (rank * G + g) * N;
#pragma unroll
        for (int k = 0; k < N; ++k) red[g][k][q] = wh[k];
    } else {
        double s[N];
#pragma unroll
        for (int k = 0; k < N; ++k) s[k] = 0.0;
        for (int t = g; t < steps; t += G) {
            const in_t xv = tile[t * P + q];
            if (xv == xv) {
                const double uu = us[t];
                double pw = 1.0;
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    s[k] += pw;
                    pw *= uu;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < N; ++k) red[g][k][q] = s[k];
    }
    __syncthreads();

    // this block's groups added in order, for each point and sum; then, across the blocks of the
    // tile, the blocks' totals in order (block 0's first): every block of the tile gets the same sums
    for (int w = threadIdx.x; w < (N + M) * P; w += THREADS) {
        const int k = w / P, r = w - k * P;
        double acc = 0.0;
        for (int h = 0; h < G; ++h) acc += red[h][k][r];
        part[k][r] = acc;
    }
#if C > 1
    cluster_sync();  // every block's totals are written
    for (int w = threadIdx.x; w < (N + M) * P; w += THREADS) {
        const int k = w / P, r = w - k * P;
        double acc = 0.0;
#pragma unroll
        for (int cr = 0; cr < C; ++cr) acc += load_rank(&part[k][r], cr);
        total[k][r] = acc;
    }
    cluster_sync();  // all have read every block's totals (none leaves before), and this block's are whole
#else
    __syncthreads();
#endif

    // the solve, one thread per point; each block of the tile solves alike, for its own rows
    if (threadIdx.x < np) {
        const int r = threadIdx.x;
        double S[N], c[M], a[M][M];
#pragma unroll
        for (int k = 0; k < N; ++k) S[k] = total[k][r];
#pragma unroll
        for (int k = 0; k < M; ++k) c[k] = total[N + k][r];
        if (S[0] < M) {
#pragma unroll
            for (int k = 0; k < M; ++k) c[k] = __longlong_as_double(0x7ff8000000000000LL);  /* NaN */
        } else {
#pragma unroll
            for (int ii = 0; ii < M; ++ii)
#pragma unroll
                for (int j = 0; j < M; ++j) a[ii][j] = S[ii + j];
#pragma unroll
            for (int cc = 0; cc < M; ++cc) {
                int piv = cc;
#pragma unroll
                for (int rr = cc + 1; rr < M; ++rr)
                    if (fabs(a[rr][cc]) > fabs(a[piv][cc])) piv = rr;
                if (piv != cc) {
#pragma unroll
                    for (int j = 0; j < M; ++j) { const double tmp = a[cc][j]; a[cc][j] = a[piv][j]; a[piv][j] = tmp; }
                    const double tmp = c[cc]; c[cc] = c[piv]; c[piv] = tmp;
                }
#pragma unroll
                for (int rr = cc + 1; rr < M; ++rr) {
                    const double f = a[rr][cc] / a[cc][cc];
#pragma unroll
                    for (int j = cc; j < M; ++j) a[rr][j] -= f * a[cc][j];
                    c[rr] -= f * c[cc];
                }
            }
#pragma unroll
            for (int ii = M - 1; ii >= 0; --ii) {
                double v = c[ii];
#pragma unroll
                for (int j = ii + 1; j < M; ++j) v -= a[ii][j] * c[j];
                c[ii] = v / a[ii][ii];
            }
        }
#pragma unroll
        for (int k = 0; k < M; ++k) coef[k][r] = c[k];
    }
    __syncthreads();

    // x - trend over this block's rows, from the tile
    if (q < np) {
        double c[M];
#pragma unroll
        for (int k = 0; k < M; ++k) c[k] = coef[k][q];
        out_t* o = out + p0 + q;
        for (int t = g; t < steps; t += G) o[(long long)(t0 + t) * npts] = (out_t)((double)tile[t * P + q] - trend(c, us[t]));
    }
}
