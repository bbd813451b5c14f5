// popgen on the GPU, one module (a fresh machine compiles it once): allele counts by cohort from
// the calls; sgkit's per-variant diversity and divergence terms from those counts; sums over
// windows of variants; Fst from divergence. The terms, sums and Fst take a thread an output value,
// each the operations of the array formulas and loops in pipeline/kernels/popgen.py (their CPU
// twins) in their order, compiled with --fmad=false. The counts are integers, exact in float64, so
// every numerator and denominator is exact and each ratio the same correctly rounded value.

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

// --- allele counts by cohort, and sums over windows of variants ---------------------------------------

typedef ${call_t} call_t;

#define COHORT_THREADS 128  // popgen.COHORT_THREADS
#define COHORT_UNROLL 4     // samples a thread has in flight
#define COHORT_BINS 48      // popgen.BINS: (cohort, allele) bins of the histogram, 24 KiB of int32

// g (variants, samples, ploidy) calls, cohort (samples) -> out (variants, cohorts, alleles), zeroed:
// the counts of cohorts c0 on (as many as the histogram holds). A block of COHORT_THREADS counts
// one variant's calls in a tile of per_tile samples, a warp on neighbouring samples. Counts go to a
// histogram in shared memory with a column per thread (bin b of thread t at b * THREADS + t): no
// atomics and no bank conflicts while counting; the columns are added up at the end (each thread
// starting at its own column, so a warp reads 32 banks) and added into out, which the blocks of a
// variant share. Negative alleles and cohorts, and alleles past the alleles dimension, are not
// counted.
extern "C" __global__ void __launch_bounds__(COHORT_THREADS)
pipeline_cohort_counts(const call_t* __restrict__ g, const long long* __restrict__ cohort,
                       unsigned long long* __restrict__ out, long long samples, int ploidy, int cohorts,
                       int alleles, int c0, long long tiles, long long per_tile) {
    __shared__ int hist[COHORT_BINS * COHORT_THREADS];
    const int t = threadIdx.x;
    const int fit = COHORT_BINS / alleles;
    const int bins = (cohorts - c0 < fit ? cohorts - c0 : fit) * alleles;
    for (int b = 0; b < bins; ++b) hist[b * COHORT_THREADS + t] = 0;
    const long long v = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const long long s_end = samples < (tile + 1) * per_tile ? samples : (tile + 1) * per_tile;
    const call_t* row = g + v * samples * ploidy;
    for (long long s = tile * per_tile + t; s < s_end; s += COHORT_UNROLL * COHORT_THREADS) {
        int k[COHORT_UNROLL];  // each sample's first bin (allele 0), or -1
#pragma unroll
        for (int u = 0; u < COHORT_UNROLL; ++u) {
            const long long su = s + u * COHORT_THREADS;
            const long long c = su < s_end ? cohort[su] - c0 : -1;
            k[u] = (c >= 0 && c * alleles < bins) ? (int)c * alleles : -1;
        }
        for (int p = 0; p < ploidy; ++p) {
            long long a[COHORT_UNROLL];
#pragma unroll
            for (int u = 0; u < COHORT_UNROLL; ++u)
                a[u] = k[u] >= 0 ? (long long)row[(s + u * COHORT_THREADS) * ploidy + p] : -1;
#pragma unroll
            for (int u = 0; u < COHORT_UNROLL; ++u)
                if (a[u] >= 0 && a[u] < alleles) hist[(k[u] + (int)a[u]) * COHORT_THREADS + t] += 1;
        }
    }
    __syncthreads();
    for (int b = t; b < bins; b += COHORT_THREADS) {
        unsigned long long total = 0;
        for (int j = 0; j < COHORT_THREADS; ++j) total += hist[b * COHORT_THREADS + (t + j) % COHORT_THREADS];
        if (total) atomicAdd(out + (v * cohorts + c0 + b / alleles) * alleles + b % alleles, total);
    }
}

// x (rows, cols) -> out (windows, cols): the sum of x's rows starts[w] <= i < stops[w] (row numbers
// of the block, cut to it), added in order as NumPy's sum(axis=0) over a window in sgkit's
// window_statistic; a thread a window and column, neighbouring threads on neighbouring columns
extern "C" __global__ void pipeline_window_sum(const double* __restrict__ x, const long long* __restrict__ starts,
                                               const long long* __restrict__ stops, double* __restrict__ out,
                                               long long windows, long long cols) {
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= windows * cols) return;
    const long long w = k / cols, j = k % cols;
    double acc = 0.0;
    for (long long i = starts[w]; i < stops[w]; ++i) acc += x[i * cols + j];
    out[k] = acc;
}

// --- Garud's H: each haplotype's hash, prefix sums over variants ------------------------------------

#define HASH_UNROLL 8  // variants a thread has in flight

// g (variants, haplotypes) calls, w (variants) each variant's weight (33^-i mod 2^64), rels (n_rels)
// increasing row numbers of the block (0 to variants) -> out (n_rels, haplotypes): sum over i <
// rels[k] of uint64(int64(g[i, h])) * w[i], modulo 2^64 (sgkit's haplotype hash is linear in these
// terms: ops/genomics/popgen.py). A thread a haplotype, neighbouring threads on neighbouring
// haplotypes (a warp's loads of a variant are contiguous), HASH_UNROLL loads in flight. The twin:
// hash_prefix_cpu in pipeline/kernels/popgen.py; unsigned arithmetic wraps there as here, so the
// sums are equal bit for bit.
extern "C" __global__ void pipeline_hash_prefix(const call_t* __restrict__ g, const unsigned long long* __restrict__ w,
                                                const long long* __restrict__ rels, unsigned long long* __restrict__ out,
                                                long long haplotypes, int n_rels) {
    const long long h = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= haplotypes) return;
    unsigned long long acc = 0;
    long long i = 0;
    for (int k = 0; k < n_rels; ++k) {
        const long long stop = rels[k];
        for (; i + HASH_UNROLL <= stop; i += HASH_UNROLL) {
            long long a[HASH_UNROLL];
#pragma unroll
            for (int u = 0; u < HASH_UNROLL; ++u) a[u] = (long long)g[(i + u) * haplotypes + h];
#pragma unroll
            for (int u = 0; u < HASH_UNROLL; ++u) acc += (unsigned long long)a[u] * w[i + u];
        }
        for (; i < stop; ++i) acc += (unsigned long long)(long long)g[i * haplotypes + h] * w[i];
        out[k * haplotypes + h] = acc;
    }
}
