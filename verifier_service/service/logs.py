"""Structured logs on stderr: one JSON object per line (what log shippers expect), or plain text.

Both formats carry the same facts: a record's `extra={"fields": {...}}` (the listen address, a
verdict's outcome and message, ...) become keys of the JSON object, or `key=value` pairs after
the message in plain text (`--plain-logs`), so choosing the readable format loses nothing.
"""

from __future__ import annotations

import json
import logging
import sys
import time


def _timestamp(record: logging.LogRecord) -> str:
  return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
  """Formats a record as JSON; `extra={"fields": {...}}` adds keys to the object."""

  def format(self, record: logging.LogRecord) -> str:
    data = {
        "ts": _timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    data.update(getattr(record, "fields", {}))
    if record.exc_info:
      data["exc"] = self.formatException(record.exc_info)
    return json.dumps(data, default=str)


def _plain_value(value) -> str:
  text = value if isinstance(value, str) else json.dumps(value, default=str)
  if not text or any(c.isspace() or c in "\"'=" for c in text):
    return json.dumps(text)  # quoted, with escapes: one record stays one line
  return text


class PlainFormatter(logging.Formatter):
  """`<ts> <LEVEL> <logger>: <message> key=value ...`, the fields of JsonFormatter in readable form."""

  def format(self, record: logging.LogRecord) -> str:
    line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
    fields = getattr(record, "fields", {})
    if fields:
      line += " " + " ".join(f"{key}={_plain_value(value)}" for key, value in fields.items())
    if record.exc_info:
      line += "\n" + self.formatException(record.exc_info)
    return line


def setup(level: str = "INFO", json_lines: bool = True) -> None:
  """Routes the verifier's loggers to stderr, as JSON lines or plain text."""
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter())
  root = logging.getLogger("verifier_service")
  root.handlers[:] = [handler]
  root.setLevel(level)
  root.propagate = False
