"""Kernels: small functions of one chunk, one file per family.

A kernel's CPU version takes NumPy arrays and its GPU version CuPy arrays; launch configuration,
axis moves and compilation live beside them in the same file, the mathematics in the kernel.
Nothing here imports CuPy or ``numba.cuda`` at module level: GPU kernels are compiled on first use.
"""
