"""The op registry: each op's name, its Python function, its parameters, and its kernels.

An op is a function of an ``xarray.DataArray`` (first argument) and keyword parameters. Its
parameters are read from its signature into a pydantic model, so flows are checked against the
same definition that Python callers use. Its kernels are declared by name (``"moments"``,
``"standardize"``) and reached through :func:`pipeline.kernels.get` as ``{name}_{backend}``, as
sgkit does: the op asks for each kernel it runs with :meth:`Op.kernel`, which refuses a kernel the
op did not declare, so what an op declares is what runs. Kernel modules are imported on first use,
so listing ops imports no kernel code.

An op also declares what its result is (:class:`pipeline.ops.metadata.Produces`): the registered
function sets those CF attributes on every result, so no op copies its input's attributes. A
Dataset op declares the variables it reads and adds (:mod:`pipeline.ops.genomics.variables`), which
``pipeline validate`` walks a flow through.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, create_model

from ..errors import KernelNotFound
from .metadata import Produces

_REGISTRY: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Op:
    name: str
    func: Callable
    description: str
    params: type[BaseModel]
    kernels: dict[str, tuple[str, ...]] = field(default_factory=dict)  # backend -> names of its kernels
    produces: Produces | None = None  # the attributes of its results
    dataset: bool = False  # takes and returns an xarray.Dataset (the genomics ops, as sgkit's), not a DataArray
    check: Callable | None = None  # (Meta, **params) -> Meta: the op's checks from metadata (pipeline.ops.shapes)
    variables: Any = None  # a Dataset op's variables read and added (pipeline.ops.genomics.variables.Declared)

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
    """A parameter's type as a reader writes it: ``int``, ``float | list[float]``, ``str | None``
    (the constraints of ``Annotated`` types are left to the validation messages)."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation)).replace("DataArray", "xarray.DataArray")


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


def _annotated(func: Callable, produces: Produces) -> Callable:
    """``func`` setting ``produces``'s attributes on its result, from its input and parameters."""
    sig = inspect.signature(func)

    @functools.wraps(func)
    def op(x, *args, **kwargs):
        out = func(x, *args, **kwargs)
        bound = sig.bind(x, *args, **kwargs)
        bound.apply_defaults()
        params = dict(list(bound.arguments.items())[1:])
        out.attrs = produces.attrs(x, params)
        return out

    return op


def register(
    *,
    kernels: tuple[str, ...] | dict[str, tuple[str, ...]],
    produces: Produces | None = None,
    description: str | None = None,
    dataset: bool = False,
    check: Callable | None = None,
    variables: Any = None,
):
    """Decorator: register an op under its function's name.

    ``kernels`` names the kernels the op runs (:data:`pipeline.kernels.FAMILIES`), the same on
    every backend, or per backend where they differ (``{"cpu": (...), "gpu": (...)}``).
    ``produces`` says what its result is (its CF attributes). ``dataset``: the op takes an
    ``xarray.Dataset`` and returns one, as sgkit's functions do (:mod:`pipeline.ops.genomics`).
    ``check`` gives the Meta of its result from its input's, raising InputError as the op would
    (for ``pipeline validate``; ops without one may have theirs in :data:`pipeline.ops.shapes.CHECKS`).
    ``variables``: a Dataset op's :class:`~pipeline.ops.genomics.variables.Declared`, what it reads
    and adds, by variable, which ``pipeline validate`` checks a flow's steps by.
    """
    from .. import kernels as _kernels

    if isinstance(kernels, str):
        kernels = (kernels,)
    if not isinstance(kernels, dict):
        kernels = dict.fromkeys(_kernels.BACKENDS, tuple(kernels))
    kernels = {b: tuple(names) for b, names in kernels.items()}
    if variables is not None and not dataset:
        raise ValueError("only a Dataset op declares variables")

    def wrap(func: Callable) -> Callable:
        doc = inspect.getdoc(func) or ""
        desc = description or doc.split("\n\n")[0].replace("\n", " ")
        public = _annotated(func, produces) if produces is not None else func
        op = Op(func.__name__, public, desc, _params_model(func), dict(kernels), produces, dataset, check, variables)
        if op.name in _REGISTRY:
            raise ValueError(f"op {op.name!r} is registered twice")
        _REGISTRY[op.name] = op
        public.op = op
        return public

    return wrap


def get(name: str) -> Op:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(unknown(name)) from None


def unknown(name: str, dataset: bool | None = None) -> str:
    """The message for an op that is not registered: the closest op's name, then the ops in a few
    wrapped lines, those of one variable and those of datasets (of one kind where ``dataset``
    says which: the others are only counted)."""
    import difflib
    import textwrap

    close = difflib.get_close_matches(name, _REGISTRY, n=1)
    lines = [f"unknown op {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")]
    for kind, label in ((False, "ops of one variable (source.variable)"), (True, "ops of datasets (source.variables)")):
        ops = [n for n in names() if _REGISTRY[n].dataset == kind]
        if dataset is None or dataset == kind:
            lines.append(textwrap.fill(", ".join(ops), 100, initial_indent=f"  {label}: ", subsequent_indent="    "))
        else:
            lines.append(f"  {label}: {len(ops)} more")
    lines[-1] += "; `pipeline ops` describes each op and its parameters"
    return "\n".join(lines)


def names() -> list[str]:
    return sorted(_REGISTRY)


def all_ops() -> list[Op]:
    return [_REGISTRY[n] for n in names()]
