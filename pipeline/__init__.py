"""pipeline: out-of-core array pipelines on GPUs and CPUs.

Chunked Zarr / NetCDF datasets are opened as xarray objects over Dask arrays of NumPy or CuPy
chunks, transformed chunk by chunk by the registered ops, reduced as trees of partials, and
written back to Zarr. The same code runs on a laptop without a GPU and on a GPU cluster.

The names below are imported on first use (PEP 562), so that a command that needs none of them
(``pipeline --help``, ``pipeline validate`` of a flow without data) does not pay for importing
dask.array, xarray, zarr or numba.
"""

from importlib import import_module as _import_module

from ._version import __version__
from . import config  # noqa: F401  (registers pipeline's defaults in dask's config)

# name -> (module, attribute; None for the module itself)
_LAZY = {
    "ops": (".ops", None),
    "genomics": (".genomics", None),
    "gpu_available": (".backend", "gpu_available"),
    "resolve_backend": (".backend", "resolve"),
    "to_numpy": (".backend", "to_numpy"),
    "BackendError": (".errors", "BackendError"),
    "InputError": (".errors", "InputError"),
    "PipelineError": (".errors", "PipelineError"),
    "compute": (".exec.compute", "compute"),
    "convert": (".sinks.convert", "convert"),
    "write_zarr": (".sinks.zarr", "write_zarr"),
    "open_dataset": (".sources", "open_dataset"),
    "import_vcf": (".demo_genomics", "import_vcf"),
}


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}") from None
    value = _import_module(module, __name__)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


__all__ = [*_LAZY, "__version__"]


def __dir__():
    # the public names only: importing a submodule binds it here too (pipeline.config,
    # pipeline.backend, ...), and a lazy name once imported is in globals() as well
    return sorted(__all__)
