
typedef ${in_t} in_t;
typedef ${out_t} out_t;
typedef ${idx_t} idx_t;
#define F0 ${f0}
#define F1 ${f1}
#define F2 ${f2}
#define F3 ${f3}
extern "C" __global__ void __launch_bounds__(${threads}) pipeline_coarsen_mean(
        const in_t* __restrict__ x, out_t* __restrict__ out, idx_t m1, idx_t m2, idx_t m3,
        long long s0, long long s1, long long s2, long long s3, idx_t total) {
    const idx_t o = (idx_t)blockIdx.x * ${threads} + threadIdx.x;
    if (o >= total) return;
    // output (o0, o1, o2, o3), C order; its window starts at (o0 F0, o1 F1, o2 F2, o3 F3)
    idx_t r = o;
    const idx_t o3 = r % m3; r /= m3;
    const idx_t o2 = r % m2; r /= m2;
    const idx_t o1 = r % m1;
    const idx_t o0 = r / m1;
    const in_t* w = x + (long long)o0 * F0 * s0 + (long long)o1 * F1 * s1 + (long long)o2 * F2 * s2 + (long long)o3 * F3 * s3;
    double acc = 0.0;
    int n = 0;
#if F0 * F1 * F2 * F3 <= 64
    // every load of the window first, then the sums: the whole window's loads in flight
    in_t v[F0 * F1 * F2 * F3];
#pragma unroll
    for (int i0 = 0; i0 < F0; ++i0)
#pragma unroll
        for (int i1 = 0; i1 < F1; ++i1)
#pragma unroll
            for (int i2 = 0; i2 < F2; ++i2)
#pragma unroll
                for (int i3 = 0; i3 < F3; ++i3)
                    v[((i0 * F1 + i1) * F2 + i2) * F3 + i3] = w[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3];
#pragma unroll
    for (int i = 0; i < F0 * F1 * F2 * F3; ++i) {
        const bool ok = v[i] == v[i];  // NaN is skipped (always true for integers)
        acc += ok ? (double)v[i] : 0.0;
        n += ok;
    }
#else
    // a larger window: added as it is loaded, the innermost loop unrolled by 8
    for (int i0 = 0; i0 < F0; ++i0)
        for (int i1 = 0; i1 < F1; ++i1)
            for (int i2 = 0; i2 < F2; ++i2) {
                const in_t* row = w + i0 * s0 + i1 * s1 + i2 * s2;
#pragma unroll 8
                for (int i3 = 0; i3 < F3; ++i3) {
                    const in_t vi = row[i3 * s3];
                    const bool ok = vi == vi;
                    acc += ok ? (double)vi : 0.0;
                    n += ok;
                }
            }
#endif
    out[o] = n > 0 ? (out_t)(acc / n) : (out_t)__longlong_as_double(0x7ff8000000000000LL);
}
