
typedef ${in_t} in_t;
typedef ${out_t} out_t;
#define THREADS ${threads}
#define U ${unroll}
#define RING ${ring}

// total / count, rounded as the division rounds, with no division per element (a double
// division is a dozen dependent instructions, and was the largest cost after the loads):
// q = total * r with r = 1 / count, recomputed only when count changes, then one correction by the
// exact remainder fma(-q, count, total): with r correctly rounded and q within an ulp, q + rem * r
// rounds to total / count (Markstein's theorem). Zero, tiny, huge or infinite totals divide.
__device__ __forceinline__ double quotient(double total, double count, double r) {
    const double a = fabs(total);
    if (a > 0x1p-900 && a < 0x1p900) {
        const double q = total * r;
        return fma(fma(-q, count, total), r, q);
    }
    return total / count;
}

__device__ __forceinline__ void step(out_t* __restrict__ o, double enter, double leave, double& total, double& count,
                                     double& rcount, double& r, int min_periods) {
    // a missing index arrives as NaN and counts as missing, as a NaN value does
    if (enter == enter) { total += enter; count += 1.0; }
    if (leave == leave) { total -= leave; count -= 1.0; }
    if (count >= min_periods && count > 0.0) {
        if (count != rcount) { rcount = count; r = 1.0 / count; }
        *o = (out_t)quotient(total, count, r);
    } else {
        *o = (out_t)__longlong_as_double(0x7ff8000000000000LL);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) ${name}(
        const in_t* __restrict__ x, out_t* __restrict__ out, long long nt, long long npts, long long tile,
        int before, int after, int min_periods) {
    const double NaN = __longlong_as_double(0x7ff8000000000000LL);
    const long long p = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (p >= npts) return;  // no __syncthreads below: each thread uses its own slots only
#if RING
    extern __shared__ __align__(16) unsigned char smem[];
    in_t* ring = reinterpret_cast<in_t*>(smem) + threadIdx.x;
#endif
    const in_t* xp = x + p;
    out_t* op = out + p;
    const int W = before + after + 1;
    const long long t0 = (long long)blockIdx.y * tile, t1 = min(nt, t0 + tile);
    // prime with the window of step t0 - 1: indices lo .. lo + W - 1, lo = t0 - 1 - before, those
    // inside the block; index s goes to slot s - lo, so step t's leaving index, t - 1 - before,
    // has slot (t - t0) % W, which is where its entering index t + after goes next
    const long long lo = t0 - 1 - before;
    double total = 0.0, count = 0.0, rcount = 0.0, r = 0.0;  // r = 1 / rcount
    for (long long s = max(lo, 0LL); s < min(nt, lo + W); ++s) {
        const in_t v = xp[s * npts];
        const double d = (double)v;
        if (d == d) { total += d; count += 1.0; }
#if RING
        ring[(s - lo) * THREADS] = v;
#endif
    }
    long long t = t0;
    int k = 0;  // the ring slot of step t
    for (; t + U <= t1 && t + after + U <= nt; t += U) {
        in_t e[U];
#pragma unroll
        for (int i = 0; i < U; ++i) e[i] = xp[(t + after + i) * npts];
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const long long l = t + i - before - 1;
#if RING
            const double leave = l >= 0 ? (double)ring[k * THREADS] : NaN;
            ring[k * THREADS] = e[i];
            k = k + 1 == W ? 0 : k + 1;
#else
            const double leave = l >= 0 ? (double)xp[l * npts] : NaN;
#endif
            step(op + (t + i) * npts, (double)e[i], leave, total, count, rcount, r, min_periods);
        }
    }
    for (; t < t1; ++t) {  // the last steps, where the entering index may lie past the block
        const long long l = t - before - 1, e = t + after;
        const in_t v = e < nt ? xp[e * npts] : (in_t)0;
#if RING
        const double leave = l >= 0 ? (double)ring[k * THREADS] : NaN;
        ring[k * THREADS] = v;
        k = k + 1 == W ? 0 : k + 1;
#else
        const double leave = l >= 0 ? (double)xp[l * npts] : NaN;
#endif
        step(op + t * npts, e < nt ? (double)v : NaN, leave, total, count, rcount, r, min_periods);
    }
}
