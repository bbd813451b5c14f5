"""Building the CUDA C binaries that pipeline ships (:mod:`.prebuilt`), on a machine with nvcc.

    python -m pipeline.kernels.build add FILE   # merge what PIPELINE_RECORD_KERNELS=FILE recorded
    python -m pipeline.kernels.build build      # compile what lacks its binary; remove stale ones
    python -m pipeline.kernels.build check      # every entry has the binary of its current source

The manifest (``cuda/prebuilt/manifest.json``) lists instantiations: a ``.cu`` file with its
placeholders and options, or a streaming kernel's :class:`.launch.Spec` with its element types.
``benchmarks/record_kernels.sh`` records those that the shipped flows, the genomics ops and the
stores users have meet, on a GPU machine. ``build`` renders each as :mod:`.launch` does and
compiles it with nvcc for :data:`.prebuilt.ARCHS`; an entry whose kernel does not compile for an
architecture (thread block clusters need sm_90) is built for the others. The tests run ``check``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import launch, prebuilt


def render(entry: dict) -> tuple[str, tuple[str, ...]]:
    """The source and options of a manifest entry, as :mod:`.launch` renders them today."""
    if "file" in entry:
        return launch.cuda_source(entry["file"], **entry["params"]), tuple(entry["options"])
    s = entry["spec"]
    spec = launch.Spec(s["kind"], s["name"], tuple(tuple(p) for p in s["params"]), s["body"], s["prelude"])
    return spec.source(np.dtype(entry["in"]), np.dtype(entry["out"])), launch.FMAD_CXX17


def _describe(entry: dict) -> str:
    if "file" in entry:
        return f"{entry['file']} {entry['params']}"
    return f"{entry['spec']['name']} {entry['in']}->{entry['out']}"


# --- the manifest ----------------------------------------------------------------------------------


def manifest() -> list[dict]:
    return json.loads(prebuilt.MANIFEST.read_text()) if prebuilt.MANIFEST.is_file() else []


def _write_manifest(entries: list[dict]) -> None:
    unique = {json.dumps(e, sort_keys=True): e for e in entries}
    ordered = [unique[k] for k in sorted(unique)]
    prebuilt.MANIFEST.write_text(json.dumps(ordered, indent=1, sort_keys=True) + "\n")


def add(records: Path) -> int:
    """Merge the instantiations recorded in ``records`` into the manifest; returns how many are new."""
    entries = manifest()
    before = {json.dumps(e, sort_keys=True) for e in entries}
    new = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    _write_manifest(entries + new)
    return len({json.dumps(e, sort_keys=True) for e in new} - before)


def problems() -> list[str]:
    """What is wrong with the shipped binaries: an entry whose current source has no binary, or a
    binary that no entry names."""
    wanted = {}
    out = []
    for entry in manifest():
        try:
            source, options = render(entry)
        except (KeyError, ValueError, OSError) as e:  # a file gone, a placeholder renamed
            out.append(f"{_describe(entry)}: does not render ({e})")
            continue
        wanted[f"{prebuilt.key(source, options)}.fatbin"] = entry
    present = {p.name for p in prebuilt.DIR.glob("*.fatbin")}
    out += [f"{_describe(e)}: no binary {name} of its current source" for name, e in wanted.items() if name not in present]
    out += [f"{name}: no manifest entry renders to it" for name in sorted(present - set(wanted))]
    return out


def build(nvcc: str = "nvcc", jobs: int = os.cpu_count() or 1) -> int:
    """Compile every manifest entry lacking its binary, and remove binaries no entry names;
    returns the number compiled."""
    from concurrent.futures import ThreadPoolExecutor

    todo = {}
    for entry in manifest():
        source, options = render(entry)
        todo[f"{prebuilt.key(source, options)}.fatbin"] = (source, options, entry)
    for stale in prebuilt.DIR.glob("*.fatbin"):
        if stale.name not in todo:
            stale.unlink()

    def compile_one(name):
        source, options, entry = todo[name]
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "kernel.cu"
            src.write_text(source)
            out = Path(tmp) / name

            def nvcc_for(archs):
                gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
                cmd = [nvcc, *prebuilt.BUILD[:2], *gencode, *options, *prebuilt.CUPY_OPTIONS, "-o", str(out), str(src)]
                return subprocess.run(cmd, capture_output=True, text=True)

            done = nvcc_for(prebuilt.ARCHS)
            if done.returncode:  # a kernel that needs a newer GPU (thread block clusters: sm_90)
                archs = [a for a in prebuilt.ARCHS if nvcc_for([a]).returncode == 0]
                if not archs:
                    raise RuntimeError(f"nvcc failed on {_describe(entry)}:\n{done.stderr}")
                done = nvcc_for(archs)
            shutil.move(out, prebuilt.DIR / name)  # whole files only: a failed build leaves none
        return name

    missing = [n for n in todo if not (prebuilt.DIR / n).is_file()]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for name in pool.map(compile_one, missing):
            print(f"built {name}  {_describe(todo[name][2])}")
    return len(missing)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.kernels.build", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="every manifest entry has the binary of its current source")
    p_build = sub.add_parser("build", help="compile the entries lacking a binary (needs nvcc)")
    p_build.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    p_add = sub.add_parser("add", help=f"merge the instantiations a run recorded ({prebuilt.RECORD}=FILE)")
    p_add.add_argument("records", type=Path)
    args = parser.parse_args(argv)
    if args.command == "add":
        print(f"{add(args.records)} new instantiations in {prebuilt.MANIFEST.name}")
        return 0
    if args.command == "build":
        prebuilt.DIR.mkdir(parents=True, exist_ok=True)
        print(f"{build(args.nvcc)} binaries built")
        return 0
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
