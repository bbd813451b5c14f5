"""The package's layout: no import cycles, and each folder imports only the layers below it.

The data path is the layout (docs/architecture.md): sources -> ops (kernels, reduce) -> exec ->
sinks, with the GPU's I/O (reading, and compressing what convert writes) in gpu/. This test walks every import of every module, those inside
functions too, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pipeline"

# what each part of the package may import from the rest of it (besides itself)
FOUNDATION = {"errors", "config", "state", "log", "_version", "deferred"}
ALLOWED = {
    "errors": set(),
    "config": {"errors"},  # a bad setting is an InputError
    "state": set(),
    "log": {"config", "errors"},  # the log's format and level are settings
    "_version": set(),
    "deferred": set(),
    "backend": {"errors", "config", "state", "deferred"},
    "kernels": {"backend", "errors", "config", "_version"},
    "gpu": {"backend", "kernels", *FOUNDATION},
    "reduce": {"backend", "kernels", *FOUNDATION},
    "exec": {"backend", "kernels", "gpu", "reduce", *FOUNDATION},
    "patches": {"backend", "kernels", *FOUNDATION},  # changes to dask and xarray; device chunk functions
    "sources": {"backend", "kernels", "gpu", "reduce", "exec", "patches", *FOUNDATION},
    "sinks": {"backend", "exec", "sources", "gpu", *FOUNDATION},  # gpu: nvCOMP compresses convert's frames
    "ops": {"backend", "kernels", "reduce", "exec", "patches", *FOUNDATION},  # patches: the generic steps on GPU data
    "demo": {"sinks", *FOUNDATION},
    "demo_genomics": {"sinks", "sources", *FOUNDATION},  # sources: import-vcf's sample table
}
TOP = {"flows", "bench", "cli", "genomics", "__init__", "__main__"}  # may import anything


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its body."""

    def known(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.split(".")[0] != "pipeline":
                    continue
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    out.add(known(sub if sub in mods else mod))
            elif isinstance(node, ast.Import):
                out.update(known(a.name) for a in node.names if a.name.split(".")[0] == "pipeline")
        out.discard(name)
        edges[name] = out
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_no_import_cycles():
    assert _cycles(_imports(_modules())) == []


def test_cycles_are_found():
    """The walker itself: a cycle through a function-level import is reported."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_part_imports_only_the_layers_below():
    wrong = []
    for module, targets in _imports(_modules()).items():
        part = _part(module)
        if part in TOP:
            continue
        assert part in ALLOWED, f"{module}: a part of the package this test does not know; add it to ALLOWED"
        for t in targets:
            if _part(t) not in (part, "__init__") and _part(t) not in ALLOWED[part]:
                wrong.append(f"{module} imports {t}")
            if _part(t) == "__init__" and t == "pipeline":
                wrong.append(f"{module} imports the top-level package")
    assert wrong == []


def test_nothing_imports_cupy_at_module_level():
    """``import pipeline`` works without CUDA: CuPy and numba.cuda are imported inside functions."""
    top_level = []
    for name, path in _modules().items():
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            top_level += [f"{name}: {n}" for n in names if n.split(".")[0] in ("cupy", "cupyx") or n == "numba.cuda"]
    assert top_level == []


def test_python_dash_m_pipeline_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "pipeline", "--version"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("pipeline ")


@pytest.mark.parametrize("part", ["kernels", "reduce", "ops"])
def test_no_backend_checks_in_kernels_reductions_or_ops(part):
    """One dispatch path: a kernel is chosen by name and backend through the registry, never by
    looking at a block's type."""
    found = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in (PACKAGE / part).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "is_cupy(" in line
    ]
    assert found == []


@pytest.mark.parametrize("argv", [["-m", "pipeline", "--help"], ["-c", "import pipeline, pipeline.cli"]])
def test_the_command_line_imports_no_array_library_it_does_not_use(argv):
    """`pipeline --help` (and `import pipeline`) import no dask.array, distributed, xarray, zarr,
    numba or CuPy: the package's names are imported on first use."""
    heavy = ("dask.array", "distributed", "xarray", "zarr", "numba", "cupy")
    probe = "import atexit, sys; atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in %r or m == 'dask.array'), file=sys.stderr))" % (heavy,)
    r = subprocess.run([sys.executable, "-c", f"{probe}; sys.argv = ['pipeline', *{argv[2:]!r}]; import runpy; runpy.run_module('pipeline', run_name='__main__')"
                        if argv[0] == "-m" else f"{probe}; {argv[1]}"], capture_output=True, text=True)
    loaded = r.stderr.split("LOADED", 1)[1].strip()
    assert loaded == "[]", loaded
