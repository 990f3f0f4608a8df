"""Verdicts by request id on disk, so a request resent after a server restart is answered once.

The proto's contract is that resending a request id returns the verdict already given. In memory
that holds while the server runs; this store (sqlite, in the cache folder, written by the server
only: job children cannot reach it) makes it hold across restarts. Each row also keeps a digest of
the request's content: an id reused for a different request (another training run counting from
zero) is verified afresh instead of being answered with a stranger's verdict.

Bounded: beyond `capacity` rows the oldest are deleted. INFRA_ERROR verdicts are never stored (a
retry must really retry). sqlite's WAL mode lets several servers share one cache folder.
"""

from __future__ import annotations

import hashlib
import pathlib
import sqlite3
import threading

from dice.verifier.v1 import verifier_pb2 as pb

_PRUNE_EVERY = 256


def request_digest(request: pb.VerifyRequest) -> str:
  """What makes two requests the same request, apart from their id."""
  h = hashlib.sha256()
  for part in (request.reference_source.encode(), request.candidate_source.encode(),
               request.options.SerializeToString(deterministic=True)):
    h.update(len(part).to_bytes(8, "little"))
    h.update(part)
  return h.hexdigest()


class VerdictStore:
  """request id -> (digest, serialized Verdict), oldest evicted first."""

  def __init__(self, path: pathlib.Path, capacity: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    self.capacity = capacity
    self._lock = threading.Lock()
    self._db = sqlite3.connect(str(path), timeout=10.0, check_same_thread=False,
                               isolation_level=None)
    self._db.execute("PRAGMA journal_mode=WAL")
    self._db.execute("PRAGMA synchronous=NORMAL")
    self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (request_id TEXT PRIMARY KEY, "
                     "digest TEXT NOT NULL, verdict BLOB NOT NULL, seq INTEGER NOT NULL)")
    self._db.execute("CREATE INDEX IF NOT EXISTS verdicts_seq ON verdicts (seq)")
    self._puts = 0

  def get(self, request_id: str, digest: str) -> bytes | None:
    with self._lock:
      row = self._db.execute("SELECT digest, verdict FROM verdicts WHERE request_id = ?",
                             (request_id,)).fetchone()
    if row is None or row[0] != digest:
      return None
    return row[1]

  def put(self, request_id: str, digest: str, verdict: bytes) -> None:
    with self._lock:
      self._db.execute(
          "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, "
          "(SELECT COALESCE(MAX(seq), 0) + 1 FROM verdicts))", (request_id, digest, verdict))
      self._puts += 1
      if self._puts % _PRUNE_EVERY == 0 or self.capacity < _PRUNE_EVERY:
        self._db.execute("DELETE FROM verdicts WHERE seq <= (SELECT MAX(seq) FROM verdicts) - ?",
                         (self.capacity,))

  def __len__(self) -> int:
    with self._lock:
      return self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]

  def close(self) -> None:
    with self._lock:
      self._db.close()
