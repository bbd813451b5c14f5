// Hard calls from genotype probabilities (sgkit's convert_probability_to_call): gp (calls, 3), the
// probabilities of hom ref, het and hom alt, C-contiguous -> out (calls, 2) int8 alleles. A call is
// made where no probability is NaN, the largest is unique and, with threshold > 0, at least the
// threshold (compared in double, as sgkit's float64 threshold); else both alleles are -1. The
// largest is the first of equal ones (NumPy's argmax), compared in the probabilities' type. The
// Python twin: hard_calls_cpu in pipeline/kernels/genotypes.py. A thread a call, grid-stride.

typedef ${prob_t} prob_t;

extern "C" __global__ void pipeline_hard_calls(const prob_t* __restrict__ gp, signed char* __restrict__ out,
                                               long long calls, double threshold) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < calls; i += stride) {
        const prob_t a = gp[3 * i], b = gp[3 * i + 1], c = gp[3 * i + 2];
        signed char g0 = -1, g1 = -1;
        if (!(isnan((double)a) || isnan((double)b) || isnan((double)c))) {
            int k = 0;
            prob_t top = a;
            if (b > top) { k = 1; top = b; }
            if (c > top) { k = 2; top = c; }
            const bool unique = (int)(a == top) + (int)(b == top) + (int)(c == top) == 1;
            if (unique && !(threshold > 0.0 && (double)top < threshold)) {
                g0 = k == 0 ? 0 : 1;
                g1 = k == 2 ? 1 : 0;
            }
        }
        out[2 * i] = g0;
        out[2 * i + 1] = g1;
    }
}
