"""Structured logging: one JSON object per line when stderr is not a terminal, else text."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a log call gave with `extra=` (consumer, partition, error, ...)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`: the `extra=` fields kept, as in JSON."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in extra_fields(record).items())
        if not fields:
            return line
        head, sep, rest = line.partition("\n")  # a traceback stays below the line
        return f"{head} {fields}{sep}{rest}"


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON line; extra fields given with `extra=` are kept."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(extra_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(fmt: str = "auto", level: str = "INFO") -> None:
    """Configure the root logger for `fmt` (json, text or auto) at `level`."""
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Uncaught errors, in any thread, are log records too: one JSON line, not a traceback.
    sys.excepthook = _log_uncaught
    threading.excepthook = lambda args: _log_uncaught(
        args.exc_type, args.exc_value, args.exc_traceback, args.thread
    )


def _log_uncaught(exc_type, exc, tb, thread: threading.Thread | None = None) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    where = {"thread": thread.name} if thread is not None else {}
    logging.getLogger("intentstream").critical(
        "uncaught exception", exc_info=(exc_type, exc, tb), extra=where
    )
