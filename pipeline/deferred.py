"""Modules imported on first use of one of their attributes.

Importing ``dask.array`` takes a few tenths of a second and pulls in pandas, SciPy and Numba's
helpers. The ops, the reductions and the spill module name it at their top, but only their
functions use it: through :func:`module`, importing them (to list the ops, to check a flow's
parameters in ``pipeline validate``) does not import it; the first graph built does.
"""

from __future__ import annotations

import importlib
import types


class _Deferred(types.ModuleType):
    """Stands for the module ``name`` until one of its attributes is read, then forwards to it."""

    def __init__(self, name: str):
        super().__init__(name, f"deferred import of {name}")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # copy, pickle and introspection ask for dunders: not a use
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


def module(name: str) -> types.ModuleType:
    """``name``, imported when one of its attributes is first read (``da = module("dask.array")``)."""
    return _Deferred(name)
