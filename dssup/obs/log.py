"""Logging setup: human text by default, one JSON object per line with ``--log-format json``.

Library code only calls ``logging.getLogger(__name__)`` with lazy ``%s`` arguments and passes
per-area keys through ``extra={...}`` (``attempt``, ``pid``, ``uid``, ``decision``, ...); the
JSON formatter lifts those keys to the top level, so log pipelines can index them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal, TextIO

__all__ = ["JsonFormatter", "configure_logging", "get_logger"]

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra keys}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


def configure_logging(
    fmt: Literal["text", "json"] = "text", level: str = "INFO", stream: TextIO | None = None
) -> None:
    """Install one handler on the ``dssup`` logger (idempotent: replaces an earlier one)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("dssup %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("dssup")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
