"""pipeline: out-of-core array pipelines on GPUs and CPUs.

Chunked Zarr / NetCDF datasets are opened as xarray objects over Dask arrays of NumPy or CuPy
chunks, transformed chunk by chunk by the registered ops, reduced as trees of partials, and
written back to Zarr. The same code runs on a laptop without a GPU and on a GPU cluster.
"""

from ._version import __version__
from . import config  # noqa: F401  (registers pipeline's defaults in dask's config)
from . import ops
from .backend import gpu_available, resolve as resolve_backend, to_numpy
from .errors import BackendError, InputError, PipelineError
from .exec.compute import compute
from .sinks.convert import convert
from .sinks.zarr import write_zarr
from .sources import open_dataset

__all__ = [
    "BackendError",
    "InputError",
    "PipelineError",
    "compute",
    "convert",
    "gpu_available",
    "open_dataset",
    "ops",
    "resolve_backend",
    "to_numpy",
    "write_zarr",
    "__version__",
]
