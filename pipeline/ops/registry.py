"""The op registry: each op's name, its Python function, its parameters, and its kernels.

An op is a function of an ``xarray.DataArray`` (first argument) and keyword parameters. Its
parameters are read from its signature into a pydantic model, so flows are checked against the
same definition that Python callers use. Its kernels are named per backend as
``"module:function"`` strings and imported on first use, as sgkit does, so that listing ops
imports no kernel code and a missing backend is reported by name.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, create_model

_REGISTRY: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Op:
    name: str
    func: Callable
    description: str
    params: type[BaseModel]
    kernels: dict[str, str] = field(default_factory=dict)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(sorted(self.kernels))

    def kernel(self, backend: str) -> Callable:
        """The kernel of this op for ``backend`` ("cpu" or "gpu")."""
        try:
            target = self.kernels[backend]
        except KeyError:
            raise NotImplementedError(
                f"op {self.name!r} has no {backend} implementation "
                f"(it has: {', '.join(self.backends) or 'none'})"
            ) from None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def parameters(self) -> dict[str, dict[str, Any]]:
        """Name -> {"type", "default", "required"}, for listings and generated help."""
        out = {}
        for name, f in self.params.model_fields.items():
            out[name] = {
                "type": _type_name(f.annotation),
                "required": f.is_required(),
                "default": None if f.is_required() else f.default,
            }
        return out


def _type_name(annotation) -> str:
    import typing

    text = str(annotation) if typing.get_args(annotation) else getattr(annotation, "__name__", str(annotation))
    return text.replace("typing.", "").replace("collections.abc.", "").replace("xarray.core.dataarray.", "xarray.")


def _params_model(func: Callable) -> type[BaseModel]:
    sig = inspect.signature(func)
    hints = inspect.get_annotations(func, eval_str=True)
    fields = {}
    for i, (name, p) in enumerate(sig.parameters.items()):
        if i == 0:  # the data array
            continue
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[name] = (hints.get(name, Any), default)
    return create_model(
        f"{func.__name__}_params",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
        **fields,
    )


def register(*, kernels: dict[str, str] | str, description: str | None = None):
    """Decorator: register an op under its function's name.

    ``kernels`` maps each backend to ``"module:function"``; a single string names one function
    written against the array module of its input, which serves both backends.
    """
    if isinstance(kernels, str):
        kernels = {"cpu": kernels, "gpu": kernels}

    def wrap(func: Callable) -> Callable:
        doc = inspect.getdoc(func) or ""
        desc = description or doc.split("\n\n")[0].replace("\n", " ")
        op = Op(func.__name__, func, desc, _params_model(func), dict(kernels))
        if op.name in _REGISTRY:
            raise ValueError(f"op {op.name!r} is registered twice")
        _REGISTRY[op.name] = op
        func.op = op
        return func

    return wrap


def get(name: str) -> Op:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(_REGISTRY))}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def all_ops() -> list[Op]:
    return [_REGISTRY[n] for n in names()]
