// Counts of diploid int8 genotype calls of two alleles (VCF Zarr's call_genotype as bio2zarr
// writes it), read 32 bits (two calls) at a time, and the Hardy-Weinberg exact test.
// The Python twins in pipeline/kernels/genotypes.py: word_flags (the bit operations, on NumPy
// words), make_call_counters and _tally_genotype (the per-call rules), _hwe_p_value (the test).
//
// A call is two bytes (its alleles). Where every byte of a 32-bit word is 0, 1, -1 or -2, two bits
// of a byte say what it is: bit 0 (1 for allele 1 and for -1) and bit 1 (1 for -1 and -2, the
// sign). The counts are then flags at bit 0 of each byte (alleles) or of each call's first byte
// (calls), added into the 8- or 16-bit lanes of a register (a count a lane) and summed across
// lanes every LANE_UNITS units. Any other byte (an allele of 2 or more, a value below -2) sends
// the word's two calls to the per-call rules. The flags of a word take eleven three-input logic
// operations and shifts; its counts one addition each for two words.

typedef unsigned int u32;
typedef unsigned long long u64;

#define U ${unroll}                   // 16-byte units a thread of the per-variant kernels loads before it counts any
#define SU ${sample_unroll}           // the same for the per-sample kernel (rows)
#define RUN ((64 - U) / U)            // unrolled steps between two sums of the lanes: at most 63 units,
                                      // so that an 8-bit lane (at most 4 a unit) does not overflow
#define LOWS 0x01010101u              // bit 0 of each byte
#define CALLS 0x00010001u             // bit 0 of each call's first byte
#define INNER 0x7E7E7E7Eu             // bits 1 to 6 of each byte

// Counts kept by a thread: lanes (u32, by bit operations) and totals (64-bit, the per-call path
// and the lanes' sums). Kind 0, the call counts: hom ref, hom alt, called, allele 0, allele 1.
// Kind 1, the genotype counts: 0/0, 1/1, counted (0/0, 0/1 or 1/1), refused (sgkit raises).
// Kind 2, the per-sample call counts: hom ref, hom alt, called (count_call: the rules of kind 0).
// Heterozygous calls (0/1) are the called (counted) less both homozygous.
#define NC 5

// Whether the word x has a byte other than 0, 1, -1 and -2 (bits 1 to 7 of a byte not all equal),
// OR-ed over several words before the test: (x ^ (x >> 1)) & INNER.
__device__ __forceinline__ u32 odd_bits(u32 x) { return x ^ (x >> 1); }

// The flags of the two calls of a word of 0, 1, -1 and -2, at bits AT and AT + 16 (AT 0: each
// call's first byte; AT 8: its second): hom ref, hom alt, called (0/0, 0/1 or 1/1).
template <int AT>
__device__ __forceinline__ void call_flags(u32 x, u32* flags) {
    const u32 m = CALLS << AT;
    const u32 s = AT == 0 ? x >> 8 : x << 8;  // at bit AT: the call's other byte's bits 0 and 1
    const u32 u = x | s;    // bit AT: either allele has bit 0; bit AT + 1: either is negative
    const u32 u1 = u >> 1;  // bit AT: either allele negative (the call is not called)
    flags[0] = ~(u | u1) & m;    // 0/0
    flags[1] = x & s & ~u1 & m;  // 1/1
    flags[2] = ~u1 & m;          // called
}

// The flags of a word of 0, 1, -1 and -2, added to the lanes (kinds 0 and 1).
template <int KIND>
__device__ __forceinline__ void count_fast(u32 x, u32* lanes) {
    u32 f[3];
    call_flags<0>(x, f);
    lanes[0] += f[0];
    lanes[1] += f[1];
    lanes[2] += f[2];
    const u32 y = x >> 1;  // bit 0 of a byte: its sign
    if (KIND == 0) {
        lanes[3] += ~(x | y) & LOWS;  // alleles 0
        lanes[4] += x & ~y & LOWS;    // alleles 1
    } else {
        // refused: a first allele of -2, or a first allele of 0 or 1 and a second of -2
        const u32 s = x >> 8, t = x >> 9;  // at a call's first byte: its second byte's bit 0, sign
        lanes[3] += ((y & ~x) | (~y & t & ~s)) & CALLS;
    }
}

