"""Counts of genotype calls: one pass over a block of ``call_genotype`` (variants, samples, ploidy),
integers (int8 in VCF Zarr), each value read once.

- ``variant_call_counts``: per variant, the calls that are homozygous reference, homozygous
  alternate and heterozygous, and the count of each allele (sgkit's ``variant_stats`` and
  ``count_variant_alleles``);
- ``sample_call_counts``: per sample, the same three call counts over the block's variants (a
  partial, summed over blocks of variants by the op: ``sample_stats``);
- ``call_allele_counts``: per call, the count of each allele (``count_call_alleles``);
- ``variant_genotype_counts``: per variant, the calls of each genotype in the VCF order, and the
  calls sgkit refuses to count (``count_variant_genotypes``, ``hardy_weinberg_test``);
- ``hwe_exact``: the Hardy-Weinberg exact test of Wigginton et al. (2005) per variant, from its
  genotype counts;
- ``hard_calls``: calls from genotype probabilities (``convert_probability_to_call``);
- ``genotype_allele_frequencies``: per call, each allele's frequency among its alleles (the
  identity by state's).

sgkit's rules, as its Numba functions have them (``stats/aggregation_numba_fns.py``,
``stats/conversion_numba_fns.py``, ``stats/hwe.py``):

- an allele below 0 is missing (-1) or fill (-2, a non-allele of mixed-ploidy data); a call is
  *called* only when every one of its alleles is 0 or more, so a partly missing call counts in
  no call class, while its called alleles count as alleles;
- a called call is homozygous reference when all alleles are 0, homozygous alternate when they
  are all the same other allele, heterozygous otherwise (polyploid calls alike);
- alleles at or beyond the ``alleles`` dimension are not counted (sgkit would write past the end
  of its output there);
- genotype counts: sgkit raises on a fill value (with two alleles: on the first negative allele of
  a call when it is below -1, or on an allele above 1 before it; with more: on any allele below
  -1); these calls are counted apart, and the op raises as sgkit does.

Each count is a function of one call, written once (:func:`make_call_counters`,
:func:`_tally_genotype`, :func:`_call_alleles`, :func:`_hwe_p_value`) and compiled twice: by Numba
for the CPU loops, which are the CPU kernels, and by Numba CUDA (``cuda.jit(device=True)``) for the
GPU kernels, which are the same logic over other threads. Where the CPU loop takes another way,
for speed, it keeps the same comparisons: the allele counts per variant, which the CPU counts by a
pass over the variant's row for each allele (vectorized by the compiler, the row still in cache)
where a GPU thread compares each of its calls' alleles with every allele index (the GPU's way runs
on the CPU as :func:`call_counts_twin`, for the tests); and the per-call allele counts, written
out in the CPU loop. Integer counts do not depend on the order of additions, so CPU and GPU agree
exactly, and the CPU tests run the Numba CUDA kernels in Numba's CUDA simulator (the CUDA C
kernels below run in the GPU tests).

Generic GPU kernels (Numba CUDA, launched on CuPy's current stream), over any dtype, ploidy and
alleles:

- per variant (``variant_call_counts``, ``variant_genotype_counts``): a block is ``ty`` rows of
  ``tx`` threads, one row a variant, its threads spread over a tile of samples (``tx`` is 32
  where samples are few, 128 otherwise). A thread loads ``UNROLL`` calls (every allele of each)
  before it counts any, so several loads are in flight, and a warp reads neighbouring calls
  (coalesced). The row's counts are summed in shared memory and added to the output once per
  block (integer atomics: exact in any order), so long rows split over tiles of samples still fill
  the GPU. Counts are summed one after the other, a few steps of shared memory each: cheap for
  the call counts (3 + alleles) and for diploid biallelic genotypes (4), slow for genotype counts
  of many alleles or a high ploidy (a count per genotype per thread);
- per sample (``sample_call_counts``): a thread a sample and a tile of variants, ``UNROLL``
  variants' calls loaded at once, counts added to the output once per tile;
- ``hwe_exact`` (CUDA C, ``cuda/genotypes.cu``, for every input): a thread a variant. The exact
  test needs the distribution of heterozygote counts; sgkit keeps it in an array of length
  ``2 * n + 1``, which a GPU thread cannot hold, so both kernels compute it twice instead (the
  sum, then the p-value), with sgkit's recurrence in sgkit's order of operations as its source
  reads; the final sum adds the same terms in another order. The CUDA C kernel does
  :func:`_hwe_p_value`'s operations in its order, without fused multiply-add: the same bits as the
  CPU. sgkit compiles its test with ``fastmath``, which lets the compiler reorder its arithmetic,
  so no IEEE order reproduces it: p-values agree with sgkit's within a few units of float64
  rounding (2.6e-15 relative at most on the test counts; sgkit's own function without fastmath
  differs from it as much).

The word kernels, for int8 calls of ploidy 2 and two alleles (VCF Zarr as bio2zarr writes it:
nearly all data; :func:`word_path` says when they run). The generic kernels load a call as two
int8 values and count it with a dozen comparisons and branches, a few bytes in flight a thread:
on an H200 they read a block of 0.8 GB in 1.3 to 3.3 ms, where a copy of it takes 0.4 ms. The
word kernels read the block as 32-bit words, two calls each, and count a word at once with a few
bit operations (:func:`word_flags`): where every byte is 0, 1, -1 or -2, each count is a flag at
bit 0 of a byte or of a call, added into 8- or 16-bit lanes of a register and summed across lanes
every 63 loads. A word holding any other byte (an allele of 2 or more, a value below -2) is
counted call by call by sgkit's rules (``count_call`` in the CUDA source, the per-call functions
above in Python; the tests hold them equal on every byte value).

- per variant and per sample, and the HWE test: CUDA C (``cuda/genotypes.cu``), compiled by CuPy
  once per machine, one module for the four kernels. Numba CUDA kernels (an earlier version of
  these, over the same bit operations on uint64 words) took 3.4 s to compile on a fresh machine,
  most of it Numba's typing in Python, and the first launch of any imports ``numba.cuda``;
- per variant: ``tx`` threads a row (a warp where a row has more than 2,048 samples, else fewer),
  each loading ``UNROLL`` aligned 16-byte units before it counts any; the units of a row are
  those of the block's memory that lie wholly inside it (a row of a number of samples not a
  multiple of 8 starts and ends mid-unit: its calls outside whole units go call by call); a row's
  counts are summed by warp shuffles and added to the output once a tile (of a row: one, unless
  the rows are too few to fill the GPU);
- per sample: a thread 16 bytes of a row (eight samples) and a tile of variants, four samples'
  counts in the 8-bit lanes of a register (summed into 16-bit lanes every 255 variants); tiles
  sized to give the GPU about ``WORD_THREADS`` threads; rows that do not start at a multiple of
  16 bytes are joined from two aligned loads.

The per-call allele counts (``call_allele_counts``), for every input: CUDA C (``cuda/calls.cu``),
a thread ``CALL_UNROLL`` calls, each call's alleles compared with every allele index (the
comparisons of :func:`_call_alleles`); int8 diploid biallelic calls by 64-bit words of four calls.

Nothing here imports CuPy or ``numba.cuda`` at module level.
"""

