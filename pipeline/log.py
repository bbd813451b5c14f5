"""Log lines for people and for machines.

The library only creates loggers (``logging.getLogger(__name__)``, all under ``pipeline``) and
logs to them with structured fields passed as ``extra``; it never configures logging. The CLI
calls :func:`configure` once: readable lines on a terminal, or one JSON object per line (time,
level, logger, message and the record's fields) for a scheduler's log collector. The workers of
the clusters pipeline starts run :func:`dask_setup` (a distributed preload), so that their lines,
distributed's included, come in the same format and level.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

FORMATS = ("text", "json")

# attributes every LogRecord has: anything else on a record came from ``extra`` and is a field
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def fields(record: logging.LogRecord) -> dict:
    """The structured fields a call attached with ``extra={...}``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def utc_iso(timestamp: float) -> str:
    """A Unix time as ISO 8601 in UTC with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, fields, and a traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": utc_iso(record.created), "level": record.levelname, "logger": record.name,
               "message": record.getMessage(), **fields(record)}
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS message`` for progress; ``pipeline: error: message`` for problems, as before
    logging existed, so that scripts matching those lines keep working."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            line = f"pipeline: {record.levelname.lower()}: {record.getMessage()}"
        else:
            line = f"{self.formatTime(record, '%H:%M:%S')} {record.getMessage()}"
        if record.exc_info:
            line = f"{self.formatException(record.exc_info)}\n{line}"
        return line


_handler: logging.Handler | None = None
# the loggers to which distributed, at its import, gives a stderr handler of its own where the root
# logger has none (as in a worker's process)
_LIBRARIES = ("distributed", "bokeh", "tornado")


def library_level(level: str | int) -> int:
    """The least important level shown of other libraries' lines (distributed's INFO lines tell of
    every worker that starts, connects and stops): WARNING, or ``level`` where it is above."""
    return max(logging.getLevelName(level.upper()) if isinstance(level, str) else level, logging.WARNING)


class _Levels(logging.Filter):
    """``pipeline``'s records from ``level``, other libraries' from :func:`library_level`, whatever
    levels their loggers have (distributed sets its own to INFO at its import)."""

    def __init__(self, level: str | int):
        super().__init__()
        self.others = library_level(level)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.others or record.name == "pipeline" or record.name.startswith("pipeline.")


def configure(fmt: str | None = None, level: str | int | None = None, stream=None) -> None:
    """Send log records to ``stream`` (stderr by default) in ``fmt``: the ``pipeline`` loggers at
    ``level``, other libraries at WARNING (or ``level`` where it is above), and Python warnings too.
    ``fmt`` and ``level`` default to the settings ``pipeline.log.format`` and
    ``pipeline.log.level``, and are kept there: the workers of a cluster started afterwards inherit
    them (:func:`dask_setup`). Calling it again replaces the previous configuration.

    The handler sits on the root logger, set up before distributed is imported: distributed then
    adds no stderr handler of its own and its records come out in the same format (every line
    parses as JSON with ``fmt="json"``). Where distributed was imported first (a worker's process)
    its handlers are taken off for the same result."""
    import dask.config

    from . import config

    global _handler
    fmt = fmt or config.get("log.format", "text")
    level = level or config.get("log.level", "info")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    level = logging.getLevelName(level) if isinstance(level, int) else level.upper()  # "WARNING"
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = logging.StreamHandler(stream or sys.stderr)
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    _handler.addFilter(_Levels(level))
    root.addHandler(_handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("pipeline").setLevel(level)
    for name in _LIBRARIES:
        library = logging.getLogger(name)
        for h in list(library.handlers):
            if isinstance(h, logging.StreamHandler) and h.stream in (sys.stderr, sys.__stderr__):
                library.removeHandler(h)
        library.propagate = True
    logging.captureWarnings(True)
    dask.config.set({"pipeline.log.format": fmt, "pipeline.log.level": level.lower()})


def dask_setup(worker) -> None:
    """Run by a worker started with ``--preload pipeline.log``: its log lines, distributed's
    included, in the format and from the level of the settings it inherited from the process that
    started it (:func:`configure`). The clusters that pipeline starts preload
    :mod:`pipeline.exec.worker`, which does this and more."""
    configure()


__all__ = ["FORMATS", "JsonFormatter", "TextFormatter", "configure", "dask_setup", "fields", "library_level", "utc_iso"]