// A step of sgkit's _biallelic_genotype_index: the index so far (0, 1, or -1 missing, -2 refused)
// and the call's next allele.
__device__ __forceinline__ int genotype_step(int index, int a) {
    if (index < 0) return index;
    if (a < 0) return a == -1 ? -1 : -2;
    return a > 1 ? -2 : index + a;
}

// One call (a0, a1) by the per-call rules, into the totals.
template <int KIND>
__device__ __forceinline__ void count_call(int a0, int a1, long long* totals) {
    if (KIND != 1) {  // sgkit's classes (_classify_hom) and count_alleles
        if (a0 >= 0 && a1 >= 0) {
            totals[2] += 1;
            if (a0 == a1) {  // (each index written out: an index from the data would put totals in memory)
                if (a0 == 0) totals[0] += 1;
                else totals[1] += 1;
            }
        }
        totals[3] += (a0 == 0) + (a1 == 0);
        totals[4] += (a0 == 1) + (a1 == 1);
    } else {  // sgkit's _biallelic_genotype_index, the alleles in the call's order
        const int index = genotype_step(genotype_step(0, a0), a1);
        if (index >= 0) {
            totals[2] += 1;
            if (index == 0) totals[0] += 1;
            if (index == 2) totals[1] += 1;
        } else if (index == -2) {
            totals[3] += 1;
        }
    }
}

// A word whose bytes may be anything: by bit operations, or call by call.
template <int KIND>
__device__ __forceinline__ void count_checked(u32 x, u32* lanes, long long* totals) {
    if ((odd_bits(x) & INNER) == 0) {
        count_fast<KIND>(x, lanes);
    } else {
        count_call<KIND>((signed char)(x & 0xFF), (signed char)((x >> 8) & 0xFF), totals);
        count_call<KIND>((signed char)((x >> 16) & 0xFF), (signed char)(x >> 24), totals);
    }
}

// The lanes' counts into the totals: bytes (alleles) or 16-bit halves (calls).
template <int KIND>
__device__ __forceinline__ void sum_lanes(u32* lanes, long long* totals) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        u32 v = lanes[c];
        if (KIND == 0 && c >= 3) v = (v & 0x00FF00FFu) + ((v >> 8) & 0x00FF00FFu);
        totals[c] += (long long)((v & 0xFFFFu) + (v >> 16));
        lanes[c] = 0;
    }
}

