// sgkit's diploid genedrop (simulate_genedrop, method "diploid"): each variant's founders' alleles
// dropped through the pedigree at random, a thread a variant. genotypes and out (variants, samples, 2),
// C-contiguous; parent (samples, 2) int64, -1 (any negative) for an unknown parent; order (samples)
// int64, the samples with every parent before its children (ops/genomics/pedigree.py's
// topological_argsort); seeds (variants) uint32. The Python twin: _genedrop_diploid_loop in
// pipeline/kernels/pedigree.py, a Numba loop.
//
// A variant's draws are those of Numba's generator seeded with its seed, reproduced here: the
// Mersenne Twister (MT19937) as numba/_random.c seeds it (numba_rnd_init: Knuth's initialisation,
// the first draw twists all 624 words) and draws from it (get_next_int32's tempering), and
// np.random.randint(2) in Numba's NumPy mode, the low bit of one 32-bit draw (never rejected). So
// out is bit for bit the Numba loop's, and sgkit's. The 624 words of a thread's state are in local
// memory (2.5 KiB a thread, interleaved across a warp's threads by the compiler); parent and order
// are read alike by every thread of a warp.
//
// A sample with one known parent (a half-founder) sets *half_founders and ends the thread: the host
// raises sgkit's error, the output being discarded. Every other call of out is written.

typedef ${call_t} call_t;

#define MT_N 624
#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER_MASK 0x80000000u
#define MT_LOWER_MASK 0x7fffffffu

__device__ __forceinline__ unsigned int mt_mix(unsigned int a, unsigned int b, unsigned int far) {
    const unsigned int y = (a & MT_UPPER_MASK) | (b & MT_LOWER_MASK);
    return far ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
}

// numba_rnd_shuffle: the next 624 words, in place
__device__ void mt_twist(unsigned int* mt) {
    int i = 0;
    for (; i < MT_N - MT_M; ++i) mt[i] = mt_mix(mt[i], mt[i + 1], mt[i + MT_M]);
    for (; i < MT_N - 1; ++i) mt[i] = mt_mix(mt[i], mt[i + 1], mt[i + (MT_M - MT_N)]);
    mt[MT_N - 1] = mt_mix(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
}

// get_next_int32: the next word, tempered
__device__ __forceinline__ unsigned int mt_next(unsigned int* mt, int& index) {
    if (index >= MT_N) {
        mt_twist(mt);
        index = 0;
    }
    unsigned int y = mt[index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

extern "C" __global__ void pipeline_genedrop_diploid(const call_t* __restrict__ genotypes, call_t* out,
                                                     const long long* __restrict__ parent,
                                                     const long long* __restrict__ order,
                                                     const unsigned int* __restrict__ seeds, long long variants,
                                                     long long samples, int* half_founders) {
    const long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= variants) return;
    unsigned int mt[MT_N];
    unsigned int s = seeds[v];
    for (int pos = 0; pos < MT_N; ++pos) {  // numba_rnd_init
        mt[pos] = s;
        s = 1812433253u * (s ^ (s >> 30)) + (unsigned int)pos + 1u;
    }
    int index = MT_N;
    const call_t* g = genotypes + v * samples * 2;
    call_t* o = out + v * samples * 2;
    for (long long i = 0; i < samples; ++i) {
        const long long t = order[i];
        const long long p = parent[2 * t], q = parent[2 * t + 1];
        if ((p < 0) != (q < 0)) {
            *half_founders = 1;
            return;
        }
        if (p < 0) {
            o[2 * t] = g[2 * t];
            o[2 * t + 1] = g[2 * t + 1];
        } else {  // the first parent's draw, then the second's
            const call_t a = o[2 * p + (mt_next(mt, index) & 1u)];
            o[2 * t] = a;
            o[2 * t + 1] = o[2 * q + (mt_next(mt, index) & 1u)];
        }
    }
}
