
typedef ${in_t} in_t;
typedef ${out_t} out_t;
extern "C" __global__ void ${name}(const in_t* __restrict__ x, out_t* __restrict__ out,
                                  long long rows, long long cols, long long tile${decl}) {
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= cols) return;
    const long long t0 = (long long)blockIdx.y * tile;
    const long long t1 = min(rows, t0 + tile);
    ${prelude}
    long long t = t0;
    for (; t + 3 < t1; t += 4) {
        in_t a = x[t * cols + p], b = x[(t + 1) * cols + p], c = x[(t + 2) * cols + p], d = x[(t + 3) * cols + p];
        { const long long r = t;     const in_t v = a; out[r * cols + p] = (${body}); }
        { const long long r = t + 1; const in_t v = b; out[r * cols + p] = (${body}); }
        { const long long r = t + 2; const in_t v = c; out[r * cols + p] = (${body}); }
        { const long long r = t + 3; const in_t v = d; out[r * cols + p] = (${body}); }
    }
    for (; t < t1; ++t) { const long long r = t; const in_t v = x[t * cols + p]; out[r * cols + p] = (${body}); }
}