from __future__ import annotations

import numpy as np

from . import launch

# numba.cuda, set on first GPU use: a global of the module that defines the @cuda.jit kernels, as
# Numba's CUDA simulator requires (see launch.numba_cuda)
cuda = None

CLASSES = 3  # call classes counted per variant or sample: hom ref, hom alt, het (sgkit's order)
UNROLL = 4  # calls loaded by a thread before it counts them
THREADS = 128  # threads a block
TILE_STEPS = 8  # unrolled steps a thread takes along its tile of samples (per-variant kernels)
VARIANT_TILE = 128  # variants a thread walks (per-sample kernel)
SMALL_ALLELES = 8  # up to this many alleles, per-allele counts are kept in registers (make_call_counters)


# --- one call: written once, compiled for the CPU and for the GPU ---------------------------------


def make_call_counters(jit):
    """The per-call functions of the call counts, compiled by ``jit`` (``launch.cpu_jit`` or
    ``cuda.jit(device=True)``):

    - ``classify(x, i, ploidy)``: the class of call ``x[i, :ploidy]``, sgkit's ``_classify_hom``:
      0 homozygous reference, 1 homozygous alternate, 2 heterozygous, 3 not called (an allele
      below 0). Arithmetic on 0/1 rather than branches, which go either way at random where
      alleles vary (on one core, 25M random diploid calls: 1.1 s with branches, the ploidy read
      from the array and the counts kept in the output; 0.08 s for the classes as the CPU loop
      has them now, the ploidy a constant and the counts in registers);
    - ``tally_call(x, i, ploidy, n_alleles, acc)``: ``acc[c] += 1`` for the call's class ``c``
      below 3, and ``acc[3 + a] += 1`` for each allele ``a`` below ``n_alleles`` (sgkit's
      ``count_alleles``). With few alleles each allele is compared with every allele index and
      each count takes a comparison, so that, with ``n_alleles`` and the class indices
      compile-time constants on the GPU, the loops unroll and the counts stay in registers (an
      index taken from the data would put them in local memory).
    """

    @jit
    def classify(x, i, ploidy):
        a0 = int(x[i, 0])
        called = int(a0 >= 0)
        het = 0
        for k in range(1, ploidy):
            a = int(x[i, k])
            called &= int(a >= 0)
            het |= int(a != a0)
        return called * (2 * het + (1 - het) * int(a0 != 0)) + 3 * (1 - called)

    @jit
    def tally_call(x, i, ploidy, n_alleles, acc):
        c = classify(x, i, ploidy)
        acc[0] += int(c == 0)
        acc[1] += int(c == 1)
        acc[2] += int(c == 2)
        for k in range(ploidy):
            a = int(x[i, k])
            if n_alleles <= SMALL_ALLELES:
                for j in range(n_alleles):
                    acc[CLASSES + j] += int(a == j)
            elif a >= 0 and a < n_alleles:
                acc[CLASSES + a] += 1

    return classify, tally_call


def _comb_with_replacement(n, k):
    """Multisets of size ``k`` of ``n`` things, ``C(n + k - 1, k)`` (``k >= 1``), exactly: each
    step is ``C(n - 1 + d, d)``, an integer."""
    r = 1
    for d in range(1, k + 1):
        r = r * (n - 1 + d) // d
    return r


def _tally_genotype(x, i, ploidy, n_alleles, acc):
    """Count the call ``x[i, :ploidy]`` at its genotype's index in the VCF order (``acc[index]``),
    or, if sgkit raises on it, in ``acc[-1]``; a missing call counts nowhere.

    Two alleles: sgkit's ``_biallelic_genotype_index``, the sum of the alleles, walked in the call's
    order (so ``(-1, -2)`` is missing but ``(0, -2)`` refused). More: ``_sorted_genotype_index`` on
    the sorted call, ``sum_i C(a_(i) + i, i + 1)``, each allele's place in the sorted call found by
    counting (no sort in a GPU thread); an allele beyond the alleles dimension is refused."""
    index = 0
    if n_alleles == 2:
        for k in range(ploidy):
            a = int(x[i, k])
            if index >= 0:
                if a < 0:
                    index = -1 if a == -1 else -2
                elif a > 1:
                    index = -2
                else:
                    index += a
    else:
        low = int(x[i, 0])
        for k in range(1, ploidy):
            low = min(low, int(x[i, k]))
        if low < -1:
            index = -2
        elif low == -1:
            index = -1
        else:
            bad = False
            for k in range(ploidy):
                a = int(x[i, k])
                if a >= n_alleles:
                    bad = True
                place = 0
                for m in range(ploidy):
                    b = int(x[i, m])
                    if b < a or (b == a and m < k):
                        place += 1
                # C(a + place, place + 1), as _comb_with_replacement(a, place + 1), inline so that
                # this function compiles alone for either target
                r = 1
                for d in range(1, place + 2):
                    r = r * (a - 1 + d) // d
                index += r
            if bad:
                index = -2
    if index >= 0:
        acc[index] += 1
    elif index == -2:
        acc[acc.shape[0] - 1] += 1


