"""GPU kernels that stream contiguous arrays once, with several loads in flight per thread.

CuPy's ``ElementwiseKernel`` gives each thread one element at a time. On an H200 that keeps
about 1 MB of loads in flight, and by Little's law (bandwidth = bytes in flight / latency) it
runs at 1.2-1.7 TB/s, 30-40% of the 4.1 TB/s copy bandwidth (benchmarks/ops_bandwidth.py; the
same holds for ``cupy.fuse``). These kernels unroll their loops four times, loading four
independent elements before using any, which is enough to reach the copy bandwidth.

Two shapes of kernel, generated from a C expression and compiled once per dtype pair:

- ``flat``: ``out[i] = f(x[i])`` over all elements (grid-stride loop);
- ``column``: a (rows, cols) array, one thread per column and per tile of rows, so per-column
  values (a mean, a standard deviation) are read once into registers and rows of a table are
  picked by row (``values[labels[t] * cols + p]``).

No fused multiply-add (``--fmad=false``): ``a * b + c`` rounds twice, as NumPy does, and results
are bit-identical to the CPU twins of these kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

THREADS = 256
TILE_ROWS = 64  # rows per thread in column kernels: enough columns x tiles to fill the GPU

C_TYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int32): "int",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint64): "unsigned long long",
}

_FLAT = r"""
typedef {in_t} in_t;
typedef {out_t} out_t;
__device__ __forceinline__ out_t f(in_t x{decl}) {{ {body} }}
extern "C" __global__ void {name}(const in_t* __restrict__ x, out_t* __restrict__ out, long long n{decl}) {{
    const long long S = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * S < n; i += 4 * S) {{
        in_t a = x[i], b = x[i + S], c = x[i + 2 * S], d = x[i + 3 * S];
        out[i] = f(a{call}); out[i + S] = f(b{call}); out[i + 2 * S] = f(c{call}); out[i + 3 * S] = f(d{call});
    }}
    for (; i < n; i += S) out[i] = f(x[i]{call});
}}
"""

_COLUMN = r"""
typedef {in_t} in_t;
typedef {out_t} out_t;
extern "C" __global__ void {name}(const in_t* __restrict__ x, out_t* __restrict__ out,
                                  long long rows, long long cols, long long tile{decl}) {{
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= cols) return;
    const long long t0 = (long long)blockIdx.y * tile;
    const long long t1 = min(rows, t0 + tile);
    {prelude}
    long long t = t0;
    for (; t + 3 < t1; t += 4) {{
        in_t a = x[t * cols + p], b = x[(t + 1) * cols + p], c = x[(t + 2) * cols + p], d = x[(t + 3) * cols + p];
        {{ const long long r = t;     const in_t v = a; out[r * cols + p] = ({body}); }}
        {{ const long long r = t + 1; const in_t v = b; out[r * cols + p] = ({body}); }}
        {{ const long long r = t + 2; const in_t v = c; out[r * cols + p] = ({body}); }}
        {{ const long long r = t + 3; const in_t v = d; out[r * cols + p] = ({body}); }}
    }}
    for (; t < t1; ++t) {{ const long long r = t; const in_t v = x[t * cols + p]; out[r * cols + p] = ({body}); }}
}}
"""


@dataclass(frozen=True)
class Spec:
    """A streaming kernel: its shape (``flat`` or ``column``), name, extra parameters as
    (C type, name) pairs, its expression, and for column kernels what each thread reads first."""

    kind: str
    name: str
    params: tuple[tuple[str, str], ...]
    body: str
    prelude: str = ""

    def source(self, in_dtype, out_dtype) -> str:
        """The CUDA source for these element types (the tests compile it with nvcc too)."""
        decl = "".join(f", {ctype} {pname}" for ctype, pname in self.params)
        call = "".join(f", {pname}" for _, pname in self.params)
        template = _FLAT if self.kind == "flat" else _COLUMN
        return template.format(
            in_t=C_TYPES[np.dtype(in_dtype)], out_t=C_TYPES[np.dtype(out_dtype)], name=self.name,
            decl=decl, call=call, body=self.body, prelude=self.prelude,
        )


@functools.cache
def _compiled(spec: Spec, in_dtype, out_dtype):
    import cupy

    return cupy.RawKernel(spec.source(in_dtype, out_dtype), spec.name, options=("--fmad=false", "-std=c++17"))


@functools.cache
def _sm_count() -> int:
    import cupy

    return cupy.cuda.Device().attributes["MultiProcessorCount"]


def run(spec: Spec, x, out, *args):
    """Launch ``spec`` over C-contiguous ``x`` into ``out``: flat kernels over all elements,
    column kernels over a 2-D (rows, cols) array. ``args`` follow ``spec.params``."""
    kernel = _compiled(spec, np.dtype(x.dtype), np.dtype(out.dtype))
    if spec.kind == "flat":
        n = x.size
        blocks = max(1, min((n + THREADS * 4 - 1) // (THREADS * 4), _sm_count() * 32))
        kernel((blocks,), (THREADS,), (x, out, np.int64(n), *args))
    else:
        rows, cols = x.shape
        grid = (max(1, (cols + THREADS - 1) // THREADS), max(1, (rows + TILE_ROWS - 1) // TILE_ROWS))
        kernel(grid, (THREADS,), (x, out, np.int64(rows), np.int64(cols), np.int64(TILE_ROWS), *args))
    return out
