"""pipeline's settings live in dask's own config, under the key ``pipeline``.

One mechanism for all settings: YAML files in dask's config paths and ``DASK_PIPELINE__*``
environment variables, read by ``dask.config``. Defaults ship in ``pipeline.yaml``;
:func:`check` refuses a key that is not one of them (a misspelt key would otherwise be ignored in
silence) and a value that is not what its key takes, naming both.
"""

from __future__ import annotations

import math
import os

import dask.config
import yaml

from .errors import InputError

_DEFAULTS = os.path.join(os.path.dirname(__file__), "pipeline.yaml")

with open(_DEFAULTS) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)


def get(key: str, default=None):
    """Read ``pipeline.<key>`` from dask's config."""
    return dask.config.get(f"pipeline.{key}", default=default)


# --- values ---------------------------------------------------------------------------------------


def _number(value) -> float | None:
    """``value`` as a finite number (a number, or a string that reads as one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


def nbytes(value) -> int:
    """``value`` in bytes: a size such as "64MB" or "2GiB" (``dask.utils.parse_bytes``) or a number
    (rounded down, as parse_bytes does); ValueError for anything else, a negative size included."""
    from dask.utils import parse_bytes

    number = _number(value)
    if number is None and isinstance(value, str) and value.strip():
        try:
            number = parse_bytes(value)
        except ValueError:
            pass
    if number is None or number < 0:
        raise ValueError(f"expected a size in bytes such as 64MB or 2GiB, got {value!r}")
    return int(number)


def share(value, total: int) -> int:
    """``value`` in bytes: a size ("16GB", a number above 1) or a fraction of ``total`` (a number
    from 0 to 1); None: all of ``total``. ValueError for anything else."""
    if value is None:
        return total
    number = _number(value)
    if number is not None and 0 <= number <= 1:
        return int(number * total)
    try:
        return nbytes(value)
    except ValueError:
        raise ValueError(f"expected a size in bytes such as 16GB, or a fraction from 0 to 1, got {value!r}") from None


def seconds(value) -> float:
    """``value`` ("10s", "5m", a number of seconds) in seconds: ValueError unless a positive duration."""
    from dask.utils import parse_timedelta

    try:
        s = parse_timedelta(value, default="seconds") if not isinstance(value, bool) else None
    except (ValueError, TypeError, KeyError):
        s = None
    if s is None or not 0 < s < math.inf:
        raise ValueError(f"expected a duration such as '10s' or '5m', got {value!r}")
    return s


CUDA_QUEUES = "CUDA_DEVICE_MAX_CONNECTIONS"


def cuda_env() -> dict[str, str]:
    """The environment a process's CUDA context is to be made under: the hardware work queues of
    ``pipeline.gpu.hardware-queues`` as the variable the driver reads when it makes the context,
    or the process's own value where it has one (the user's choice). None for ``null``, nor for
    ``auto`` outside pipeline's commands (which make it 32 for themselves and their clusters:
    ``pipeline.cli``). Set by whatever may make the context first: the command's early context
    (:mod:`pipeline.gpu.context`), the import of CuPy (:mod:`pipeline.backend`) and the local GPU
    cluster's workers (:mod:`pipeline.exec.cluster`)."""
    if CUDA_QUEUES in os.environ:
        return {CUDA_QUEUES: os.environ[CUDA_QUEUES]}
    queues = get("gpu.hardware-queues", "auto")
    return {} if queues in (None, "auto") else {CUDA_QUEUES: str(queues)}


# --- what each setting takes ----------------------------------------------------------------------


def _parses(parse, value) -> bool:
    try:
        parse(value)
    except ValueError:
        return False
    return True


def _size(value, zero: bool = False) -> bool:
    return _parses(nbytes, value) and (zero or nbytes(value) > 0)


def _budget(value, zero: bool = False) -> bool:
    """A size, or a fraction of the memory it is taken from (above 0 unless ``zero``)."""
    if not _parses(lambda v: share(v, 1), value) or value is None:
        return False
    number = _number(value)
    return zero or (number > 0 if number is not None else nbytes(value) > 0)


def _one_of(*options):
    return (lambda v: isinstance(v, str) and v in options), f"one of {', '.join(options)}"


def _or_null(rule):
    return (lambda v: v is None or rule[0](v)), f"{rule[1]}, or null"


_BOOL = (lambda v: isinstance(v, bool)), "true or false"
_COUNT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0), "a whole number above 0"
_SIZE = _size, "a size in bytes above 0, such as 64MB or 2GiB"
_LIMIT = _budget, "a size in bytes such as 16GB, or a fraction of the memory above 0 and up to 1"
_SHARE = (lambda v: _budget(v, zero=True)), "a size in bytes such as 3GB, or a fraction of the memory from 0 to 1 (0: none)"

LEVELS = ("debug", "info", "warning", "error")


def patched(name: str) -> bool:
    """Whether the setting ``patches`` lets pipeline make change ``name`` to another library
    (:mod:`pipeline.patches`): true (all), false (none) or a list of names."""
    setting = get("patches", True)
    if isinstance(setting, bool):
        return setting
    return name in setting


