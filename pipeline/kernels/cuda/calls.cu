// Per-call values of genotype calls (a C-contiguous (calls, PLOIDY) array of integer alleles: -1
// missing, -2 fill): the count of each allele of each call (sgkit's count_call_alleles) and its
// frequency among the call's alleles (identity_by_state's), the count of its alternate alleles
// (count_call_alternate_alleles) and its genotype's index (convert_call_to_index). One module for the three, with the ploidy fixed, so that the loops over
// a call's alleles unroll. The Python twins: _call_alleles and call_genotype_index_cpu in
// pipeline/kernels/genotypes.py, make_call_count in pipeline/kernels/alternate.py.
//
// Each is memory-bound, a few bytes read and written a call. A thread takes UNROLL calls a grid's
// width apart (a warp's loads of one step are contiguous) and loads all of their alleles before it
// uses any (each_call), so that it has UNROLL * PLOIDY independent loads in flight rather than one.

typedef ${call_t} call_t;

#define PLOIDY ${ploidy}
#define UNROLL ${unroll}

// visit(i, a) for each call i of g (grid-stride), a its PLOIDY alleles (64-bit: any integer type
// compares exactly)
template <typename Visit>
__device__ __forceinline__ void each_call(const call_t* __restrict__ g, long long calls, Visit visit) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < calls; i += UNROLL * stride) {
        long long a[UNROLL][PLOIDY];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) a[u][k] = (long long)g[(i + u * stride) * PLOIDY + k];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) visit(i + u * stride, a[u]);
    }
    for (; i < calls; i += stride) {
        long long a[PLOIDY];
#pragma unroll
        for (int k = 0; k < PLOIDY; ++k) a[k] = (long long)g[i * PLOIDY + k];
        visit(i, a);
    }
}

// out (calls, alleles), uint8: for each allele j below `alleles`, how many of the call's alleles
// are j (a missing, fill or out-of-range allele counts nowhere); every count is written.
extern "C" __global__ void pipeline_call_allele_counts(const call_t* __restrict__ g, unsigned char* __restrict__ out,
                                                       long long calls, int alleles) {
    each_call(g, calls, [&](long long i, const long long* a) {
        unsigned char* o = out + i * alleles;
        for (int j = 0; j < alleles; ++j) {
            int n = 0;
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) n += a[k] == j;
            o[j] = (unsigned char)n;
        }
    });
}

// out (calls, alleles), double: for each allele j below `alleles`, how many of the call's alleles are
// j over how many are any of them (the identity by state's call allele frequencies); NaN (0 / 0)
// where none is. Every value is written.
extern "C" __global__ void pipeline_call_allele_frequencies(const call_t* __restrict__ g, double* __restrict__ out,
                                                            long long calls, int alleles) {
    each_call(g, calls, [&](long long i, const long long* a) {
        double* o = out + i * alleles;
        int total = 0;
        for (int j = 0; j < alleles; ++j) {
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) total += a[k] == j;
        }
        for (int j = 0; j < alleles; ++j) {
            int n = 0;
#pragma unroll
            for (int k = 0; k < PLOIDY; ++k) n += a[k] == j;
            o[j] = (double)n / (double)total;
        }
    });
}

// The same counts for int8 diploid calls of two alleles (VCF Zarr as bio2zarr writes it), read and
// written as 64-bit words of four calls (a word of counts for each word of calls: with two alleles
// a call's counts take its two bytes), UNROLL words a thread a grid's width apart. Where every
// byte of a word is 0, 1, -1 or -2, bit 0 of a byte and its sign (bit 1, as bits 1 to 7 are then
// equal) say what it is, and the counts are flags at bit 0 of each byte added by shifts (a few
// operations a word); a word holding any other byte is counted call by call. The calls past the
// last whole word: by the first thread. g and out at addresses that are multiples of 8.
#define LOWS 0x0101010101010101ull     // bit 0 of each byte
#define INNER 0x7E7E7E7E7E7E7E7Eull    // bits 1 to 6 of each byte
#define LOW_BYTES 0x00FF00FF00FF00FFull  // each call's first byte

