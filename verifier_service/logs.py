"""Structured logs: one JSON object per line on stderr (what log shippers expect)."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
  """Formats a record as JSON; `extra={"fields": {...}}` adds keys to the object."""

  def format(self, record: logging.LogRecord) -> str:
    data = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) +
              f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    data.update(getattr(record, "fields", {}))
    if record.exc_info:
      data["exc"] = self.formatException(record.exc_info)
    return json.dumps(data, default=str)


def setup(level: str = "INFO", json_lines: bool = True) -> None:
  """Routes the verifier's loggers to stderr, as JSON lines or plain text."""
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(
      "%(asctime)s %(levelname)s %(name)s: %(message)s"))
  root = logging.getLogger("verifier_service")
  root.handlers[:] = [handler]
  root.setLevel(level)
  root.propagate = False
