"""``numba.cuda``, imported once for the CUDA kernel modules (which import it from here, so that
``cuda`` is a global of each kernel's module, as Numba's CUDA simulator requires)."""

import numpy as np

# numba-cuda 0.30 registers an overload for np.row_stack when it first compiles a kernel; NumPy 2.5
# removed that alias (deprecated since 2.0), and the compile then fails with AttributeError.
# Restoring the alias, which NumPy defined as vstack, lets those versions work together.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

__all__ = ["cuda"]


def launch(kernel, npts: int, threads: int, *args):
    """Launch ``kernel`` over ``npts`` points, ``threads`` to a block.

    CuPy arguments: on CuPy's current stream, so the kernel is ordered with CuPy's work on it
    without the host waiting. By default numba-cuda would synchronise the host with the stream each
    CuPy argument names, and launch on the legacy default stream, which serialises every Dask
    thread behind the GPU. Anything else (NumPy under the simulator) is launched as it is.
    """
    blocks = max(1, -(-npts // threads))
    if any(hasattr(a, "__cuda_array_interface__") for a in args) and hasattr(cuda, "external_stream"):
        import cupy

        stream = cuda.external_stream(cupy.cuda.get_current_stream().ptr)
        args = [cuda.as_cuda_array(a, sync=False) if hasattr(a, "__cuda_array_interface__") else a for a in args]
        kernel[blocks, threads, stream](*args)
    else:
        kernel[blocks, threads](*args)