def _call_alleles(g, v, s, ploidy, n_alleles, out):
    """``out[v, s, a]``: the alleles ``a`` of call ``g[v, s]`` (sgkit's ``count_alleles``), each
    count written once (a comparison of each allele with each index: no read-modify-write)."""
    for j in range(n_alleles):
        n = 0
        for k in range(ploidy):
            n += int(int(g[v, s, k]) == j)
        out[v, s, j] = n


# --- diploid calls in a word: the same counts, by bit operations -----------------------------------
#
# int8 calls of ploidy 2 are pairs of bytes; four bytes are two calls, read as one little-endian
# uint32 (call j: its first allele in byte 2j, its second in byte 2j + 1). Where every byte is 0, 1,
# -1 or -2, two bits of a byte say what it is: its sign (bit 1: those four bytes are 0000000b and
# 1111111b) and its bit 0 (1 for allele 1 and for -1). The counts of the word are then flags at
# bit 0 of bytes or of calls; any other byte (an allele of 2 or more, a value below -2) sends the
# word back to the per-call functions above. The CUDA kernels (``cuda/genotypes.cu``,
# ``count_fast``) compute these flags; :func:`word_flags` is the same formulas on NumPy words, for
# the tests.

LOWS32 = np.uint32(0x01010101)  # bit 0 of each byte
CALLS32 = np.uint32(0x00010001)  # bit 0 of each call's first byte
INNER32 = np.uint32(0x7E7E7E7E)  # bits 1 to 6 of each byte


def word_flags(x, at: int = 0) -> dict:
    """``count_fast`` and ``call_flags`` of ``cuda/genotypes.cu`` on uint32 words ``x``: ``odd``
    is non-zero where a byte is not 0, 1, -1 or -2 (bits 1 to 7 of a byte not all equal: bit k
    against bit k + 1); elsewhere ``hom_ref``, ``hom_alt`` and ``called`` (0/0, 0/1 or 1/1) are
    flags at bit ``at`` of each call (0: its first byte, 8: its second, as the per-sample kernel
    places them for a word's neighbour), ``refused`` (sgkit's genotype index refuses the call: a
    first allele of -2, or of 0 or 1 with a second of -2) at bit 0 of each call, ``zeros`` and
    ``ones`` at bit 0 of each byte (the alleles 0 and 1)."""
    x = np.asarray(x, np.uint32)
    one, eight, nine = np.uint32(1), np.uint32(8), np.uint32(9)
    m = CALLS32 << np.uint32(at)
    s = x >> eight if at == 0 else x << eight  # at bit ``at``: the call's other byte's bits 0 and 1
    u = x | s  # bit ``at``: either allele has bit 0; the next bit: either allele is negative
    u1 = u >> one
    y = x >> one  # bit 0 of a byte: its sign
    s0, t = x >> eight, x >> nine  # at a call's first byte: its second byte's bit 0 and sign
    return {"odd": (x ^ y) & INNER32, "hom_ref": ~(u | u1) & m, "hom_alt": x & s & ~u1 & m, "called": ~u1 & m,
            "zeros": ~(x | y) & LOWS32, "ones": x & ~y & LOWS32, "refused": ((y & ~x) | (~y & t & ~s0)) & CALLS32}


# The per-call allele counts' words (``word_counts`` in cuda/calls.cu), eight bytes, four calls, a word.
LOWS = np.uint64(0x0101010101010101)  # bit 0 of each byte
INNER = np.uint64(0x7E7E7E7E7E7E7E7E)  # bits 1 to 6 of each byte
LOW_BYTES = np.uint64(0x00FF00FF00FF00FF)  # each call's first byte


def word_call_alleles(x):
    """``word_counts`` of ``cuda/calls.cu`` on uint64 words ``x`` of four int8 diploid calls:
    ``(fast, counts)``, where ``fast`` says which words have only the bytes 0, 1, -1 and -2 (bit 0
    and the sign of each byte then say what it is), and ``counts`` is their words of per-call
    allele counts by bit operations (each call's count of allele 0 in its first byte, of allele 1
    in its second); the kernel counts the other words call by call."""
    x = np.asarray(x, np.uint64)
    one, eight = np.uint64(1), np.uint64(8)
    y = x >> one
    neg, low = y & LOWS, x & LOWS
    zeros, ones = ~(neg | low) & LOWS, low & ~neg
    counts = ((zeros + (zeros >> eight)) & LOW_BYTES) | (((ones + (ones >> eight)) & LOW_BYTES) << eight)
    return ((x ^ y) & INNER) == 0, counts


def _hwe_p_value(obs_hets, obs_hom1, obs_hom2):
    """sgkit's ``hardy_weinberg_p_value`` without its array: the probabilities of each count of
    heterozygotes, from the midpoint down and then up, are computed once for their sum and the
    probability of the observed count, and again to add those not above it. The terms and their
    sum are sgkit's operation for operation; the p-value adds the same normalized terms, in another
    order (sgkit adds them by index)."""
    obs_homc = obs_hom2 if obs_hom1 < obs_hom2 else obs_hom1
    obs_homr = obs_hom1 if obs_hom1 < obs_hom2 else obs_hom2
    obs_mac = 2 * obs_homr + obs_hets
    obs_n = obs_hets + obs_homc + obs_homr
    if obs_n == 0:
        return np.nan
    # float division then truncation, as sgkit (exact for counts below 2**53)
    mid = int(float(obs_mac * (2 * obs_n - obs_mac)) / float(2 * obs_n))
    if (obs_mac & 1) ^ (mid & 1):
        mid += 1
    prob_sum = 1.0
    target = 1.0 if obs_hets == mid else 0.0
    # downward from the midpoint
    p = 1.0
    hets = mid
    homr = (obs_mac - mid) // 2
    homc = obs_n - hets - homr
    while hets > 1:
        p = p * hets * (hets - 1.0) / (4.0 * (homr + 1.0) * (homc + 1.0))
        prob_sum += p
        homr += 1
        homc += 1
        hets -= 2
        if hets == obs_hets:
            target = p
    # upward from the midpoint
    p = 1.0
    hets = mid
    homr = (obs_mac - mid) // 2
    homc = obs_n - hets - homr
    while hets <= obs_mac - 2:
        p = p * 4.0 * homr * homc / ((hets + 2.0) * (hets + 1.0))
        prob_sum += p
        homr -= 1
        homc -= 1
        hets += 2
        if hets == obs_hets:
            target = p
    if prob_sum <= 0:
        return np.nan
    limit = target / prob_sum
    q = 1.0 / prob_sum
    total = q if q <= limit else 0.0
    p = 1.0
    hets = mid
    homr = (obs_mac - mid) // 2
    homc = obs_n - hets - homr
    while hets > 1:
        p = p * hets * (hets - 1.0) / (4.0 * (homr + 1.0) * (homc + 1.0))
        q = p / prob_sum
        if q <= limit:
            total += q
        homr += 1
        homc += 1
        hets -= 2
    p = 1.0
    hets = mid
    homr = (obs_mac - mid) // 2
    homc = obs_n - hets - homr
    while hets <= obs_mac - 2:
        p = p * 4.0 * homr * homc / ((hets + 2.0) * (hets + 1.0))
        q = p / prob_sum
        if q <= limit:
            total += q
        homr -= 1
        homc -= 1
        hets += 2
    return max(min(1.0, total), 0.0)


