"""Imported by a CPU worker that starts before the run, as it starts
(:data:`pipeline.exec.worker.LATER_CPU`): Numba, and its CPU target made ready.

The CPU kernels are Numba loops (:func:`pipeline.kernels.launch.cpu_jit`), loaded from Numba's
disk cache at their first call. That first call imports Numba and builds the target's typing and
lowering registries (its ``refresh``): on a 2-core machine 0.22 s and 0.29 s, about 150 modules,
which a worker made on its first kernel task while the run waited for it. The refresh holds
Numba's compiler lock, as a compilation does."""

import numba  # noqa: F401

try:  # a warm-up only: whatever fails here fails again, and is reported, at the first kernel
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:
        cpu_target.target_context.refresh()
except Exception:  # the worker's start goes on; its first kernel reports what is wrong
    pass
