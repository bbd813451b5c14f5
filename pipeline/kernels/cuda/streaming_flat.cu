
typedef ${in_t} in_t;
typedef ${out_t} out_t;
__device__ __forceinline__ out_t f(in_t x${decl}) { ${body} }
extern "C" __global__ void ${name}(const in_t* __restrict__ x, out_t* __restrict__ out, long long n${decl}) {
    const long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * S < n; i += 4 * S) {
        in_t a = x[i], b = x[i + S], c = x[i + 2 * S], d = x[i + 3 * S];
        out[i] = f(a${call}); out[i + S] = f(b${call}); out[i + 2 * S] = f(c${call}); out[i + 3 * S] = f(d${call});
    }
    for (; i < n; i += S) out[i] = f(x[i]${call});
}
