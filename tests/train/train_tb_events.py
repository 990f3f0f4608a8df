"""Reads scalars back from TensorBoard event files (TFRecord framing of Event protos)."""

from __future__ import annotations

import pathlib
import struct

from dice_jax.metrics_log import _summary_writer_class

_summary_writer_class()  # imports tensorboardX without torch, so the next import is cheap
from tensorboardX.proto import event_pb2  # noqa: E402


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} over every event file under `logdir`, in file order."""
  out: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(pathlib.Path(logdir).rglob("events.out.tfevents.*")):
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      record = data[pos + 12:pos + 12 + length]
      pos += 12 + length + 4
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        if value.HasField("simple_value"):
          out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out