__device__ __forceinline__ unsigned long long word_counts(unsigned long long x) {
    const unsigned long long y = x >> 1;
    if (((x ^ y) & INNER) == 0) {  // every byte 0, 1, -1 or -2
        const unsigned long long neg = y & LOWS, low = x & LOWS;
        const unsigned long long zeros = ~(neg | low) & LOWS, ones = low & ~neg;
        return ((zeros + (zeros >> 8)) & LOW_BYTES) | (((ones + (ones >> 8)) & LOW_BYTES) << 8);
    }
    unsigned long long out = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int a0 = (signed char)(x >> (16 * c)), a1 = (signed char)(x >> (16 * c + 8));
        out |= (unsigned long long)((a0 == 0) + (a1 == 0)) << (16 * c);
        out |= (unsigned long long)((a0 == 1) + (a1 == 1)) << (16 * c + 8);
    }
    return out;
}

extern "C" __global__ void pipeline_call_allele_counts_words(const signed char* __restrict__ g,
                                                             unsigned char* __restrict__ out, long long calls) {
    const unsigned long long* w = (const unsigned long long*)g;
    unsigned long long* o = (unsigned long long*)out;
    const long long words = calls / 4;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < words; i += UNROLL * stride) {
        unsigned long long x[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) x[u] = w[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) o[i + u * stride] = word_counts(x[u]);
    }
    for (; i < words; i += stride) o[i] = word_counts(w[i]);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (long long c = 4 * words; c < calls; ++c) {
            const int a0 = g[2 * c], a1 = g[2 * c + 1];
            out[2 * c] = (unsigned char)((a0 == 0) + (a1 == 0));
            out[2 * c + 1] = (unsigned char)((a0 == 1) + (a1 == 1));
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
    each_call(g, calls, [&](long long i, const long long* a) { out[i] = alternate(a, alleles); });
}

// The index of one call's genotype in VCF order (sgkit's convert_call_to_index), -1 where it is
// missing. BIALLELIC (two alleles): sgkit's biallelic_genotype_call_index, the sum of the alleles
// walked in the call's order, the first negative one ending it; else sorted_genotype_call_index,
// the sum over the sorted alleles a_(i) of C(a_(i) + i, i + 1), each allele's place in the sorted
// call found by counting (no sort in a thread), each binomial built a factor at a time (exact at
// every step). Where sgkit raises, -1 and a bit of `flags`: REFUSED_FILL for a fill value (-2,
// mixed ploidy), REFUSED_ABOVE_ONE for an allele above 1 with two alleles.
#define REFUSED_FILL 1u
#define REFUSED_ABOVE_ONE 2u

__device__ __forceinline__ long long genotype_index(const long long* a, int biallelic, unsigned int* flags) {
    long long index = 0;
    if (biallelic) {
        for (int k = 0; k < PLOIDY; ++k) {
            if (a[k] < 0) {
                if (a[k] < -1) *flags |= REFUSED_FILL;
                return -1;
            }
            if (a[k] > 1) {
                *flags |= REFUSED_ABOVE_ONE;
                return -1;
            }
            index += a[k];
        }
        return index;
    }
    long long low = a[0];
#pragma unroll
    for (int k = 1; k < PLOIDY; ++k) low = a[k] < low ? a[k] : low;
    if (low < -1) *flags |= REFUSED_FILL;
    if (low < 0) return -1;
#pragma unroll
    for (int k = 0; k < PLOIDY; ++k) {
        int place = 0;
#pragma unroll
        for (int m = 0; m < PLOIDY; ++m) place += a[m] < a[k] || (a[m] == a[k] && m < k);
        long long r = 1;
        for (int d = 1; d <= place + 1; ++d) r = r * (a[k] - 1 + d) / d;
        index += r;
    }
    return index;
}

// out (calls), int64: each call's genotype index; `refused` (one word) gets the flags of the calls
// sgkit raises on, OR-ed once a thread.
extern "C" __global__ void pipeline_call_genotype_index(const call_t* __restrict__ g, long long* __restrict__ out,
                                                        long long calls, int biallelic, unsigned int* refused) {
    unsigned int flags = 0;
    each_call(g, calls, [&](long long i, const long long* a) { out[i] = genotype_index(a, biallelic, &flags); });
    if (flags) atomicOr(refused, flags);
}
