
typedef ${in_t} in_t;
#define THREADS ${threads}
#define U ${unroll}
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_moments(
        const in_t* __restrict__ x, double* __restrict__ out, long long nrows, long long npts, long long tile) {
    // block (slice, tile): points slice * THREADS * U + i * THREADS + threadIdx.x, i < U (coalesced
    // for each i), steps tile * tile .. + tile; out[tile][0 | 1 | 2][point] = n, mean, m2
    const long long base = (long long)blockIdx.x * THREADS * U + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * tile;
    const long long r1 = min(nrows, r0 + tile);
    bool in[U];
    long long cnt[U];
    double sh[U], s1[U], s2[U];
    in_t cur[U], nxt[U];
    const in_t* row = x + r0 * npts + base;
#pragma unroll
    for (int i = 0; i < U; ++i) {
        in[i] = base + i * THREADS < npts;
        cnt[i] = 0; sh[i] = 0.0; s1[i] = 0.0; s2[i] = 0.0;
        cur[i] = (in[i] && r0 < r1) ? row[i * THREADS] : (in_t)0;
    }
    for (long long r = r0; r < r1; ++r) {
        row += npts;
#pragma unroll
        for (int i = 0; i < U; ++i) nxt[i] = (in[i] && r + 1 < r1) ? row[i * THREADS] : (in_t)0;
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const double v = (double)cur[i];
            if (v == v) {
                if (cnt[i] == 0) sh[i] = v;
                const double d = v - sh[i];
                cnt[i] += 1;
                s1[i] += d;
                s2[i] += d * d;
            }
            cur[i] = nxt[i];
        }
    }
    double* o = out + (long long)blockIdx.y * 3 * npts;
#pragma unroll
    for (int i = 0; i < U; ++i) {
        if (!in[i]) continue;
        const long long p = base + i * THREADS;
        o[p] = (double)cnt[i];
        if (cnt[i] > 0) {
            const double c = (double)cnt[i];
            const double m2 = s2[i] - s1[i] * s1[i] / c;
            o[npts + p] = sh[i] + s1[i] / c;
            o[2 * npts + p] = (0.0 > m2) ? 0.0 : m2;  /* as Python's max(m2, 0.0) */
        } else {
            o[npts + p] = 0.0;
            o[2 * npts + p] = 0.0;
        }
    }
}