// Per variant: a row of blockDim.x threads (a power of two up to 32) a variant, blockDim.y rows a
// block. A row's bytes [b0, b1) are read as the 16-byte units of the block's memory that lie
// wholly inside it (aligned loads; a row of a number of samples not a multiple of 8 starts and
// ends mid-unit), in tiles of `tile` units (blockIdx.y); the calls of its first and last partial
// units by the per-call rules (thread 0 of tile 0). The row's counts are summed by warp shuffles
// and added to out (nv, 5 or 4) once a tile.
template <int KIND>
__device__ void word_rows(const signed char* __restrict__ g, long long nv, long long row_bytes, long long tile,
                          long long* __restrict__ out) {
    const int tx = blockDim.x;
    const long long v = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const long long shift = (long long)((u64)g & 15);  // g's bytes from the 16-byte boundary below it
    const uint4* __restrict__ units = (const uint4*)(g - shift);
    u32 lanes[NC];
    long long totals[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) { lanes[c] = 0; totals[c] = 0; }
    if (v < nv) {
        const long long b0 = shift + v * row_bytes, b1 = b0 + row_bytes;  // from `units`
        const long long f0 = (b0 + 15) >> 4, f1 = b1 >> 4;  // the whole units
        const long long t0 = f0 + (long long)blockIdx.y * tile;
        const long long t1 = min(f1, t0 + tile);
        long long p = t0 + threadIdx.x;
        while (p < t1) {
            for (int r = 0; r < RUN && p + (U - 1) * tx < t1; ++r, p += U * tx) {
                uint4 w[U];
#pragma unroll
                for (int i = 0; i < U; ++i) w[i] = units[p + i * tx];  // every load of the step first
                u32 odd = 0;
#pragma unroll
                for (int i = 0; i < U; ++i) odd |= odd_bits(w[i].x) | odd_bits(w[i].y) | odd_bits(w[i].z) | odd_bits(w[i].w);
                if ((odd & INNER) == 0) {
#pragma unroll
                    for (int i = 0; i < U; ++i) {
                        count_fast<KIND>(w[i].x, lanes);
                        count_fast<KIND>(w[i].y, lanes);
                        count_fast<KIND>(w[i].z, lanes);
                        count_fast<KIND>(w[i].w, lanes);
                    }
                } else {  // (rare; unrolled as well: an index into w would put it in memory)
#pragma unroll
                    for (int i = 0; i < U; ++i) {
                        count_checked<KIND>(w[i].x, lanes, totals);
                        count_checked<KIND>(w[i].y, lanes, totals);
                        count_checked<KIND>(w[i].z, lanes, totals);
                        count_checked<KIND>(w[i].w, lanes, totals);
                    }
                }
            }
            if (p + (U - 1) * tx >= t1) {  // the tile's last units, fewer than a step
                for (; p < t1; p += tx) {
                    const uint4 w = units[p];
                    count_checked<KIND>(w.x, lanes, totals);
                    count_checked<KIND>(w.y, lanes, totals);
                    count_checked<KIND>(w.z, lanes, totals);
                    count_checked<KIND>(w.w, lanes, totals);
                }
            }
            sum_lanes<KIND>(lanes, totals);
        }
        if (blockIdx.y == 0 && threadIdx.x == 0) {  // the calls outside the whole units
            const signed char* row = g - shift;
            const long long head = f0 < f1 ? 16 * f0 : b1;
            for (long long b = b0; b < head; b += 2) count_call<KIND>(row[b], row[b + 1], totals);
            for (long long b = f0 < f1 ? 16 * f1 : b1; b < b1; b += 2) count_call<KIND>(row[b], row[b + 1], totals);
        }
    }
    // out's columns: kind 0 hom ref, hom alt, het, allele 0, allele 1; kind 1 0/0, 0/1, 1/1, refused
    long long values[NC];
    values[0] = totals[0];
    values[1] = KIND == 0 ? totals[1] : totals[2] - totals[0] - totals[1];
    values[2] = KIND == 0 ? totals[2] - totals[0] - totals[1] : totals[1];
    values[3] = totals[3];
    values[4] = totals[4];
    const int n_out = KIND == 0 ? 5 : 4;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        if (c >= n_out) break;
        long long value = values[c];
        for (int step = tx / 2; step > 0; step /= 2) value += __shfl_down_sync(0xFFFFFFFFu, value, step, tx);
        if (threadIdx.x == 0 && v < nv && value != 0) atomicAdd((u64*)&out[v * n_out + c], (u64)value);
    }
}

extern "C" __global__ void pipeline_word_call_rows(const signed char* __restrict__ g, long long nv, long long row_bytes,
                                                   long long tile, long long* __restrict__ out) {
    word_rows<0>(g, nv, row_bytes, tile, out);
}

extern "C" __global__ void pipeline_word_genotype_rows(const signed char* __restrict__ g, long long nv,
                                                       long long row_bytes, long long tile, long long* __restrict__ out) {
    word_rows<1>(g, nv, row_bytes, tile, out);
}

// The 16 bytes at byte o of `units` (a 16-byte aligned base), from one aligned unit, or two
// joined (`second`: the bytes reach into the next unit; o % 16 is even, as calls are 2 bytes).
__device__ __forceinline__ u32 fs(u32 lo, u32 hi, int shift) { return __funnelshift_r(lo, hi, shift); }
__device__ __forceinline__ uint4 load_unit(const uint4* __restrict__ units, long long o, bool second) {
    const uint4 a = units[o >> 4];
    const int r = (int)(o & 15);
    if (r == 0) return a;
    const uint4 b = second ? units[(o >> 4) + 1] : make_uint4(~0u, ~0u, ~0u, ~0u);
    const int sh = 8 * (r & 3);
    switch (r >> 2) {  // (each case by name: an index into the eight words would put them in memory)
        case 0: return make_uint4(fs(a.x, a.y, sh), fs(a.y, a.z, sh), fs(a.z, a.w, sh), fs(a.w, b.x, sh));
        case 1: return make_uint4(fs(a.y, a.z, sh), fs(a.z, a.w, sh), fs(a.w, b.x, sh), fs(b.x, b.y, sh));
        case 2: return make_uint4(fs(a.z, a.w, sh), fs(a.w, b.x, sh), fs(b.x, b.y, sh), fs(b.y, b.z, sh));
        default: return make_uint4(fs(a.w, b.x, sh), fs(b.x, b.y, sh), fs(b.y, b.z, sh), fs(b.z, b.w, sh));
    }
}