# --- CPU: the loops, compiled by Numba --------------------------------------------------------------


@launch.once
def _cpu_loops(ploidy: int):
    """The CPU kernels' loops for calls of ``ploidy`` alleles (a compile-time constant: the loop
    over a call's alleles unrolls; with the ploidy read from the array the classes took four
    times as long). Compiled once per ploidy, and kept in Numba's disk cache."""
    classify, _ = _cpu_counters()
    tally_genotype = launch.cpu_jit(_tally_genotype)

    @launch.cpu_jit
    def variant_calls(g, n_alleles, out):
        # per variant: the classes in three registers, then each allele counted by a pass over
        # the variant's row, still in cache, which the compiler vectorizes (the same counts as
        # the GPU kernel's tally_call: comparisons with each allele index)
        nv, ns = g.shape[0], g.shape[1]
        flat = g.reshape(nv, ns * ploidy)
        for v in range(nv):
            row = g[v]
            hom_ref, hom_alt, het = 0, 0, 0
            for s in range(ns):
                c = classify(row, s, ploidy)
                hom_ref += c == 0
                hom_alt += c == 1
                het += c == 2
            out[v, 0] = hom_ref
            out[v, 1] = hom_alt
            out[v, 2] = het
            alleles = flat[v]
            for j in range(n_alleles):
                n = 0
                for e in range(alleles.shape[0]):
                    n += alleles[e] == j
                out[v, CLASSES + j] = n

    @launch.cpu_jit
    def sample_calls(g, out):
        for v in range(g.shape[0]):
            row = g[v]
            for s in range(g.shape[1]):
                c = classify(row, s, ploidy)
                out[s, 0] += c == 0
                out[s, 1] += c == 1
                out[s, 2] += c == 2

    @launch.cpu_jit
    def variant_genotypes(g, n_alleles, out):
        for v in range(g.shape[0]):
            row, acc = g[v], out[v]
            for s in range(g.shape[1]):
                tally_genotype(row, s, ploidy, n_alleles, acc)

    @launch.cpu_jit
    def calls(g, n_alleles, out):
        # _call_alleles written out here: called as a function, with its arrays, once a call,
        # it took five times as long
        for v in range(g.shape[0]):
            for s in range(g.shape[1]):
                for j in range(n_alleles):
                    n = 0
                    for k in range(ploidy):
                        n += g[v, s, k] == j
                    out[v, s, j] = n

    return {"variant_calls": variant_calls, "variant_genotypes": variant_genotypes,
            "sample_calls": sample_calls, "calls": calls}


@launch.once
def _cpu_counters():
    return make_call_counters(launch.cpu_jit)


@launch.once
def _cpu_hwe():
    hwe = launch.cpu_jit(_hwe_p_value)

    @launch.cpu_jit
    def hwe_loop(het, hom1, hom2, out):
        for i in range(out.shape[0]):
            out[i] = hwe(het[i], hom1[i], hom2[i])

    return hwe_loop


def call_counts_twin(g, n_alleles: int):
    """What the per-variant GPU kernel computes, by its per-call function (``tally_call``) in a
    plain loop on the CPU: (variants, 3 + n_alleles) int64, for the tests."""
    _, tally_call = _cpu_counters()
    out = np.zeros((g.shape[0], CLASSES + n_alleles), np.int64)
    for v in range(g.shape[0]):
        for s in range(g.shape[1]):
            tally_call(g[v], s, g.shape[2], n_alleles, out[v])
    return out


def n_genotypes(n_alleles: int, ploidy: int) -> int:
    """Genotypes of ``ploidy`` alleles among ``n_alleles`` (sgkit's ``_comb_with_replacement``)."""
    return 0 if n_alleles == 0 else _comb_with_replacement(n_alleles, ploidy)


def variant_call_counts_cpu(g, n_alleles: int):
    """(variants, 1, 3 + n_alleles) int64 counts of a block (variants, samples, ploidy): hom ref,
    hom alt, het, then each allele; the samples axis kept, for the op's sum over blocks of
    samples."""
    out = np.zeros((g.shape[0], CLASSES + n_alleles), np.int64)
    if g.size:
        _cpu_loops(g.shape[2])["variant_calls"](np.ascontiguousarray(g), n_alleles, out)
    return out[:, None, :]


def variant_genotype_counts_cpu(g, n_alleles: int):
    """(variants, 1, genotypes + 1) int64: the calls of each genotype (VCF order), then the calls
    sgkit refuses (fill values, alleles out of range)."""
    out = np.zeros((g.shape[0], n_genotypes(n_alleles, g.shape[2]) + 1), np.int64)
    if g.size:
        _cpu_loops(g.shape[2])["variant_genotypes"](g, n_alleles, out)
    return out[:, None, :]


