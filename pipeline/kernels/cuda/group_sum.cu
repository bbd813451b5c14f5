
typedef ${in_t} in_t;
typedef ${cmp_t} cmp_t;
#define THREADS ${threads}
#define U ${unroll}
#define MODE ${mode}
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_group_sum(
        const in_t* __restrict__ x, const long long* __restrict__ order, const long long* __restrict__ ends,
        cmp_t threshold, double* __restrict__ sums, double* __restrict__ counts, long long nt, long long npts, int k) {
    const long long p = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (p >= npts) return;
    const in_t* xp = x + p;
    double acc = 0.0, n = 0.0;
    int g = 0;
    long long end = k > 0 ? ends[0] : -1;
    // write out the groups that end at position j of ``order`` (a group with no steps ends where the one before does)
#define SETTLE(j) while (g < k && end == (j)) { sums[g * npts + p] = acc; counts[g * npts + p] = n; acc = 0.0; n = 0.0; \
                                                if (++g < k) end = ends[g]; }
#if MODE == 0
#define ADD(v) { const double d = (double)(v); if (d == d) { acc += d; n += 1.0; } }
#else
#define ADD(v) { if ((cmp_t)(v) > threshold) acc += 1.0; }
#endif
    SETTLE(0)
    // the next U steps are loaded while these are added up (as in the spells kernel)
    long long j = 0;
    in_t v[U];
    if (U <= nt) {
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = xp[order[i] * npts];
    }
    for (; j + U <= nt; j += U) {
        in_t nv[U];
        if (j + 2 * U <= nt) {
#pragma unroll
            for (int i = 0; i < U; ++i) nv[i] = xp[order[j + U + i] * npts];
        }
#pragma unroll
        for (int i = 0; i < U; ++i) { ADD(v[i]) SETTLE(j + i + 1) }
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = nv[i];
    }
    for (; j < nt; ++j) { ADD(xp[order[j] * npts]) SETTLE(j + 1) }
}
