"""Ops: ``pipeline.ops.<name>(data_array, **params)``; the same names are the steps of flows.

Each module below registers its ops on import (see :mod:`pipeline.ops.registry`); every
registered op is an attribute of this package.

>>> import pipeline
>>> "standardized_anomaly" in pipeline.ops.names()
True
"""

from . import climate, fields, generic, genomics, grouped  # noqa: F401  (importing registers the ops)
from .registry import Op, all_ops, get, names, register


def __getattr__(name: str):
    try:
        return get(name).func
    except KeyError:
        raise AttributeError(f"pipeline.ops has no op {name!r}; ops: {', '.join(names())}") from None


def __dir__():
    return sorted([*globals(), *names()])


__all__ = ["Op", "all_ops", "get", "names", "register", *names()]