def sample_call_counts_cpu(g):
    """(1, samples, 3) int64 counts over the block's variants: hom ref, hom alt, het; the variants
    axis kept, for the op's sum over blocks of variants."""
    out = np.zeros((g.shape[1], CLASSES), np.int64)
    if g.size:
        _cpu_loops(g.shape[2])["sample_calls"](g, out)
    return out[None]


def call_allele_counts_cpu(g, n_alleles: int):
    """(variants, samples, n_alleles) uint8: the count of each allele in each call."""
    out = np.empty(g.shape[:2] + (n_alleles,), np.uint8)
    if g.size and n_alleles:
        _cpu_loops(g.shape[2])["calls"](g, n_alleles, out)
    return out


def genotype_allele_frequencies_cpu(g, n_alleles: int):
    """(variants, samples, n_alleles) float64: each call's count of each allele (0 to ``n_alleles``
    - 1, :func:`call_allele_counts_cpu`) over the count of its alleles in that range, NaN where it
    has none."""
    counts = call_allele_counts_cpu(np.ascontiguousarray(g), n_alleles).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return counts / counts.sum(axis=-1, keepdims=True)


# flags of call_genotype_index: a call sgkit's convert_call_to_index raises on (as cuda/calls.cu)
REFUSED_FILL = 1  # a fill value (-2): mixed-ploidy genotypes
REFUSED_ABOVE_ONE = 2  # an allele above 1 where there are two alleles


def call_genotype_index_cpu(g, biallelic: bool):
    """``(index, refused)``: the index of each call's genotype of ``g`` (variants, samples,
    ploidy) in VCF order, int64, -1 where an allele is missing (sgkit's ``convert_call_to_index``:
    ``biallelic_genotype_call_index``, the alleles in the call's order, the first missing one
    ending it, or ``sorted_genotype_call_index`` on the sorted alleles), and the flags
    (``REFUSED_FILL``, ``REFUSED_ABOVE_ONE``) of the calls sgkit raises on. Array formulas."""
    g = np.asarray(g).astype(np.int64)
    refused = 0
    if biallelic:
        before = np.cumsum(g < 0, axis=-1) - (g < 0)  # missing alleles before each allele
        seen = before == 0  # sgkit's loop reaches this allele
        refused |= REFUSED_FILL * bool((seen & (g < -1)).any()) | REFUSED_ABOVE_ONE * bool((seen & (g > 1)).any())
        return np.where((g < 0).any(axis=-1), -1, g.sum(axis=-1)), refused
    g = np.sort(g, axis=-1)
    first = g[..., 0]
    refused |= REFUSED_FILL * bool((first < -1).any())
    index = np.zeros(first.shape, dtype=np.int64)
    for i in range(g.shape[-1]):
        # C(a + i, i + 1): the genotypes of i + 1 alleles below a (exact: a binomial at every step)
        a, c = np.maximum(g[..., i], 0), np.ones(first.shape, dtype=np.int64)
        for j in range(1, i + 2):
            c = c * (a + j - 1) // j
        index += c
    return np.where(first < 0, -1, index), refused


def hard_calls_cpu(gp, threshold: float):
    """Hard calls (..., 2) int8 from diploid biallelic genotype probabilities ``gp`` (..., 3), sgkit's
    ``convert_probability_to_call``: the most probable genotype (hom ref 0/0, het 1/0, hom alt
    1/1; the first of equal ones) where no probability is NaN, the largest is unique and, with a
    ``threshold`` above 0, at least the threshold (compared in float64); else -1/-1. Array formulas."""
    gp = np.asarray(gp)
    i = np.argmax(np.where(np.isnan(gp), -np.inf, gp), axis=-1)
    top = np.take_along_axis(gp, i[..., None], axis=-1)
    called = ~np.isnan(gp).any(axis=-1) & ((top == gp).sum(axis=-1) == 1)
    if threshold > 0:  # in float64, as sgkit's float64 threshold (float32 0.9 is below 0.9)
        called &= top[..., 0].astype(np.float64) >= threshold
    calls = np.array([[0, 0], [1, 0], [1, 1]], dtype=np.int8)[i]  # hom ref, het, hom alt
    return np.where(called[..., None], calls, np.int8(-1))


def hwe_exact_cpu(het, hom1, hom2):
    """float64 p-values of the HWE exact test from counts of heterozygotes and of both homozygotes
    (NaN where there are no calls)."""
    out = np.empty(np.shape(het), np.float64)
    if out.size:
        args = (np.ascontiguousarray(c, dtype=np.int64).ravel() for c in (het, hom1, hom2))
        _cpu_hwe()(*args, out.reshape(-1))
    return out


def strings_named(values) -> np.ndarray:
    """For each row of ``values`` (rows, columns of strings), how many are not empty: the alleles
    a variant names (VCF Zarr pads them with empty strings). Bytes, str, objects or NumPy's
    StringDType alike; an object array's cast to bool takes each element's truth as ``bool()``
    does, in C (4x ``np.vectorize(bool)``). Host strings only: there are no strings on a GPU."""
    values = np.asarray(values)
    present = values.astype(bool) if values.dtype.kind == "O" else np.vectorize(bool, otypes=[bool])(values)
    return present.sum(axis=1, dtype=np.int64)


# --- GPU: Numba CUDA kernels over the same functions ------------------------------------------------


def _numba_cuda():
    global cuda
    cuda = launch.numba_cuda()
    return cuda


