// The two sums of adler32 for `count` rows of `nb` bytes, row r at dst + r * step:
// A = sum(d_i), B = sum((nb - i) d_i), both mod 65521 (adler32 = ((B + nb) % 65521) << 16 | (A + 1) % 65521).
// One block of 256 threads a row (blockIdx.x walks the rows); each thread keeps its partial sums
// mod 65521, so nothing overflows whatever the row's length. The NumPy twin is
// pipeline/kernels/checksum.py:adler_sums_cpu.

#define ADLER_MOD 65521ULL

extern "C" __global__ void pipeline_adler_sums(const unsigned char* __restrict__ dst, long long step, long long nb,
                                               long long count, long long* __restrict__ sums) {
    __shared__ unsigned long long sa[256];
    __shared__ unsigned long long sb[256];
    for (long long row = blockIdx.x; row < count; row += gridDim.x) {
        const unsigned char* d = dst + row * step;
        unsigned long long a = 0, b = 0;
        for (long long i = threadIdx.x; i < nb; i += blockDim.x) {
            unsigned long long v = d[i];
            a += v;
            b += v * ((unsigned long long)(nb - i) % ADLER_MOD);
            if ((i / blockDim.x) % 4096 == 4095) {  // keep the partials small
                a %= ADLER_MOD;
                b %= ADLER_MOD;
            }
        }
        sa[threadIdx.x] = a % ADLER_MOD;
        sb[threadIdx.x] = b % ADLER_MOD;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                sa[threadIdx.x] = (sa[threadIdx.x] + sa[threadIdx.x + s]) % ADLER_MOD;
                sb[threadIdx.x] = (sb[threadIdx.x] + sb[threadIdx.x + s]) % ADLER_MOD;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            sums[row] = (long long)sa[0];
            sums[count + row] = (long long)sb[0];
        }
        __syncthreads();
    }
}
