"""CUDA C compiled ahead of time: fat binaries of the modules that flows use, shipped with pipeline.

A machine that has compiled nothing compiles each CUDA C module on its first use, by NVRTC: about
2 s for ``cuda/genotypes.cu`` on the H200 machine (its unrolled word loops), most of the first run
of the counting statistics; then CuPy's disk cache keeps it. A module built ahead of time loads in
milliseconds, on the first run of any machine. CuPy does the same for its own kernels (its wheels
carry compiled CUB and Thrust code); pipeline's are filled-in templates, one module per element
type and constant, so what is built is a list of instantiations (``cuda/prebuilt/manifest.json``,
built by :mod:`.build`).

- **Which file.** :func:`binary` names the binary of a rendered source and its options, if one was
  built: the name (:func:`key`) hashes the source, the options and the build's flags, so an edited
  kernel or other types have another name, and a stale binary is never loaded.
- **Where it does not load** (an architecture not built, a driver older than the CUDA 13 toolkit
  that built them), :func:`refused` says so once at debug level and the module is compiled as
  before. ``pipeline.gpu.prebuilt-kernels: false`` compiles every module.
- **The same numbers.** nvcc gets the options NVRTC gets: the kernel's own (``--fmad=false``) and
  ``-ftz=true``, which CuPy appends to every compilation; both compile through NVVM with the same
  libdevice. The GPU tests compare the two (``tests/test_prebuilt.py``).
- **What to build.** ``PIPELINE_RECORD_KERNELS=FILE`` makes each process append every instantiation
  it compiles to FILE (JSON lines, :func:`record`), for ``python -m pipeline.kernels.build add``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

DIR = Path(__file__).resolve().parent / "cuda" / "prebuilt"
MANIFEST = DIR / "manifest.json"

# Machine code for the architectures of the data-centre GPUs: A100 (sm_80, also run by sm_86 and
# sm_89), H100 and H200 (sm_90), B200 (sm_100, also sm_103), RTX Blackwell (sm_120). No PTX:
# another architecture compiles the module as before.
ARCHS = (80, 90, 100, 120)
# What CuPy adds to every compilation (cupy/cuda/compiler.py), so that the binaries compute what
# NVRTC's would.
CUPY_OPTIONS = ("-ftz=true",)
BUILD = ("-fatbin", "-compress-mode=size", *(f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS))
RECORD = "PIPELINE_RECORD_KERNELS"


def key(source: str, options) -> str:
    """The name of a source's binary: its text, its options and the build's flags, hashed."""
    text = "\0".join([source, " ".join(options), " ".join(CUPY_OPTIONS + BUILD)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def binary(source: str, options) -> Path | None:
    """The fat binary of ``source`` compiled with ``options``, where one was built (and
    ``pipeline.gpu.prebuilt-kernels`` is on)."""
    from .. import config

    if not config.get("gpu.prebuilt-kernels", True):
        return None
    path = DIR / f"{key(source, options)}.fatbin"
    return path if path.is_file() else None


_refused: set[str] = set()


def refused(path: Path, error) -> None:
    """Say once that this GPU or driver does not load ``path`` (the module is compiled instead)."""
    if path.name not in _refused:
        _refused.add(path.name)
        log.debug("prebuilt kernels %s do not load here (%s): compiling them", path.name, error)


# --- recording the instantiations a run compiles -------------------------------------------------

_record_lock = threading.Lock()


def record(entry: dict) -> None:
    """Append ``entry`` to the file that ``PIPELINE_RECORD_KERNELS`` names, if it names one."""
    target = os.environ.get(RECORD)
    if target:
        with _record_lock, open(target, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")


def module_entry(filename: str, options, params: dict) -> dict:
    return {"file": filename, "options": list(options), "params": {k: str(params[k]) for k in sorted(params)}}


def stream_entry(spec, in_dtype, out_dtype) -> dict:
    import numpy as np

    return {"spec": {"kind": spec.kind, "name": spec.name, "params": [list(p) for p in spec.params],
                     "body": spec.body, "prelude": spec.prelude},
            "in": np.dtype(in_dtype).name, "out": np.dtype(out_dtype).name}
