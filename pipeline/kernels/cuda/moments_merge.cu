
// Moment partials (n, mean, M2) of k parts, each field k rows of npts values (part r of field f at
// f[r * stride + p]), one thread a point. The operations are those of the NumPy formulas in
// pipeline/kernels/moments.py (merge_partials, mean_std), in their order, without fused
// multiply-adds: the two agree bit for bit.
extern "C" __global__ void pipeline_moments_merge(
        const double* __restrict__ n_i, const double* __restrict__ mean_i, const double* __restrict__ m2_i,
        long long stride, double* __restrict__ n_out, double* __restrict__ mean_out, double* __restrict__ m2_out,
        long long k, long long npts) {
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= npts) return;
    double n = n_i[p], s = n_i[p] * mean_i[p], q = m2_i[p];
    for (long long r = 1; r < k; ++r) {
        n += n_i[r * stride + p];
        s += n_i[r * stride + p] * mean_i[r * stride + p];
        q += m2_i[r * stride + p];
    }
    const double mean = s / (n > 0.0 ? n : 1.0);
    double d = mean_i[p] - mean;
    double e = n_i[p] * d * d;
    for (long long r = 1; r < k; ++r) {
        d = mean_i[r * stride + p] - mean;
        e += n_i[r * stride + p] * d * d;
    }
    n_out[p] = n;
    mean_out[p] = mean;
    m2_out[p] = q + e;
}

// The mean and the (ddof = 0) standard deviation of each point, NaN where it has no value:
// out[p] and out[npts + p].
extern "C" __global__ void pipeline_mean_std(
        const double* __restrict__ n, const double* __restrict__ mean, const double* __restrict__ m2,
        double* __restrict__ out, long long npts) {
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= npts) return;
    const bool any = n[p] > 0.0;
    out[p] = any ? mean[p] : nan("");
    out[npts + p] = any ? sqrt(m2[p] / n[p]) : nan("");
}
