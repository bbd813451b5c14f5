"""Imported by the workers of CPU clusters as they start (:data:`pipeline.exec.worker.WARM_CPU`),
and last by the fork server of a local CPU cluster: Numba, and its CPU target made ready.

The CPU kernels are Numba loops (:func:`pipeline.kernels.launch.cpu_jit`), loaded from Numba's
disk cache at their first call. That first call imports Numba and builds the target's typing and
lowering registries (its ``refresh``): on a 2-core machine 0.22 s and 0.29 s, about 150 modules,
which a worker made on its first kernel task while the run waited for it. Done here, in the fork
server, before any worker is forked (Numba starts no thread for this: the parallel threading
layers are started by ``parallel=True`` kernels, which pipeline does not use)."""

import numba  # noqa: F401

try:  # a warm-up only: whatever fails here fails again, and is reported, at the first kernel
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()
except Exception:  # the fork server runs its imports with nothing to report to
    pass
