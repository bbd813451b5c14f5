"""Arrays between the processes of a cluster: CuPy's without importing Numba, and NumPy's aligned.

distributed serializes a CuPy array with ``distributed.protocol.cupy``, which it imports at the
first CuPy array a process sends or receives. That module imports Numba's CUDA driver
(``distributed.protocol.rmm``, else ``distributed.protocol.numba``) only to turn received host
bytes into device memory, which CuPy does itself. Measured on the 2-GPU H200 machine
(``benchmarks/scaling.py --processes 3 --trace``, ``pipeline run --cluster local-gpu`` over 12 GB
of Zarr v3): the first partial that went from one worker to the other waited 0.9-1.4 s, the
sending worker importing Numba and then the receiving one, each 0.4-0.5 s; nothing else ran
meanwhile.

:func:`register` puts the same four functions on ``cupy.ndarray`` first: the headers and frames
are distributed's own (``__cuda_array_interface__`` and the strides; one frame of the bytes), so
a process that uses distributed's module reads what these write, and the other way round. Host
bytes become device memory from CuPy's pool, as the rest of the run's arrays, rather than Numba's.

NumPy arrays (:func:`register_aligned`): distributed makes a received array on its frame where it
lies in the message, and a small frame can lie at any byte (an array of float64 came at an address
of 54 mod 64). NumPy computes on such an array by other paths than on an aligned one: its matrix
products leave BLAS for a loop of its own, whose sums round otherwise. The Q of a GWAS's covariates,
received so, gave other betas in their last bits than the same Q made on the worker that used it.
Each such array is copied to memory aligned to its type as it arrives (a few small frames: a large
frame is read into a buffer of its own, which is aligned).
"""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin


def register() -> bool:
    """Register the serializers of ``cupy.ndarray`` (idempotent); False where CuPy is missing."""
    try:
        import cupy
    except ImportError:
        return False
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.protocol.serialize import dask_deserialize, dask_serialize

    for dispatch, fn in ((cuda_serialize, cuda_dumps), (cuda_deserialize, cuda_loads),
                         (dask_serialize, host_dumps), (dask_deserialize, host_loads)):
        dispatch.register(cupy.ndarray, fn)
    return True


def cuda_dumps(x):
    """Header and one device frame (``distributed.protocol.cupy.cuda_serialize_cupy_ndarray``)."""
    import cupy

    if not (x.flags["C_CONTIGUOUS"] or x.flags["F_CONTIGUOUS"]):
        x = cupy.array(x, copy=True)
    header = x.__cuda_array_interface__.copy()
    header["strides"] = tuple(x.strides)
    return header, [cupy.ndarray(shape=(x.nbytes,), dtype=cupy.dtype("u1"), memptr=x.data, strides=(1,))]


def cuda_loads(header, frames):
    import cupy

    (frame,) = frames
    return cupy.ndarray(shape=header["shape"], dtype=header["typestr"], memptr=cupy.asarray(frame).data,
                        strides=header["strides"])


def host_dumps(x):
    """Header and one host frame: the device frame copied to the host."""
    import cupy

    header, frames = cuda_dumps(x)
    return header, [memoryview(cupy.asnumpy(f)) for f in frames]


def host_loads(header, frames):
    import cupy
    import numpy as np

    (frame,) = frames
    device = cupy.asarray(np.frombuffer(frame, dtype=np.uint8))  # one copy to the device, from CuPy's pool
    return cuda_loads(header, [device])


def register_aligned() -> None:
    """Have this process copy each NumPy array it receives that is not aligned to its type
    (idempotent; distributed's own deserializer makes it first)."""
    import numpy as np
    from distributed.protocol.serialize import dask_deserialize

    loads = dask_deserialize.dispatch(np.ndarray)
    if getattr(loads, "aligned", False):
        return

    def aligned_loads(header, frames):
        x = loads(header, frames)
        if isinstance(x, np.ndarray) and not x.flags.aligned:
            writeable, x = x.flags.writeable, x.copy(order="K")
            x.flags.writeable = writeable
        return x

    aligned_loads.aligned = True
    dask_deserialize.register(np.ndarray, aligned_loads)


class AlignedArrays(WorkerPlugin):
    """A distributed worker plugin: the worker copies the NumPy arrays it receives unaligned
    (:func:`register_aligned`), for the workers of a cluster that did not start with pipeline's
    preload (``pipeline.exec.worker``): one pipeline attached to, or a client of the user's."""

    name = "pipeline-aligned-arrays"
    idempotent = True

    def setup(self, worker) -> None:
        register_aligned()
