"""Every code block of README.md and docs/*.md runs as written, in order within its page.

Each page's blocks run in a fresh working directory prepared as a user's checkout (the shipped
flows and profiles copied in), one after another, so that a block may use what an earlier block of
its page wrote (``pipeline run flows/climate_anomaly.yaml`` writes ``data/demo.zarr``, which the
Python block after it opens). ``python`` blocks run as scripts, ``bash``/``sh`` blocks as
scripts that stop at the first failing command (``-e``, and ``pipefail`` for bash), the commands
of ``console`` blocks (the lines after ``$ ``) likewise, and ``yaml`` blocks that are flows go
through ``pipeline validate``; each must exit 0. ``text`` blocks, and ``yaml`` blocks that are not flows (cluster profiles, dask's
own settings), are shown, not run.

A block that cannot run on a CPU-only machine without a cluster says so on the line before its
fence, ``<!-- not run in CI: REASON -->``, with REASON one of those in ``REASONS``, and the block
must show why (a GPU block names the GPU or CUDA, a SLURM block sbatch or SLURM, ...).

Installing the project from the checkout (``python -m pip install -e .``, or with the extras in
``INSTALLED_EXTRAS``) is taken as done: CI's ``.ci/run`` installs it that way with the extra
``test``, which holds the other extras' packages (checked here); the rest of such a line runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHECKOUT = ("flows", "configs")  # what a user's checkout has beside the docs that snippets name
LANGS = {"python", "bash", "sh", "console", "yaml", "text"}

# a reason, and the words (any one, case aside) a block skipped for it must contain
REASONS = {
    "needs a GPU": ("gpu", "cuda"),
    "needs a SLURM cluster": ("sbatch", "slurm"),
    "needs a running dask scheduler": ("dask scheduler", "dask cuda worker", "--scheduler", "attach"),
    "installs system packages": ("apt-get",),
    "CI's own command": ("pytest",),
}
INSTALLED_EXTRAS = ("test", "genomics")
INSTALL = re.compile(r"""(?:python -m )?pip install -e (?:\.|"\.\[([\w,-]+)\]")(?=\s|$)""")
FENCE = re.compile(r"^```(\S*)\s*$")
MARK = re.compile(r"^<!-- not run in CI: (.+?) -->$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    lang: str
    text: str
    skip: str | None  # the reason given, or None

    def __str__(self):
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        assert i < len(lines), f"{page.relative_to(ROOT)}:{start + 1}: a code block that is never closed"
        mark = MARK.match(lines[start - 1]) if start else None
        out.append(Block(page, start + 1, m.group(1), "\n".join(lines[start + 1:i]) + "\n", mark and mark.group(1)))
        i += 1
    return out


def runs(block: Block) -> bool:
    if block.skip or block.lang not in LANGS - {"text"}:
        return False  # an untagged block fails test_blocks_not_run_say_why
    return block.lang != "yaml" or is_flow(block.text)


def is_flow(text: str) -> bool:
    doc = yaml.safe_load(text)
    return isinstance(doc, dict) and {"source", "steps"} <= doc.keys()


def as_run(block: Block) -> str:
    """The block's commands, an installation from the checkout taken as done (see above)."""
    text = block.text
    if block.lang == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ ")) + "\n"
    for m in INSTALL.finditer(text):
        extras = set((m.group(1) or "").split(",")) - {""}
        assert extras <= set(INSTALLED_EXTRAS), f"{block}: {m.group(0)!r} installs extras CI has not installed"
    return INSTALL.sub("true", text)