@launch.once
def _row_kernel(kind: str, dtype, ploidy: int, n_alleles: int, tx: int, ty: int, unroll: int, tile: int):
    """The per-variant kernel: ``kind`` "calls" (``tally_call``, 3 + n_alleles counts) or
    "genotypes" (:func:`_tally_genotype`, genotypes + 1 counts), compiled for these constants."""
    _numba_cuda()
    if kind == "calls":
        tally = make_call_counters(cuda.jit(device=True))[1]
    else:
        tally = cuda.jit(device=True)(_tally_genotype)
    n_counts = CLASSES + n_alleles if kind == "calls" else n_genotypes(n_alleles, ploidy) + 1
    dtype = np.dtype(dtype).type  # (the scalar type, as cuda.local.array takes it)

    @launch.cuda_kernel
    def row_counts(g, out):
        x = cuda.threadIdx.x
        y = cuda.threadIdx.y
        v = cuda.blockIdx.x * ty + y
        nv, ns = g.shape[0], g.shape[1]
        acc = cuda.local.array(n_counts, np.int64)
        for c in range(n_counts):
            acc[c] = 0
        buf = cuda.local.array((unroll, ploidy), dtype)
        if v < nv:
            s0 = cuda.blockIdx.y * tile
            s1 = min(ns, s0 + tile)
            s = s0 + x
            while s + (unroll - 1) * tx < s1:
                for u in range(unroll):  # every load of the step first: unroll * ploidy in flight
                    for k in range(ploidy):
                        buf[u, k] = g[v, s + u * tx, k]
                for u in range(unroll):
                    tally(buf, u, ploidy, n_alleles, acc)
                s += unroll * tx
            while s < s1:
                for k in range(ploidy):
                    buf[0, k] = g[v, s, k]
                tally(buf, 0, ploidy, n_alleles, acc)
                s += tx
        # the row's counts: a tree over its threads in shared memory, one atomic add per count
        shared = cuda.shared.array((ty, tx), np.int64)
        for c in range(n_counts):
            shared[y, x] = acc[c]
            cuda.syncthreads()
            step = tx // 2
            while step > 0:
                if x < step:
                    shared[y, x] += shared[y, x + step]
                cuda.syncthreads()
                step //= 2
            if x == 0 and v < nv and shared[y, 0] != 0:
                cuda.atomic.add(out, (v, c), shared[y, 0])
            cuda.syncthreads()

    return row_counts


@launch.once
def _sample_kernel(dtype, ploidy: int, unroll: int, vtile: int):
    _numba_cuda()
    tally = make_call_counters(cuda.jit(device=True))[1]
    dtype = np.dtype(dtype).type

    @launch.cuda_kernel
    def sample_counts(g, out):
        s = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        nv, ns = g.shape[0], g.shape[1]
        if s < ns:
            acc = cuda.local.array(CLASSES, np.int64)
            for c in range(CLASSES):
                acc[c] = 0
            buf = cuda.local.array((unroll, ploidy), dtype)
            v = cuda.blockIdx.y * vtile
            v1 = min(nv, v + vtile)
            while v + unroll <= v1:
                for u in range(unroll):
                    for k in range(ploidy):
                        buf[u, k] = g[v + u, s, k]
                for u in range(unroll):
                    tally(buf, u, ploidy, 0, acc)
                v += unroll
            while v < v1:
                for k in range(ploidy):
                    buf[0, k] = g[v, s, k]
                tally(buf, 0, ploidy, 0, acc)
                v += 1
            for c in range(CLASSES):
                if acc[c] != 0:
                    cuda.atomic.add(out, (s, c), acc[c])

    return sample_counts


# --- GPU: the word kernels (int8, diploid, biallelic), CUDA C -----------------------------------------
#
# cuda/genotypes.cu: the per-variant and per-sample counts and the HWE test, compiled by CuPy (one
# module, once per machine, in about a second on a fresh machine, where the Numba CUDA kernels they
# replace took 3.4 s for the counting statistics; and no numba.cuda to import).

WORD_THREADS = 1 << 18  # threads the word kernels aim for (an H200 holds 270,336)
SAMPLE_LANE_MAX = 0xFFFF  # variants a thread of the per-sample kernel counts in 16-bit lanes
UNIT = 16  # bytes a load of the per-variant kernel (eight calls)


SAMPLE_CALLS = 8  # calls of a row a thread of the per-sample kernel counts (16 bytes)


def _c_kernel(name: str, unroll: int = UNROLL, sample_unroll: int = UNROLL):
    return launch.raw_kernel("genotypes.cu", name, launch.FMAD, unroll=unroll, sample_unroll=sample_unroll)


def _xp(x):
    from ..backend import xp_of

    return xp_of(x)


def word_path(g, n_alleles: int = 2) -> bool:
    """Whether the word kernels count the block ``g``: int8 calls of ploidy 2 and two alleles
    (``n_alleles`` does not matter to the per-sample counts), C-contiguous, and a word (four calls)
    or more. Any number of samples: rows need not be whole words. (What else each kernel needs:
    :func:`_use_words`.)"""
    if g.dtype != np.int8 or g.ndim != 3 or g.shape[2] != 2 or n_alleles != 2 or g.size < 8:
        return False
    return bool(g.flags.c_contiguous)


def _use_words(g, n_alleles: int, words: bool | None) -> bool:
    """Whether to count ``g`` by the word kernels (:func:`word_path`), unless ``words`` says: the
    CUDA C kernels take an array on the GPU at any address (under Numba's CUDA simulator, NumPy
    arrays take the generic Numba kernels)."""
    fits = word_path(g, n_alleles) and hasattr(g, "__cuda_array_interface__")
    if words and not fits:
        raise ValueError("the word kernels count C-contiguous int8 calls of ploidy 2 and two alleles, four calls "
                         "or more, on the GPU")
    return fits if words is None else words


