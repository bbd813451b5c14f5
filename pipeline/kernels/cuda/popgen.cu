// sgkit's per-variant diversity and divergence terms from cohort allele counts, and Fst from
// divergence: one thread an output value, each the operations of the array formulas in
// pipeline/kernels/popgen.py (their CPU twins), compiled with --fmad=false. The counts are
// integers, exact in float64, so every numerator and denominator is exact and each ratio the
// same correctly rounded value. One module: the fresh machine compiles it once, where the array
// formulas on CuPy compiled a kernel for each of their operations (3.4 s of a first run).

typedef ${count_t} count_t;

__device__ __forceinline__ double ratio(double num, double den) {
    return num / (den != 0.0 ? den : nan(""));
}

// ac (rows, alleles) -> out (rows): (pairs - same pairs) / pairs, rows = variants x cohorts
extern "C" __global__ void pipeline_diversity_terms(const count_t* __restrict__ ac, double* __restrict__ out,
                                                    long long rows, int alleles) {
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const count_t* a = ac + r * alleles;
    double an = 0.0, same = 0.0;
    for (int k = 0; k < alleles; ++k) an += (double)a[k];
    for (int k = 0; k < alleles; ++k) {
        const double x = (double)a[k];
        same += x * (x - 1.0) / 2.0;
    }
    const double pairs = an * (an - 1.0) / 2.0;
    out[r] = ratio(pairs - same, pairs);
}

// ac (variants, cohorts, alleles) -> out (variants, cohorts, cohorts): between cohorts i != j the
// share of differing pairs among an_i * an_j, the cohort's diversity (an_i (an_i - 1) pairs) on
// the diagonal
extern "C" __global__ void pipeline_divergence_terms(const count_t* __restrict__ ac, double* __restrict__ out,
                                                     long long variants, int cohorts, int alleles) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per = (long long)cohorts * cohorts;
    if (t >= variants * per) return;
    const long long v = t / per;
    const int i = (int)((t % per) / cohorts), j = (int)(t % cohorts);
    const count_t* ai = ac + (v * cohorts + i) * alleles;
    const count_t* aj = ac + (v * cohorts + j) * alleles;
    double an_i = 0.0, an_j = 0.0, same = 0.0;
    for (int k = 0; k < alleles; ++k) { an_i += (double)ai[k]; an_j += (double)aj[k]; }
    double pairs;
    if (i == j) {
        pairs = an_i * (an_i - 1.0);
        for (int k = 0; k < alleles; ++k) { const double x = (double)ai[k]; same += x * (x - 1.0); }
    } else {
        pairs = an_i * an_j;
        for (int k = 0; k < alleles; ++k) same += (double)ai[k] * (double)aj[k];
    }
    out[t] = ratio(pairs - same, pairs);
}

// d (n, cohorts, cohorts), the diversities on the diagonal -> Fst (n, cohorts, cohorts): each pair
// a < b from d[a, b], given to (b, a) too; NaN on the diagonal. nei: Nei's estimator, else Hudson's.
extern "C" __global__ void pipeline_fst(const double* __restrict__ d, double* __restrict__ out, long long n,
                                        int cohorts, int nei) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per = (long long)cohorts * cohorts;
    if (t >= n * per) return;
    const double* m = d + (t / per) * per;
    const int i = (int)((t % per) / cohorts), j = (int)(t % cohorts);
    if (i == j) { out[t] = nan(""); return; }
    const int a = i < j ? i : j, b = i < j ? j : i;
    const double d_aa = m[a * cohorts + a], d_bb = m[b * cohorts + b], d_ab = m[a * cohorts + b];
    if (nei) {
        const double den = d_aa + 2.0 * d_ab + d_bb;
        out[t] = 1.0 - (2.0 * (d_aa + d_bb) / (den != 0.0 ? den : nan("")));
    } else {
        out[t] = 1.0 - ((d_aa + d_bb) / 2.0) / (d_ab != 0.0 ? d_ab : nan(""));
    }
}
