// Blosc (and HDF5) unshuffle over a batch of units. A unit is one row of `units`:
// (src offset, dst offset, nbytes, typesize), offsets in bytes from `src` and `dst`.
// blockIdx.y walks the units, blockIdx.x and threadIdx.x the work inside a unit.
// The NumPy twins in pipeline/kernels/shuffle.py do the same per unit.

#define UNIT_SRC(u) (units[4 * (u)])
#define UNIT_DST(u) (units[4 * (u) + 1])
#define UNIT_BYTES(u) (units[4 * (u) + 2])
#define UNIT_TYPESIZE(u) (units[4 * (u) + 3])

// bytes [from, nbytes) copied as they are, by the whole x-extent of the grid
__device__ __forceinline__ void copy_tail(const unsigned char* __restrict__ s, unsigned char* __restrict__ d,
                                          long long from, long long nbytes) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long k = from + (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nbytes; k += step) {
        d[k] = s[k];
    }
}

// Plain copies: each unit's nbytes from src + src offset to dst + dst offset (typesize unused).
extern "C" __global__ void pipeline_copy_units(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                               const long long* __restrict__ units, int nunits) {
    for (int u = blockIdx.y; u < nunits; u += gridDim.y) {
        copy_tail(src + UNIT_SRC(u), dst + UNIT_DST(u), 0, UNIT_BYTES(u));
    }
}

// Byte unshuffle: n = nbytes / typesize elements stored as typesize planes of n bytes;
// element i's byte j is plane j's byte i. The nbytes % typesize bytes left over follow the planes
// and are copied. A thread assembles one element and stores it whole where it is aligned.
extern "C" __global__ void pipeline_byte_unshuffle(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                                   const long long* __restrict__ units, int nunits) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (int u = blockIdx.y; u < nunits; u += gridDim.y) {
        const unsigned char* __restrict__ s = src + UNIT_SRC(u);
        unsigned char* __restrict__ d = dst + UNIT_DST(u);
        const long long nbytes = UNIT_BYTES(u);
        const int ts = (int)UNIT_TYPESIZE(u);
        const long long n = nbytes / ts;
        const bool aligned = ((unsigned long long)d % ts) == 0;
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
            if (ts == 4 && aligned) {
                ((unsigned int*)d)[i] = (unsigned int)s[i] | ((unsigned int)s[n + i] << 8) |
                                        ((unsigned int)s[2 * n + i] << 16) | ((unsigned int)s[3 * n + i] << 24);
            } else if (ts == 8 && aligned) {
                unsigned long long v = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) v |= (unsigned long long)s[j * n + i] << (8 * j);
                ((unsigned long long*)d)[i] = v;
            } else if (ts == 2 && aligned) {
                ((unsigned short*)d)[i] = (unsigned short)(s[i] | (s[n + i] << 8));
            } else {
                for (int j = 0; j < ts; ++j) d[i * ts + j] = s[j * n + i];
            }
        }
        copy_tail(s, d, n * ts, nbytes);
    }
}

// The 8 x 8 bit matrix of x (byte r, bit c) transposed to (byte c, bit r), as bitshuffle does.
__device__ __forceinline__ unsigned long long transpose_8x8(unsigned long long x) {
    unsigned long long t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
    x = x ^ t ^ (t << 28);
    return x;
}

// Bit unshuffle (Blosc's bitshuffle, format version 2): where n = nbytes / typesize is a
// multiple of 8, the first n * typesize bytes are 8 * typesize rows of n / 8 bytes, row
// (8 j + k) holding bit k of byte j of every element, element i at bit i % 8 of byte i / 8; the
// bytes left over are copied. Where n is not a multiple of 8 the unit was stored as it is.
// A thread takes byte j of 8 elements: it loads one byte of each of the 8 rows of byte j,
// transposes the 8 x 8 bits and stores byte j of the 8 elements.
extern "C" __global__ void pipeline_bit_unshuffle(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                                  const long long* __restrict__ units, int nunits) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (int u = blockIdx.y; u < nunits; u += gridDim.y) {
        const unsigned char* __restrict__ s = src + UNIT_SRC(u);
        unsigned char* __restrict__ d = dst + UNIT_DST(u);
        const long long nbytes = UNIT_BYTES(u);
        const int ts = (int)UNIT_TYPESIZE(u);
        const long long n = nbytes / ts;
        if (n % 8 != 0) {
            copy_tail(s, d, 0, nbytes);
            continue;
        }
        const long long rows = n / 8;  // bytes in one row of bits
        for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < rows * ts; t += step) {
            const long long j = t / rows, g = t % rows;
            unsigned long long x = 0;
#pragma unroll
            for (int k = 0; k < 8; ++k) x |= (unsigned long long)s[(j * 8 + k) * rows + g] << (8 * k);
            x = transpose_8x8(x);
#pragma unroll
            for (int m = 0; m < 8; ++m) d[(g * 8 + m) * ts + j] = (unsigned char)(x >> (8 * m));
        }
        copy_tail(s, d, n * ts, nbytes);
    }
}