def row_shape(n_samples: int, tx: int | None = None, unroll: int = UNROLL, tile: int | None = None):
    """(tx, ty, tile) of the per-variant kernels: 32 threads a variant where a row has at most 1024
    samples (several variants a block), else 128; tiles of ``TILE_STEPS`` unrolled steps."""
    if tx is None:
        tx = 32 if n_samples <= 1024 else THREADS
    ty = max(1, THREADS // tx)
    return tx, ty, tile or tx * unroll * TILE_STEPS


def word_row_shape(n_variants: int, n_samples: int, tx: int | None = None, ty: int | None = None,
                   unroll: int = UNROLL, tile: int | None = None):
    """(tx, ty, tile) of the per-variant word kernel, ``tile`` in 16-byte units (eight calls): a
    warp a row where a row has more than 256 units (2,048 samples), else the fewest threads that
    leave each 8 units or fewer; a row in one tile unless the rows are too few to give the GPU
    ``WORD_THREADS`` threads, and never fewer than 4 unrolled steps a thread a tile."""
    units = max(1, 2 * n_samples // UNIT)
    if tx is None:
        tx = 1
        while tx < 32 and 8 * tx < units:
            tx *= 2
    ty = ty or THREADS // tx
    if tx & (tx - 1) or tx > 32 or tx * ty % 32:
        raise ValueError(f"word kernels: tx must be a power of two up to 32 and tx * ty a multiple of 32, "
                         f"not {tx}, {ty}")
    if not tile:
        tiles = max(1, WORD_THREADS // max(1, n_variants * tx))
        tile = max(4 * unroll * tx, -(-units // tiles))
    return tx, ty, max(tile, -(-units // 65535))


def word_sample_tile(n_variants: int, n_samples: int) -> int:
    """Variants a thread of the per-sample word kernel walks: enough tiles for ``WORD_THREADS``
    threads, at least 64 variants a tile (each tile adds its counts to the output: three atomic
    adds a sample), at most ``SAMPLE_LANE_MAX`` (16-bit lanes) and few enough tiles for the grid."""
    tiles = max(1, WORD_THREADS // -(-n_samples // SAMPLE_CALLS))
    vtile = max(64, -(-n_variants // tiles), -(-n_variants // 65535))
    return min(SAMPLE_LANE_MAX, vtile)


def _row_counts(kind: str, g, n_alleles: int, n_counts: int, tx, ty, unroll, tile):
    xp = _xp(g)
    g = xp.ascontiguousarray(g)  # (a Dask block usually is: no copy)
    nv, ns, ploidy = g.shape
    out = xp.zeros((nv, n_counts), np.int64)
    if g.size:
        tx, auto_ty, tile = row_shape(ns, tx, unroll, tile)
        ty = ty or auto_ty
        kernel = _row_kernel(kind, np.dtype(g.dtype), ploidy, n_alleles, tx, ty, unroll, tile)
        launch.launch_numba(kernel, 0, g, out, threads=(tx, ty), grid=(-(-nv // ty), -(-ns // tile)))
    return out[:, None, :]


def _word_row_counts(kind: str, g, n_counts: int, tx, ty, unroll, tile):
    """The per-variant CUDA C kernel (``pipeline_word_call_rows`` or ``_genotype_rows``)."""
    xp = _xp(g)
    nv, ns, _ = g.shape
    out = xp.zeros((nv, n_counts), np.int64)
    tx, ty, tile = word_row_shape(nv, ns, tx, ty, unroll, tile)
    kernel = _c_kernel(f"pipeline_word_{kind[:-1]}_rows", unroll)
    grid = (-(-nv // ty), -(-(2 * ns // UNIT) // tile) or 1)
    kernel(grid, (tx, ty), (g, np.int64(nv), np.int64(2 * ns), np.int64(tile), out))
    return out[:, None, :]


def variant_call_counts_gpu(g, n_alleles: int, *, tx: int | None = None, ty: int | None = None,
                            unroll: int = UNROLL, tile: int | None = None, words: bool | None = None):
    """:func:`variant_call_counts_cpu` by the per-variant CUDA kernel: the word kernel (CUDA C)
    where :func:`word_path` holds on the GPU (or as ``words`` says), else the generic one (Numba
    CUDA); shapes by :func:`word_row_shape` or :func:`row_shape` unless given (the tests pick
    small ones)."""
    g = _xp(g).ascontiguousarray(g)
    if _use_words(g, n_alleles, words):
        return _word_row_counts("calls", g, CLASSES + 2, tx, ty, unroll, tile)
    return _row_counts("calls", g, n_alleles, CLASSES + n_alleles, tx, ty, unroll, tile)


def variant_genotype_counts_gpu(g, n_alleles: int, *, tx: int | None = None, ty: int | None = None,
                                unroll: int = UNROLL, tile: int | None = None, words: bool | None = None):
    """:func:`variant_genotype_counts_cpu` by the per-variant CUDA kernel (the word kernel as
    :func:`variant_call_counts_gpu`)."""
    g = _xp(g).ascontiguousarray(g)
    if _use_words(g, n_alleles, words):
        return _word_row_counts("genotypes", g, n_genotypes(2, 2) + 1, tx, ty, unroll, tile)
    return _row_counts("genotypes", g, n_alleles, n_genotypes(n_alleles, g.shape[2]) + 1, tx, ty, unroll, tile)


def sample_call_counts_gpu(g, *, threads: int = THREADS, unroll: int = UNROLL, vtile: int | None = None,
                           words: bool | None = None):
    """:func:`sample_call_counts_cpu` by the per-sample CUDA kernel: a thread a sample (16 bytes
    of a row, eight samples, in the word kernel in CUDA C) and a tile of ``vtile`` variants
    (:func:`word_sample_tile`, or ``VARIANT_TILE``)."""
    xp = _xp(g)
    g = xp.ascontiguousarray(g)
    nv, ns, ploidy = g.shape
    out = xp.zeros((ns, CLASSES), np.int64)
    if _use_words(g, 2, words):
        vtile = vtile or word_sample_tile(nv, ns)
        if vtile > SAMPLE_LANE_MAX:
            raise ValueError(f"word kernels: at most {SAMPLE_LANE_MAX} variants a tile, not {vtile}")
        grid = (-(-(-(-ns // SAMPLE_CALLS)) // threads), -(-nv // vtile))
        _c_kernel("pipeline_word_samples", sample_unroll=unroll)(
            grid, (threads,), (g, np.int64(nv), np.int64(ns), np.int64(vtile), out))
    elif g.size:
        vtile = vtile or VARIANT_TILE
        kernel = _sample_kernel(np.dtype(g.dtype), ploidy, unroll, vtile)
        launch.launch_numba(kernel, 0, g, out, threads=threads, grid=(-(-ns // threads), -(-nv // vtile)))
    return out[None]


def call_allele_counts_gpu(g, n_alleles: int):
    """:func:`call_allele_counts_cpu` on a CuPy block, by a CUDA C kernel (``cuda/calls.cu``):
    ``pipeline_call_allele_counts_words`` for int8 diploid calls of two alleles (:func:`word_path`)
    at an address that is a multiple of 8 (:func:`word_call_alleles` is its arithmetic on NumPy
    words), ``pipeline_call_allele_counts`` for the others."""
    import cupy

    g = cupy.ascontiguousarray(g)
    out = cupy.empty(g.shape[:2] + (n_alleles,), np.uint8)  # every count is written
    if not out.size:
        return out
    if word_path(g, n_alleles) and g.data.ptr % 8 == 0:  # int8, diploid, two alleles: 64-bit words
        calls = g.shape[0] * g.shape[1]
        kernel = launch.raw_kernel("calls.cu", "pipeline_call_allele_counts_words", (), call_t="signed char", ploidy=2,
                                   unroll=CALL_UNROLL)
        grid = min(launch.blocks(-(-calls // (4 * CALL_UNROLL))), launch.sm_count() * 32)
        kernel((grid,), (launch.THREADS,), (g, out, np.int64(calls)))
    else:
        per_call_gpu("pipeline_call_allele_counts", g, out, np.int32(n_alleles))
    return out


def genotype_allele_frequencies_gpu(g, n_alleles: int):
    """:func:`genotype_allele_frequencies_cpu` on a CuPy block, by the CUDA C kernel (``cuda/calls.cu``,
    ``pipeline_call_allele_frequencies``): one pass, where the formulas compiled five CuPy kernels
    on a fresh machine (comparisons, sums, casts, the division). The counts are integers, so every
    ratio is the same correctly rounded value."""
    import cupy

    g = cupy.ascontiguousarray(g)
    out = cupy.empty(g.shape[:2] + (int(n_alleles),), np.float64)
    if out.size:
        per_call_gpu("pipeline_call_allele_frequencies", g, out, np.int32(n_alleles))
    return out


def call_genotype_index_gpu(g, biallelic: bool):
    """:func:`call_genotype_index_cpu` on a CuPy block, by the CUDA C kernel (``cuda/calls.cu``,
    ``pipeline_call_genotype_index``): the index of each call in one pass, where the array
    formulas took a dozen CuPy kernels and int64 copies of the block. The flags are read back to
    the host (a synchronisation)."""
    import cupy

    g = cupy.ascontiguousarray(g)
    out = cupy.empty(g.shape[:2], np.int64)
    refused = cupy.zeros(1, np.uint32)
    per_call_gpu("pipeline_call_genotype_index", g, out, np.int32(bool(biallelic)), refused)
    return out, int(refused.get()[0])


# --- GPU: per-call kernels, CUDA C ------------------------------------------------------------------
#
# cuda/calls.cu: the per-call allele counts and genotype indices (here) and alternate allele
# counts (alternate.py), any integer type and ploidy (a compile-time constant). They were Numba
# CUDA kernels; as CUDA C no numba.cuda is imported for them: in a second process on an H200 (its
# kernels in the disk cache), importing numba.cuda and loading its registries took 0.5-1 s of the
# first run of sgkit's frequencies and relatedness functions, where their warm runs take 0.2-0.3 s.

CALL_UNROLL = 4  # calls a thread of a per-call kernel loads before it writes any count


def per_call_gpu(name: str, g, out, *args) -> None:
    """Launch the per-call kernel ``name`` of ``cuda/calls.cu`` over the calls of C-contiguous
    ``g`` (variants, samples, ploidy) into ``out``, with ``args`` after the number of calls; a
    thread ``CALL_UNROLL`` calls a grid's width apart, a grid of at most 32 blocks a
    multiprocessor (grid-stride)."""
    calls = g.shape[0] * g.shape[1]
    if not calls:
        return
    kernel = launch.raw_kernel("calls.cu", name, (), call_t=launch.c_type(g.dtype), ploidy=g.shape[2],
                               unroll=CALL_UNROLL)
    grid = min(launch.blocks(-(-calls // CALL_UNROLL)), launch.sm_count() * 32)
    kernel((grid,), (launch.THREADS,), (g, out, np.int64(calls), *args))


def hard_calls_gpu(gp, threshold: float):
    """:func:`hard_calls_cpu` on a CuPy block, by the CUDA C kernel (``cuda/probabilities.cu``, a
    thread a call; shipped compiled for float32 and float64): one pass, where the array formulas
    compiled 16 CuPy kernels on a fresh machine."""
    import cupy

    if gp.dtype.kind != "f" or gp.dtype.itemsize not in (4, 8):
        gp = gp.astype(np.float64)
    gp = cupy.ascontiguousarray(gp)
    out = cupy.empty(gp.shape[:-1] + (2,), np.int8)
    calls = out.size // 2
    if calls:
        kernel = launch.raw_kernel("probabilities.cu", "pipeline_hard_calls", (), prob_t=launch.c_type(gp.dtype))
        kernel((min(launch.blocks(calls), launch.sm_count() * 32),), (launch.THREADS,),
               (gp, out, np.int64(calls), np.float64(threshold)))
    return out


def hwe_exact_gpu(het, hom1, hom2, *, threads: int = THREADS):
    """:func:`hwe_exact_cpu` by the CUDA C kernel ``pipeline_hwe_exact``, a thread a variant: the
    p-values on the GPU. The counts may be CuPy or NumPy arrays (NumPy ones are made int64 on the
    host, where that conversion compiles no kernel)."""
    import cupy

    out = cupy.empty(np.shape(het), np.float64)
    if out.size:
        args = [cupy.asarray(np.ascontiguousarray(c, dtype=np.int64)) if isinstance(c, np.ndarray)
                else cupy.ascontiguousarray(c, dtype=np.int64) for c in (het, hom1, hom2)]
        args = [a.ravel() for a in args]
        _c_kernel("pipeline_hwe_exact")((launch.blocks(out.size, threads),), (threads,),
                                        (*args, out.reshape(-1), np.int64(out.size)))
    return out


__all__ = [
    "call_allele_counts_cpu", "call_allele_counts_gpu", "genotype_allele_frequencies_cpu",
    "genotype_allele_frequencies_gpu", "hard_calls_cpu", "hard_calls_gpu", "hwe_exact_cpu", "hwe_exact_gpu", "n_genotypes",
    "sample_call_counts_cpu", "sample_call_counts_gpu", "variant_call_counts_cpu", "variant_call_counts_gpu",
    "variant_genotype_counts_cpu", "variant_genotype_counts_gpu", "word_path",
]
