"""pipeline's errors: one hierarchy under :class:`PipelineError`.

The CLI turns the errors of the input (:class:`InputError` and its children, and
:class:`BackendError`) into exit code 2 and a message that names the file, the key or the variable
and what was expected; any other error is a failure (exit code 1).
"""


class PipelineError(Exception):
    """Base of every error pipeline raises on purpose."""


class InputError(PipelineError, ValueError):
    """Bad input: a flow, a parameter, a file, a variable or a dimension that is not as expected."""


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


__all__ = ["BackendError", "DecodeError", "FlowError", "InputError", "KernelNotFound", "PipelineError", "UnsupportedLayout"]
