
typedef ${in_t} in_t;
typedef ${cmp_t} cmp_t;
#define THREADS ${threads}
#define U ${unroll}
#define SORTED ${sorted}
extern "C" __global__ void __launch_bounds__(THREADS) pipeline_group_spells(
        const in_t* __restrict__ x, const long long* __restrict__ seg_end, const long long* __restrict__ seg_label,
        cmp_t threshold, int* __restrict__ best, int* __restrict__ lead, int* __restrict__ tail,
        int* __restrict__ tail_group, int nt, long long npts, int k) {
    const long long p = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (p >= npts) return;
    const in_t* xp = x + p;
    // Steps come in stretches of equal labels (stretch si ends before step seg_end[si]). ``run`` is
    // the open run's length. While ``fresh`` (it began in this stretch) it raises hb, the best run
    // begun in the stretch, as a running maximum: a run's longest length is its last. Otherwise it
    // was carried in from an earlier stretch (begun in og; the block's leading run while
    // ``is_lead``), and cl follows its length; once it has ended, it is settled at the end of its
    // stretch: into hb if og is this stretch's label, else into its row, whose value (pv) was
    // written when the carry began. A step is thus five selects (three once the warp has no
    // carried run), and the stretch's end is looked for only in the batches of U steps that hold one.
    int run = 0, hb = 0, cl = 0, si = 0, cur = (int)seg_label[0], og = cur, pv = 0, n_lead = 0;
    int next = (int)seg_end[0];
    bool fresh = false, pend = true, is_lead = true;
#if SORTED
    // each row is written once when its stretch ends (rows of groups with no steps as 0; no
    // zeroing by the caller), and raised again only by a carried run
    int written = 0;
#define OPEN()
#define SHUT(w) { for (; written < cur; ++written) best[written * npts + p] = 0; w = hb; best[cur * npts + p] = w; written = cur + 1; }
#else
    // a group may come back: its row (zeroed by the caller) is read when a stretch opens and
    // raised when it ends
    int hv = 0;
#define OPEN() { hv = best[cur * npts + p]; }
#define SHUT(w) { w = max(hv, hb); best[cur * npts + p] = w; }
#endif
#define SETTLE() { if (is_lead) n_lead = cl; else if (og == cur) hb = max(hb, cl); else best[og * npts + p] = max(pv, cl); \
                    pend = false; is_lead = false; }
#define BOUNDARY() { if (pend && fresh) SETTLE() \
        int w; SHUT(w) \
        if (fresh && run > 0) { pend = true; og = cur; pv = w; fresh = false; cl = run; } \
        hb = 0; ++si; next = (int)seg_end[si]; cur = (int)seg_label[si]; OPEN() }
#define STEP(v) { const bool above = (cmp_t)(v) > threshold; fresh = fresh || !above; run = above ? run + 1 : 0; \
                   cl = fresh ? cl : run; hb = fresh ? max(hb, run) : hb; }
    // once every point of the warp is past its carried run (most batches), a step is three selects
#define STEP_FRESH(v) { const bool above = (cmp_t)(v) > threshold; run = above ? run + 1 : 0; hb = max(hb, run); }
    OPEN()
    // the next batch of U steps is loaded while this one is worked through, so that a warp has
    // loads in flight through its arithmetic too
    int t = 0;
    in_t v[U];
    if (U <= nt) {
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = xp[(long long)i * npts];
    }
    for (; t + U <= nt; t += U) {
        in_t nv[U];
        if (t + 2 * U <= nt) {
#pragma unroll
            for (int i = 0; i < U; ++i) nv[i] = xp[(long long)(t + U + i) * npts];
        }
        if (t + U <= next) {
            if (__all_sync(__activemask(), fresh)) {
#pragma unroll
                for (int i = 0; i < U; ++i) STEP_FRESH(v[i])
            } else {
#pragma unroll
                for (int i = 0; i < U; ++i) STEP(v[i])
            }
        } else {
#pragma unroll
            for (int i = 0; i < U; ++i) { if (t + i == next) BOUNDARY() STEP(v[i]) }
        }
#pragma unroll
        for (int i = 0; i < U; ++i) v[i] = nv[i];
    }
    for (; t < nt; ++t) { if (t == next) BOUNDARY() STEP(xp[(long long)t * npts]) }
    if (pend) SETTLE()  // a carried run that has ended, or is open (counted with its length so far)
    int w;
    SHUT(w)
#if SORTED
    for (; written < k; ++written) best[written * npts + p] = 0;
#endif
    lead[p] = n_lead;
    tail[p] = run;
    tail_group[p] = run > 0 ? (fresh ? cur : og) : -1;
}
