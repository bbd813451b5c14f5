"""pipeline's errors: one hierarchy under :class:`PipelineError`.

The CLI turns the errors of the input (:class:`InputError` and its children, and
:class:`BackendError`) into exit code 2 and a message that names the file, the key or the variable
and what was expected; any other error is a failure (exit code 1). :func:`chunk_error` builds the
error for a chunk that could not be read.
"""

import itertools
import math

import numpy as np


class PipelineError(Exception):
    """Base of every error pipeline raises on purpose."""


class InputError(PipelineError, ValueError):
    """Bad input: a flow, a parameter, a file, a variable or a dimension that is not as expected."""


class NotImplementedInputError(InputError, NotImplementedError):
    """Input of a kind sgkit raises ``NotImplementedError`` for (a ploidy or a number of alleles it
    does not handle): also a ``NotImplementedError``, so code written for sgkit catches it."""


class LinAlgInputError(InputError, np.linalg.LinAlgError):
    """Data sgkit's linear algebra fails on with ``numpy.linalg.LinAlgError`` (a matrix without
    full rank): also a ``LinAlgError``, so code written for sgkit catches it."""


class UnknownKeyInputError(InputError, KeyError):
    """Bad input that sgkit reports as a ``KeyError`` (a pedigree's parent that is no sample's)."""

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])


class MissingLibraryInputError(InputError, RuntimeError):
    """An optional library a function needs is not installed (graphviz for ``display_pedigree``),
    which sgkit reports as a ``RuntimeError``."""


class FlowError(InputError):
    """A flow file that does not validate: each message names the file and the key."""


class BackendError(PipelineError, RuntimeError):
    """The requested backend is not available here, or host and device arrays were mixed."""


class KernelNotFound(PipelineError, NotImplementedError):
    """No kernel of that name for that backend."""


class UnsupportedLayout(PipelineError):
    """A store's layout is outside what the GPU reader decodes; zarr reads it instead."""


class DecodeError(PipelineError, RuntimeError):
    """nvCOMP refused or failed to decode frames (zarr decodes that block instead)."""


class EncodeError(PipelineError, RuntimeError):
    """nvCOMP failed to compress frames (the CPU compresses that block instead)."""


def chunk_error(path, variable: str, region: tuple[slice, ...], error: Exception, zarr_array=None) -> InputError:
    """The InputError for a block of ``variable`` that could not be read: the store, the variable,
    the stored chunk (located within ``region`` where ``zarr_array`` is given) and the decoder's
    message."""
    where = "values " + ", ".join(f"{s.start}:{s.stop}" for s in region)
    if zarr_array is not None:
        where = _failing_chunk(zarr_array, region) or where
    return InputError(
        f"{path}: variable {variable!r}: {where} could not be read (corrupt or unreadable data)\n"
        f"  {type(error).__name__}: {error}"
    )


def _failing_chunk(arr, region: tuple[slice, ...]) -> str | None:
    """``chunk (i, j, ..) (file KEY)`` of the first stored chunk (or shard) of ``region`` that zarr
    fails to read, or None where each reads on its own."""
    grid = tuple(arr.shards or arr.chunks)
    ranges = [range(s.start // c, math.ceil(s.stop / c)) for s, c in zip(region, grid)]
    for coords in itertools.product(*ranges):
        sel = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, grid, arr.shape))
        try:
            arr[sel]
        except Exception:
            return f"chunk {coords} (file {arr.metadata.encode_chunk_key(coords)})"
    return None


__all__ = ["BackendError", "chunk_error", "DecodeError", "FlowError", "InputError", "KernelNotFound", "LinAlgInputError",
           "NotImplementedInputError", "PipelineError", "UnsupportedLayout"]