def run_block(block: Block, n: int, workdir: Path, scripts: Path) -> None:
    env = {**os.environ, "DASK_PIPELINE__BACKEND": "cpu", "MPLBACKEND": "Agg",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # as a user's shell: conftest sets it for the tests' own process
    if block.lang == "python":
        script = scripts / f"block{n}.py"
        script.write_text(block.text)
        cmd = [sys.executable, str(script)]
    elif block.lang == "yaml":
        script = scripts / f"block{n}.yaml"
        script.write_text(block.text)
        cmd = ["pipeline", "validate", str(script)]
    else:
        script = scripts / f"block{n}.sh"
        script.write_text(as_run(block))
        cmd = ["sh", "-e", str(script)] if block.lang == "sh" else ["bash", "-e", "-o", "pipefail", str(script)]
    r = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (
        f"{block} exited {r.returncode}:\n{textwrap.indent(block.text, '    ')}\n"
        f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    )


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", [p for p in PAGES if any(map(runs, blocks(p)))], ids=page_id)
def test_snippets_run(page, tmp_path):
    workdir, scripts = tmp_path / "checkout", tmp_path / "snippets"
    workdir.mkdir()
    scripts.mkdir()
    for name in CHECKOUT:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, workdir / name)
    ran = 0
    for n, block in enumerate(blocks(page)):
        if runs(block):
            run_block(block, n, workdir, scripts)
            ran += 1
    assert ran


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_blocks_not_run_say_why(page):
    text = page.read_text().splitlines()
    fenced = {b.line - 2 for b in blocks(page)}  # the index of the line before each fence
    for i, line in enumerate(text):
        if line.startswith("<!-- not run in CI"):
            assert MARK.match(line), f"{page_id(page)}:{i + 1}: write it as <!-- not run in CI: REASON -->"
            assert i in fenced, f"{page_id(page)}:{i + 1}: {line} is not on the line before a code block"
    for block in blocks(page):
        assert block.lang in LANGS, (
            f"{block}: a code block of language {block.lang!r}; one of {sorted(LANGS)} "
            "(text for what is shown, not run)"
        )
        if block.skip is None:
            continue
        assert block.lang != "text", f"{block}: a text block is not run anyway: no comment needed"
        reason = next((r for r in REASONS if block.skip.startswith(r)), None)
        assert reason, f"{block}: not run because {block.skip!r}; the reasons are {list(REASONS)}"
        words = REASONS[reason]
        assert any(w in block.text.lower() for w in words), (
            f"{block}: not run because it {reason}, but it names none of {words}"
        )


def test_installed_extras_are_in_ci():
    """CI installs ".[test]": the extras the snippets take as installed are within it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in INSTALLED_EXTRAS:
        assert set(extras[name]) <= set(extras["test"]), name


def test_install_commands_name_this_project():
    """The name ``pipeline`` on PyPI is another project's: installs are from the checkout, with
    extras that exist."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] != "pipeline"
    assert project["scripts"]["pipeline"] == "pipeline.cli:script"
    for page in PAGES:
        text = page.read_text()
        assert "pipeline[" not in text, f"{page_id(page)}: names the PyPI project 'pipeline', not this one"
        for extras in re.findall(r"""-e ["']\.\[([\w,-]+)\]["']""", text):
            unknown = set(extras.split(",")) - set(project["optional-dependencies"])
            assert not unknown, f"{page_id(page)}: no extra {sorted(unknown)} in pyproject.toml"


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 200, f"README.md has {lines} lines; details go in docs/"


def test_the_package_lists_its_public_names_once():
    """dir(pipeline) is the public API, once each, with no internal module, before and after the
    lazy names are imported; importing pipeline imports none of the heavy libraries."""
    code = textwrap.dedent("""
        import json, sys
        import pipeline
        before = dir(pipeline)
        heavy = [m for m in ("dask.array", "xarray", "zarr", "numba") if m in sys.modules]
        for name in pipeline.__all__:
            getattr(pipeline, name)
        import pipeline.genomics, pipeline.exec.cluster  # submodules bind themselves on the package
        print(json.dumps({"before": before, "after": dir(pipeline), "all": pipeline.__all__, "heavy": heavy}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DASK_PIPELINE__BACKEND": "cpu"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["heavy"] == []
    assert out["before"] == out["after"] == sorted(out["all"])
    assert len(set(out["all"])) == len(out["all"])
    assert "__version__" in out["all"] and "open_dataset" in out["all"]
    for internal in ("config", "_version", "import_module", "_LAZY", "exec", "backend", "sources"):
        assert internal not in out["after"]
