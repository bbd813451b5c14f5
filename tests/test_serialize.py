"""CuPy arrays between a cluster's processes (``pipeline.exec.serialize``): the same arrays come
back, in the layout distributed's own module writes and reads, and sending one imports no Numba."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from .conftest import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

ARRAYS = {
    "float64 C": lambda cp: cp.arange(721 * 3, dtype=cp.float64).reshape(3, 721) / 7,
    "float32 F": lambda cp: cp.asfortranarray(cp.arange(60, dtype=cp.float32).reshape(6, 10)),
    "strided view": lambda cp: cp.arange(200, dtype=cp.int16).reshape(10, 20)[::3, 1::2],
    "0-d": lambda cp: cp.asarray(np.float32(2.5)),
    "empty": lambda cp: cp.zeros((0, 4), dtype=cp.int8),
    "bool": lambda cp: cp.arange(9).reshape(3, 3) % 2 == 0,
}


@pytest.mark.parametrize("serializers", [("dask",), ("cuda",)])
@pytest.mark.parametrize("name", ARRAYS)
def test_round_trip(name, serializers):
    import cupy as cp
    from distributed.protocol import deserialize, serialize

    from pipeline.exec import serialize as S

    assert S.register()
    x = ARRAYS[name](cp)
    header, frames = serialize(x, serializers=serializers)
    if serializers == ("dask",):
        assert all(not isinstance(f, cp.ndarray) for f in frames)  # host bytes, for TCP and spilling
    y = deserialize(header, frames, deserializers=serializers)
    assert isinstance(y, cp.ndarray) and y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x))


@pytest.mark.parametrize("name", ["float64 C", "float32 F", "strided view"])
def test_distributed_reads_ours_and_ours_reads_distributed(name):
    import cupy as cp
    from distributed.protocol import cupy as theirs

    from pipeline.exec import serialize as S

    x = ARRAYS[name](cp)
    header, frames = S.host_dumps(x)
    np.testing.assert_array_equal(cp.asnumpy(theirs.dask_deserialize_cupy_ndarray(header, frames)), cp.asnumpy(x))
    header, frames = theirs.dask_serialize_cupy_ndarray(x)
    np.testing.assert_array_equal(cp.asnumpy(S.host_loads(header, frames)), cp.asnumpy(x))
    header, frames = theirs.cuda_serialize_cupy_ndarray(x)
    np.testing.assert_array_equal(cp.asnumpy(S.cuda_loads(header, frames)), cp.asnumpy(x))


def test_sending_a_cupy_array_imports_no_numba():
    code = """
import sys
import cupy as cp
from distributed.protocol import deserialize, serialize
from pipeline.exec import serialize as S
S.register()
x = cp.arange(10.0)
for s in (("dask",), ("cuda",)):
    h, f = serialize(x, serializers=s)
    assert (deserialize(h, f, deserializers=s) == x).all()
print("numba" in sys.modules, "distributed.protocol.cupy" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