// Per sample: a thread 16 bytes of a row (eight samples) and a tile of `vtile` variants (at most
// 65535), SU variants loaded at a time. The flags of the two calls of a word are at bits 0 and 16,
// those of the next word at bits 8 and 24 (call_flags<8>), so that one addition counts four
// samples in 8-bit lanes (summed into 16-bit lanes every 255 variants at most). Rows whose bytes
// are not at a multiple of 16 (samples not a multiple of 8, or a block at such an address) are
// joined from two aligned units; the bytes past a row's end read as -1 (missing).
// out (ns, 3): hom ref, hom alt, het, added once a tile.
extern "C" __global__ void pipeline_word_samples(const signed char* __restrict__ g, long long nv, long long ns,
                                                 long long vtile, long long* __restrict__ out) {
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row_bytes = 2 * ns;
    if (16 * k >= row_bytes) return;
    const int nbytes = (int)min(16ll, row_bytes - 16 * k);
    uint4 pad;  // -1 in the bytes past the row's end
    {
        u32 p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = min(max(nbytes - 4 * i, 0), 4);
            p[i] = n == 4 ? 0u : ~0u << (8 * n);
        }
        pad = make_uint4(p[0], p[1], p[2], p[3]);
    }
    const long long shift = (long long)((u64)g & 15);
    const uint4* __restrict__ units = (const uint4*)(g - shift);
    const bool aligned = shift == 0 && (row_bytes & 15) == 0;  // every load one unit
    u32 lanes[2][3];   // 8-bit lanes: samples 4a, 4a + 2, 4a + 1, 4a + 3 at bits 0, 8, 16, 24
    u32 lo16[2][3], hi16[2][3];  // 16-bit lanes: samples 4a, 4a + 1 (lo16) and 4a + 2, 4a + 3 (hi16)
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int c = 0; c < 3; ++c) { lanes[a][c] = 0; lo16[a][c] = 0; hi16[a][c] = 0; }
    long long v = (long long)blockIdx.y * vtile;
    const long long v1 = min(nv, v + vtile);
    while (v < v1) {
        const long long vend = min(v1, v + SU * (255 / SU));
        for (; v < vend; v += SU) {
            uint4 w[SU];
#pragma unroll
            for (int i = 0; i < SU; ++i) {  // every load of the step first
                const long long o = shift + (v + i) * row_bytes + 16 * k;
                if (v + i >= vend) w[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
                else if (aligned) w[i] = units[o >> 4];
                else w[i] = load_unit(units, o, (int)(o & 15) + nbytes > 16);
            }
            u32 odd = 0;
#pragma unroll
            for (int i = 0; i < SU; ++i) {
                if (!aligned) { w[i].x |= pad.x; w[i].y |= pad.y; w[i].z |= pad.z; w[i].w |= pad.w; }
                odd |= odd_bits(w[i].x) | odd_bits(w[i].y) | odd_bits(w[i].z) | odd_bits(w[i].w);
            }
            if ((odd & INNER) == 0) {
#pragma unroll
                for (int i = 0; i < SU; ++i) {
                    u32 f0[3], f1[3];
                    call_flags<0>(w[i].x, f0); call_flags<8>(w[i].y, f1);
#pragma unroll
                    for (int c = 0; c < 3; ++c) lanes[0][c] += f0[c] + f1[c];
                    call_flags<0>(w[i].z, f0); call_flags<8>(w[i].w, f1);
#pragma unroll
                    for (int c = 0; c < 3; ++c) lanes[1][c] += f0[c] + f1[c];
                }
            } else {  // (rare; unrolled as well: an index into w would put it in memory)
#pragma unroll
                for (int i = 0; i < SU; ++i) {
                    const u32 x[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
                    for (int q = 0; q < 4; ++q) {  // word q: samples 2q, 2q + 1
                        const int a = q >> 1;
                        if ((odd_bits(x[q]) & INNER) == 0) {
                            u32 f[3];
                            if (q & 1) call_flags<8>(x[q], f); else call_flags<0>(x[q], f);
#pragma unroll
                            for (int c = 0; c < 3; ++c) lanes[a][c] += f[c];
                        } else {
#pragma unroll
                            for (int j = 0; j < 2; ++j) {  // into the sample's 16-bit lane
                                long long t[NC] = {0, 0, 0, 0, 0};
                                count_call<2>((signed char)((x[q] >> (16 * j)) & 0xFF),
                                              (signed char)((x[q] >> (16 * j + 8)) & 0xFF), t);
                                const u32 one = 1u << (16 * j);
#pragma unroll
                                for (int c = 0; c < 3; ++c) {
                                    const u32 add = t[c] ? one : 0u;
                                    if (q & 1) hi16[a][c] += add; else lo16[a][c] += add;
                                }
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int c = 0; c < 3; ++c) {
                lo16[a][c] += lanes[a][c] & 0x00FF00FFu;
                hi16[a][c] += (lanes[a][c] >> 8) & 0x00FF00FFu;
                lanes[a][c] = 0;
            }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const long long s = 8 * k + j;
        if (s >= ns) break;
        const int a = j >> 2, at = 16 * (j & 1);
        long long n[3];
#pragma unroll
        for (int c = 0; c < 3; ++c) n[c] = (long long)((((j & 2) ? hi16[a][c] : lo16[a][c]) >> at) & 0xFFFFu);
        const long long values[3] = {n[0], n[1], n[2] - n[0] - n[1]};
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            if (values[c] != 0) atomicAdd((u64*)&out[s * 3 + c], (u64)values[c]);
        }
    }
}

// The Hardy-Weinberg exact test (Wigginton et al. 2005) as sgkit's hardy_weinberg_p_value computes
// it, operation for operation as _hwe_p_value in genotypes.py (compiled with --fmad=false: the same
// bits as the CPU twin). The distribution of heterozygote counts is computed twice rather than
// kept (a thread cannot hold sgkit's array of 2n + 1): for its sum, then for the p-value.
__device__ double hwe_p_value(long long obs_hets, long long obs_hom1, long long obs_hom2) {
    const long long obs_homc = obs_hom1 < obs_hom2 ? obs_hom2 : obs_hom1;
    const long long obs_homr = obs_hom1 < obs_hom2 ? obs_hom1 : obs_hom2;
    const long long obs_mac = 2 * obs_homr + obs_hets;
    const long long obs_n = obs_hets + obs_homc + obs_homr;
    if (obs_n == 0) return nan("");
    long long mid = (long long)((double)(obs_mac * (2 * obs_n - obs_mac)) / (double)(2 * obs_n));
    if ((obs_mac & 1) ^ (mid & 1)) mid += 1;
    double prob_sum = 1.0;
    double target = obs_hets == mid ? 1.0 : 0.0;
    double p = 1.0;
    long long hets = mid, homr = (obs_mac - mid) / 2, homc = obs_n - hets - homr;
    while (hets > 1) {
        p = p * (double)hets * ((double)hets - 1.0) / (4.0 * ((double)homr + 1.0) * ((double)homc + 1.0));
        prob_sum += p;
        homr += 1; homc += 1; hets -= 2;
        if (hets == obs_hets) target = p;
    }
    p = 1.0;
    hets = mid; homr = (obs_mac - mid) / 2; homc = obs_n - hets - homr;
    while (hets <= obs_mac - 2) {
        p = p * 4.0 * (double)homr * (double)homc / (((double)hets + 2.0) * ((double)hets + 1.0));
        prob_sum += p;
        homr -= 1; homc -= 1; hets += 2;
        if (hets == obs_hets) target = p;
    }
    if (prob_sum <= 0) return nan("");
    const double limit = target / prob_sum;
    double q = 1.0 / prob_sum;
    double total = q <= limit ? q : 0.0;
    p = 1.0;
    hets = mid; homr = (obs_mac - mid) / 2; homc = obs_n - hets - homr;
    while (hets > 1) {
        p = p * (double)hets * ((double)hets - 1.0) / (4.0 * ((double)homr + 1.0) * ((double)homc + 1.0));
        q = p / prob_sum;
        if (q <= limit) total += q;
        homr += 1; homc += 1; hets -= 2;
    }
    p = 1.0;
    hets = mid; homr = (obs_mac - mid) / 2; homc = obs_n - hets - homr;
    while (hets <= obs_mac - 2) {
        p = p * 4.0 * (double)homr * (double)homc / (((double)hets + 2.0) * ((double)hets + 1.0));
        q = p / prob_sum;
        if (q <= limit) total += q;
        homr -= 1; homc -= 1; hets += 2;
    }
    return fmax(fmin(1.0, total), 0.0);
}

extern "C" __global__ void pipeline_hwe_exact(const long long* __restrict__ het, const long long* __restrict__ hom1,
                                              const long long* __restrict__ hom2, double* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = hwe_p_value(het[i], hom1[i], hom2[i]);
}
