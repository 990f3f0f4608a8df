"""A verdict log that makes an evaluation resumable: append-only JSONL keyed by content hash.

Every verdict is appended (and fsync'd) the moment it arrives, keyed by the sha256 of (reference,
candidate, options) — the verifier client's own cache key — so an interrupted run loses at most
the verdicts in flight, and a rerun never verifies the same (problem, candidate) twice, whatever
sample index or problem order it has this time. INFRA_ERROR verdicts are not stored: the verifier
failed, not the candidate, so a rerun asks again. A final line cut off by a crash is dropped (and
the file trimmed back to its last complete line before anything is appended).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Any

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.eval import records
from dice_jax.verifier.client import VerifyItem, cache_key

_log = logging.getLogger(__name__)


def item_key(reference: str, candidate: str, options: pb.VerifyOptions) -> str:
  """The store key of one (reference, candidate) under `options`."""
  return cache_key(VerifyItem(reference, candidate), options)


class VerdictStore:
  """Verdicts by key, persisted to `path` as they are added."""

  def __init__(self, path: str | os.PathLike[str]):
    self.path = pathlib.Path(path)
    self._verdicts: dict[str, pb.Verdict] = {}
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._load()
    self._file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

  def _load(self) -> None:
    if not self.path.exists():
      return
    data = self.path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) != len(data):
      _log.warning("%s: dropping a cut-off last line (%d bytes) left by an interrupted run",
                   self.path, len(data) - len(complete))
      with open(self.path, "r+b") as f:
        f.truncate(len(complete))
    for lineno, line in enumerate(complete.decode("utf-8", errors="replace").splitlines(), 1):
      if not line.strip():
        continue
      try:
        entry = json.loads(line)
        self._verdicts[entry["key"]] = records.from_dict(entry["verdict"])
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{self.path} line {lineno} is not a verdict record ({e}); this file is "
                         "written by `dice eval` only — use a fresh --out directory") from None

  def __contains__(self, key: str) -> bool:
    return key in self._verdicts

  def __len__(self) -> int:
    return len(self._verdicts)

  def get(self, key: str) -> pb.Verdict | None:
    return self._verdicts.get(key)

  def put(self, key: str, verdict: pb.Verdict, **meta: Any) -> bool:
    """Stores and persists `verdict`; False (nothing written) for INFRA_ERROR or a known key."""
    if verdict.outcome == pb.INFRA_ERROR or key in self._verdicts:
      return False
    self._verdicts[key] = verdict
    line = json.dumps({"key": key, **meta, "verdict": records.to_dict(verdict)}, sort_keys=True)
    self._file.write(line + "\n")
    self._file.flush()
    os.fsync(self._file.fileno())
    return True

  def close(self) -> None:
    self._file.close()

  def __enter__(self) -> VerdictStore:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
