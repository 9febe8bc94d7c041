"""How the ``gpubot`` command logs: text lines with ISO 8601 UTC times, or one JSON object a line
for a log shipper. Standard library only: every command imports it, and a cold status counts
imports. A flag wins over the environment.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from gpubot.errors import ConfigError

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
LEVEL_ENV = "GPUBOT_LOG_LEVEL"
FORMAT_ENV = "GPUBOT_LOG_FORMAT"
DEFAULT_LEVEL = "warning"
DEFAULT_FORMAT = "text"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def iso_utc(created: float) -> str:
    """Return ``created`` (seconds since the epoch) as ``2026-12-01T23:56:00.123Z``."""
    whole, millis = divmod(round(created * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


BLOCK = "block"  # ``extra={"block": text}``: lines a record shows after its own, as a traceback


def with_block(text: str, record: logging.LogRecord, sep: str) -> str:
    """``text`` and then the record's block (gpubot's own multi-line text: a task dump)."""
    block = getattr(record, BLOCK, None)
    return f"{text}{sep}{block}" if isinstance(block, str) and block else text


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` with UTC times, one line a record: a line break inside a message is a
    space, so no message can start a line that reads as a record of its own. A traceback and a
    record's ``block`` (gpubot's own text) follow its line."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_utc(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return " ".join(super().formatMessage(record).splitlines())

    def format(self, record: logging.LogRecord) -> str:
        return with_block(super().format(record), record, "\n")


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with ``exception`` as one string when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, str] = {
            "time": iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": with_block(record.getMessage(), record, "\n"),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False)


def choose(
    flag: str | None, environ: Mapping[str, str], env: str, allowed: tuple[str, ...], default: str
) -> str:
    """Return the flag's value, else the environment's (checked), else ``default``."""
    if flag is not None:
        return flag
    raw = environ.get(env, "").strip()
    if not raw:
        return default
    if raw.lower() not in allowed:
        raise ConfigError(f"{env}={raw!r}: expected one of {', '.join(allowed)}")
    return raw.lower()


def configure(
    level: str | None, fmt: str | None, environ: Mapping[str, str], stream: TextIO | None = None
) -> logging.Handler | None:
    """Send records of the level chosen (``choose``) and above to ``stream`` in the format
    chosen; like ``basicConfig``, do nothing (None) where the root logger has handlers already
    (pytest, an embedding program)."""
    level = choose(level, environ, LEVEL_ENV, LEVELS, DEFAULT_LEVEL)
    fmt = choose(fmt, environ, FORMAT_ENV, FORMATS, DEFAULT_FORMAT)
    root = logging.getLogger()
    if root.handlers:
        return None
    # Alembic 1.18+ lists its autogenerate plugins at INFO on import: nothing an operator acts on.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
