"""Log lines for people and for machines.

The library only creates loggers (``logging.getLogger(__name__)``, all under ``pipeline``) and
logs to them with structured fields passed as ``extra``; it never configures logging. The CLI
calls :func:`configure` once: readable lines on a terminal, or one JSON object per line (time,
level, logger, message and the record's fields) for a scheduler's log collector.
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


def configure(fmt: str = "text", level: str | int = "INFO", stream=None) -> None:
    """Send log records to ``stream`` (stderr by default) in ``fmt``: the ``pipeline`` loggers at
    ``level``, other libraries at WARNING, and Python warnings too. Calling it again replaces the
    previous configuration.

    The handler sits on the root logger, set up before distributed is imported: distributed then
    adds no stderr handler of its own and its records come out in the same format (every line
    parses as JSON with ``fmt="json"``)."""
    global _handler
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = logging.StreamHandler(stream or sys.stderr)
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(_handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("pipeline").setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)


__all__ = ["FORMATS", "JsonFormatter", "TextFormatter", "configure", "fields", "utc_iso"]
