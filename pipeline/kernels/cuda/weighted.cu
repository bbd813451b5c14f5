
typedef ${in_t} in_t;
#define THREADS ${threads}
#define U ${unroll}
#define ROWS ${rows}
#define WARPS (THREADS / 32)
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_weighted_sums_tiled(
        const in_t* __restrict__ x, const double* __restrict__ w, double* __restrict__ partial, long long nrows,
        long long npts, long long wcols, long long wrow, long long wcol) {
    // block (slice, tile): points slice * THREADS * U + i * THREADS + threadIdx.x, i < U (coalesced for each i),
    // rows tile * ROWS .. + ROWS. Point p's weight is w[(p / wcols) * wrow + (p % wcols) * wcol]: the
    // weights of a (lat, lon) grid may be a view with zero strides (cos(lat) along lon), read once
    // a thread, not copied out first.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long base = (long long)blockIdx.x * THREADS * U + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * ROWS;
    const int nr = (int)min((long long)ROWS, nrows - r0);
    double wr[U];
    bool in[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
        in[i] = base + i * THREADS < npts;
        const long long p = base + i * THREADS;
        wr[i] = in[i] ? w[(p / wcols) * wrow + (p % wcols) * wcol] : 0.0;
    }
    __shared__ double sh[ROWS][WARPS][2];
    const in_t* row = x + r0 * npts + base;
    in_t cur[U], nxt[U];
#pragma unroll
    for (int i = 0; i < U; ++i) cur[i] = in[i] ? row[i * THREADS] : (in_t)0;
    for (int r = 0; r < nr; ++r) {
        row += npts;
#pragma unroll
        for (int i = 0; i < U; ++i) nxt[i] = (in[i] && r + 1 < nr) ? row[i * THREADS] : (in_t)0;
        double sx = 0.0, sw = 0.0;
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const double v = (double)cur[i];
            if (in[i] && v == v) { sx += v * wr[i]; sw += wr[i]; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            sx += __shfl_down_sync(0xffffffffu, sx, o);
            sw += __shfl_down_sync(0xffffffffu, sw, o);
        }
        if (lane == 0) { sh[r][warp][0] = sx; sh[r][warp][1] = sw; }
#pragma unroll
        for (int i = 0; i < U; ++i) cur[i] = nxt[i];
    }
    __syncthreads();
    for (int q = threadIdx.x; q < 2 * nr; q += THREADS) {  // q = 2 * row + field
        double s = 0.0;
        for (int k = 0; k < WARPS; ++k) s += sh[q >> 1][k][q & 1];
        partial[((r0 + (q >> 1)) * 2 + (q & 1)) * gridDim.x + blockIdx.x] = s;
    }
}
