"""NumPy arrays received from another process come aligned to their type
(``pipeline.exec.serialize.register_aligned``): distributed makes an array on its frame where it
lies in a message, at any byte, and NumPy's products take another path on such an array."""

from __future__ import annotations

import numpy as np
import pytest


def _received_at_odd_byte(x: np.ndarray, writeable: bool = True):
    """``x`` serialized by distributed, and deserialized from a frame at byte 3 of a buffer."""
    from distributed.protocol import deserialize, serialize

    header, frames = serialize(x, serializers=("dask",))
    (frame,) = frames
    buf = bytearray(len(memoryview(frame).cast("B")) + 3)
    buf[3:] = memoryview(frame).cast("B")
    header["sub-header"]["writeable"] = (writeable,)
    return deserialize(header, [memoryview(buf)[3:]], deserializers=("dask",))


@pytest.mark.parametrize("writeable", [True, False])
def test_an_array_on_an_odd_byte_arrives_aligned(writeable):
    from pipeline.exec import serialize

    x = np.arange(35.0).reshape(5, 7) / 3
    f = np.asfortranarray(x)
    serialize.register_aligned()
    serialize.register_aligned()  # idempotent: one wrapper
    for a in (x, f):
        got = _received_at_odd_byte(a, writeable)
        assert got.flags.aligned and got.flags.writeable == writeable
        assert got.flags.c_contiguous == a.flags.c_contiguous and got.flags.f_contiguous == a.flags.f_contiguous
        assert got.tobytes(order="A") == a.tobytes(order="A") and got.dtype == a.dtype

