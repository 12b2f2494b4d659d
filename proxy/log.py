"""Logging set-up: one line per record, plain or JSON, to stderr (journald picks it up).

Code logs through `logging.getLogger(__name__)` and passes pod/container facts as `extra`
fields (`pod`, `container`, `hook`, `method`; the line of each intercepted call adds `hooks`,
`outcome`, `origin`, `elapsed_ms`, `runtime_ms`: see `call_log`); the JSON format emits them
as keys and the plain format appends them as `key=value`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["CONTEXT_KEYS", "configure_logging"]

# Extra fields that are shown when a record carries them.
CONTEXT_KEYS = (
    "method",
    "pod",
    "container",
    "hook",
    "field",
    "hooks",
    "outcome",
    "origin",
    "elapsed_ms",
    "runtime_ms",
)


class _PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{when}.{int(record.msecs):03d}Z {record.levelname:<7} {record.name}: "
        line += record.getMessage()
        extras = [f"{k}={getattr(record, k)}" for k in CONTEXT_KEYS if hasattr(record, k)]
        if extras:
            line += " " + " ".join(extras)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            if hasattr(record, key):
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(fmt: str, level: str) -> None:
    """Route the root logger to stderr with the chosen format and level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # grpc's own debug lines (one per loop lookup) drown crihook's; keep them at INFO or above.
    logging.getLogger("grpc").setLevel(max(root.level, logging.INFO))
