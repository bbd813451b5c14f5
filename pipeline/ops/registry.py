"""The op registry: each op's name, its Python function, its parameters, and its kernels.

An op is a function of an ``xarray.DataArray`` (first argument) and keyword parameters. Its
parameters are read from its signature into a pydantic model, so flows are checked against the
same definition that Python callers use. Its kernels are declared by name (``"moments"``,
``"standardize"``) and reached through :func:`pipeline.kernels.get` as ``{name}_{backend}``, as
sgkit does: the op asks for each kernel it runs with :meth:`Op.kernel`, which refuses a kernel the
op did not declare, so what an op declares is what runs. Kernel modules are imported on first use,
so listing ops imports no kernel code.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, create_model

from ..errors import KernelNotFound

_REGISTRY: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Op:
    name: str
    func: Callable
    description: str
    params: type[BaseModel]
    kernels: dict[str, tuple[str, ...]] = field(default_factory=dict)  # backend -> names of its kernels

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends on which every kernel the op declares exists."""
        from .. import kernels

        return tuple(b for b in kernels.BACKENDS if b in self.kernels and all(kernels.has(k, b) for k in self.kernels[b]))

    def kernel(self, name: str, backend: str) -> Callable:
        """The kernel ``name`` for ``backend`` ("cpu" or "gpu"), one of those the op declares."""
        from .. import kernels

        if name not in self.kernels.get(backend, ()):
            declared = ", ".join(self.kernels.get(backend, ())) or "none"
            raise KernelNotFound(
                f"op {self.name!r} has no {backend} kernel {name!r} (it declares: {declared}; "
                f"its backends: {', '.join(self.backends) or 'none'})"
            )
        return kernels.get(name, backend)

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


def register(*, kernels: tuple[str, ...] | dict[str, tuple[str, ...]], description: str | None = None):
    """Decorator: register an op under its function's name.

    ``kernels`` names the kernels the op runs (:data:`pipeline.kernels.FAMILIES`), the same on
    every backend, or per backend where they differ (``{"cpu": (...), "gpu": (...)}``).
    """
    from .. import kernels as _kernels

    if isinstance(kernels, str):
        kernels = (kernels,)
    if not isinstance(kernels, dict):
        kernels = dict.fromkeys(_kernels.BACKENDS, tuple(kernels))
    kernels = {b: tuple(names) for b, names in kernels.items()}

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