RULES = {  # each setting of pipeline.yaml: (whether a value is valid, what is expected, in words)
    "backend": _one_of("auto", "cpu", "gpu"),
    "cache-dir": _or_null(((lambda v: isinstance(v, str) and v.strip() != ""), "a directory")),
    "demo.size": _SIZE,
    "freeze-at-exit": _BOOL,
    "log.format": _one_of("text", "json"),
    "log.level": ((lambda v: isinstance(v, str) and v.lower() in LEVELS), f"one of {', '.join(LEVELS)}"),
    "cluster.locality": _BOOL,
    "cluster.connect-timeout": ((lambda v: _parses(seconds, v)), "a duration such as 10s or 5m"),
    "cluster.fork-workers": _BOOL,
    "cpu.block-size": _or_null(_SIZE),
    "cpu.memory-limit": _LIMIT,
    "gpu.prebuilt-kernels": _BOOL,
    "gpu.memory-limit": _LIMIT,
    "gpu.host-spill": _SHARE,
    "gpu.read-ahead": _SHARE,
    "gpu.nvcomp": _BOOL,
    "gpu.decode-rates.gpu-frame": _SIZE,
    "gpu.decode-rates.gpu-batch": _SIZE,
    "gpu.decode-rates.cpu-frame": _SIZE,
    "gpu.block-size": _or_null(_SIZE),
    "gpu.pinned-files": _SHARE,
    "gpu.pin-files": _one_of("auto", "first-read", "reread"),
    "gpu.pin-min-file": ((lambda v: _size(v, zero=True)), "a size in bytes such as 2MiB, or 0"),
    "gpu.io-threads": _or_null(_COUNT),
    "gpu.early-context": _BOOL,
    "gpu.hardware-queues": _or_null(((lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 32)),
                                     "auto, or a whole number from 1 to 32")),
    "gpu.threads": _COUNT,
    # the names a list may hold are pipeline.patches' (checked there: patches.check_setting)
    "patches": (
        (lambda v: isinstance(v, bool) or (isinstance(v, list) and all(isinstance(n, str) for n in v))),
        "true, false, or a list of names of pipeline.patches' changes",
    ),
}
# the sections that hold settings: "cpu", "gpu", "gpu.decode-rates", ...
SECTIONS = {k.rsplit(".", n)[0] for k in RULES for n in range(1, k.count(".") + 1)}


def check() -> None:
    """Raise InputError naming the first setting under ``pipeline`` that is not one (with the
    nearest that is) or whose value is not what it takes (with what it takes), and where it was
    set where dask's config tells: an environment variable or a YAML file. Each key may be
    written with ``-`` or ``_``, as dask reads them."""
    problem = _first_problem(dask.config.get("pipeline", None), ())
    if problem:
        raise InputError(problem)


def _first_problem(value, path: tuple[str, ...]) -> str | None:
    """The message of the first setting at or under ``path`` (the keys as dask holds them) that
    is not one, or whose value is not valid; None where all are."""
    key = ".".join(p.replace("_", "-") for p in path)
    name = ".".join(("pipeline", *path))
    if not path or key in SECTIONS:
        if not isinstance(value, dict):
            return f"{name}: expected a mapping of settings, got {value!r}{_source(path)}"
        for k, v in value.items():
            problem = _first_problem(v, (*path, str(k)))
            if problem:
                return problem
        return None
    if key not in RULES:
        return f"{name}: no such setting{_source(path)}{_suggestion(key)}"
    valid, expected = RULES[key]
    if not valid(value):
        return f"pipeline.{key}: expected {expected}, got {value!r}{_source(path)}"  # as pipeline.yaml spells it
    return None


def _suggestion(key: str) -> str:
    import difflib

    near = difflib.get_close_matches(key, [*RULES, *SECTIONS], n=1, cutoff=0.6)
    return f"; did you mean pipeline.{near[0]}?" if near else f"; the settings are listed in {_DEFAULTS}"


def _canonical(parts) -> list[str]:
    return [str(p).lower().replace("_", "-") for p in parts]


def _source(path: tuple[str, ...]) -> str:
    """Where dask's config found ``pipeline.<path>``, in words: an environment variable or a YAML
    file of dask's config paths ("" where it was set in code, or is not found)."""
    wanted = _canonical(("pipeline", *path))
    for name in os.environ:
        if name.startswith("DASK_") and _canonical(name[5:].split("__")) == wanted:
            return f" (environment variable {name})"
    try:
        files = list(dask.config.collect_yaml(dask.config.paths, return_paths=True))
    except Exception:  # a file dask could not read: it says so itself
        return ""
    for file, data in reversed(files):  # the last file read wins
        if _holds(data, wanted):
            return f" (in {file})"
    return ""


def _holds(data, parts: list[str]) -> bool:
    """Whether the mapping ``data`` holds the key ``parts`` (canonical), at any depth."""
    for part in parts:
        if not isinstance(data, dict):
            return False
        data = next((v for k, v in data.items() if _canonical([k]) == [part]), _MISSING)
        if data is _MISSING:
            return False
    return True


_MISSING = object()
