"""Structured logs: one JSON object per line with the request id (and job / run / plan ids where known).

The request id lives in a context variable set by the request middleware, so every line logged while a
request is served carries it without threading it through calls. Bearer tokens are scrubbed from every
message as a second line of defence: nothing should log one, and if something does, it must not leak.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id: ContextVar[str | None] = ContextVar("paraplan_request_id", default=None)

# Ids a log call may pass through ``extra=`` to become top-level JSON fields.
ID_FIELDS = ("job_id", "plan_id", "run_id", "worker_id", "profile_id")
_ACCESS_FIELDS = ("method", "path", "route", "status", "duration_ms")
_SECRETS = re.compile(r"(?i)(bearer\s+)\S+|\bpp_[A-Za-z0-9_\-]{8,}")


def scrub(text: str) -> str:
    return _SECRETS.sub(lambda m: f"{m.group(1)}[redacted]" if m.group(1) else "pp_[redacted]", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid:
            entry["request_id"] = rid
        for name in (*ID_FIELDS, *_ACCESS_FIELDS):
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rid = request_id.get()
        line = scrub(super().format(record))
        return f"{line} [request {rid}]" if rid else line


def configure_logging(as_json: bool = True, level: int = logging.INFO) -> None:
    """Route paraplan's and uvicorn's loggers to one stderr handler (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else
                         _TextFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_paraplan", False)]:
        root.removeHandler(old)
    handler._paraplan = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    logging.getLogger("paraplan").setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
