// Per-call counts of genotype calls (a C-contiguous (calls, PLOIDY) array of integer alleles: -1
// missing, -2 fill): the count of each allele of each call (sgkit's count_call_alleles) and the
// count of its alternate alleles (count_call_alternate_alleles). One module for both, with the
// ploidy fixed, so that the loop over a call's alleles unrolls.
// The Python twins: _call_alleles in pipeline/kernels/genotypes.py, make_call_count in
// pipeline/kernels/alternate.py (their CPU loops).
//
// Both are memory-bound, a few bytes read and written a call. A thread takes UNROLL calls a grid's
// width apart (a warp's loads of one step are contiguous) and loads all of their alleles before it
// writes any count, so that it has UNROLL * PLOIDY independent loads in flight rather than one.

typedef ${call_t} call_t;

#define PLOIDY ${ploidy}
#define UNROLL ${unroll}

// out (calls, alleles), uint8: for each allele j below `alleles`, how many of the call's alleles
// are j (a missing, fill or out-of-range allele counts nowhere); every count is written.
extern "C" __global__ void pipeline_call_allele_counts(const call_t* __restrict__ g, unsigned char* __restrict__ out,
                                                       long long calls, int alleles) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < calls; i += UNROLL * stride) {
        long long a[UNROLL][PLOIDY];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) a[u][k] = (long long)g[(i + u * stride) * PLOIDY + k];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            unsigned char* o = out + (i + u * stride) * alleles;
            for (int j = 0; j < alleles; ++j) {
                int n = 0;
#pragma unroll
                for (int k = 0; k < PLOIDY; ++k) n += a[u][k] == j;
                o[j] = (unsigned char)n;
            }
        }
    }
    for (; i < calls; i += stride) {
        unsigned char* o = out + i * alleles;
        for (int j = 0; j < alleles; ++j) {
            int n = 0;
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) n += (long long)g[i * PLOIDY + k] == j;
            o[j] = (unsigned char)n;
        }
    }
}

// The alternate alleles of one call: those in [1, alleles), or -1 where any allele is negative.
__device__ __forceinline__ short alternate(const long long* a, long long alleles) {
    int n = 0;
    bool missing = false;
#pragma unroll
    for (int k = 0; k < PLOIDY; ++k) {
        missing |= a[k] < 0;
        n += a[k] >= 1 && a[k] < alleles;
    }
    return missing ? (short)-1 : (short)n;
}

// out (calls), int16: the alternate alleles of each call (`alleles`: the alleles dimension's
// length; alleles from it on are not counted).
extern "C" __global__ void pipeline_alternate_counts(const call_t* __restrict__ g, short* __restrict__ out,
                                                     long long calls, long long alleles) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < calls; i += UNROLL * stride) {
        long long a[UNROLL][PLOIDY];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) a[u][k] = (long long)g[(i + u * stride) * PLOIDY + k];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) out[i + u * stride] = alternate(a[u], alleles);
    }
    for (; i < calls; i += stride) {
        long long a[PLOIDY];
#pragma unroll
        for (int k = 0; k < PLOIDY; ++k) a[k] = (long long)g[i * PLOIDY + k];
        out[i] = alternate(a, alleles);
    }
}
