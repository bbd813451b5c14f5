// PC-Relate's per-call values (sgkit's pc_relate) from diploid calls g (variants, samples, 2) and
// their mask (the same shape, bool), C-contiguous, in two steps around the products with the PCs'
// basis (cuBLAS): the dosages imputed with each variant's mean, then, from mu = (imputed q) q^T / 2,
// the centred dosages and the standard deviations. The operations of the array formulas in
// pipeline/kernels/relatedness.py (pc_relate_values_cpu), in their order, compiled with
// --fmad=false: the sums are of integers (exact in any order), so every value is the same.

typedef ${call_t} call_t;

#define IMPUTE_THREADS 256

// imputed (variants, samples) float64: a call's dosage (its two alleles' sum) where neither allele is
// masked, else the variant's mean dosage over its unmasked calls (NaN where it has none, 0 / 0).
// A block a variant (grid-stride over variants), its threads over the samples.
extern "C" __global__ void __launch_bounds__(IMPUTE_THREADS)
pipeline_pc_relate_imputed(const call_t* __restrict__ g, const bool* __restrict__ mask, double* __restrict__ imputed,
                           long long variants, long long samples) {
    __shared__ long long sums[IMPUTE_THREADS];
    __shared__ long long counts[IMPUTE_THREADS];
    const int t = threadIdx.x;
    for (long long v = blockIdx.x; v < variants; v += gridDim.x) {
        const call_t* gv = g + v * samples * 2;
        const bool* mv = mask + v * samples * 2;
        long long sum = 0, count = 0;
        for (long long s = t; s < samples; s += IMPUTE_THREADS) {
            if (!(mv[2 * s] || mv[2 * s + 1])) {
                sum += (long long)gv[2 * s] + (long long)gv[2 * s + 1];
                count += 1;
            }
        }
        sums[t] = sum;
        counts[t] = count;
        __syncthreads();
        for (int k = IMPUTE_THREADS / 2; k > 0; k >>= 1) {
            if (t < k) {
                sums[t] += sums[t + k];
                counts[t] += counts[t + k];
            }
            __syncthreads();
        }
        const double mean = (double)sums[0] / (double)counts[0];
        for (long long s = t; s < samples; s += IMPUTE_THREADS) {
            const bool missing = mv[2 * s] || mv[2 * s + 1];
            imputed[v * samples + s] = missing ? mean : (double)((long long)gv[2 * s] + (long long)gv[2 * s + 1]);
        }
        __syncthreads();  // the shared sums are the next variant's
    }
}

// out (calls, 2) float64 from mu2 (calls) = (imputed q) q^T: mu = mu2 / 2; where mu is within maf of 0
// or 1, or the call is masked, both values are 0; else the centred dosage dosage / 2 - mu and the
// standard deviation sqrt(mu (1 - mu)). A thread a call, grid-stride.
extern "C" __global__ void pipeline_pc_relate_values(const call_t* __restrict__ g, const bool* __restrict__ mask,
                                                     const double* __restrict__ mu2, double* __restrict__ out,
                                                     long long calls, double maf) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < calls; i += stride) {
        const bool missing = mask[2 * i] || mask[2 * i + 1];
        const double dosage = missing ? -1.0 : (double)((long long)g[2 * i] + (long long)g[2 * i + 1]);
        const double mu = mu2[i] / 2.0;
        const bool out_of_range = (mu <= maf) || (mu >= 1.0 - maf) || missing;
        out[2 * i] = out_of_range ? 0.0 : dosage / 2.0 - mu;
        out[2 * i + 1] = sqrt(out_of_range ? 0.0 : mu * (1.0 - mu));
    }
}
