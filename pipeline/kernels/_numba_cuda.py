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
