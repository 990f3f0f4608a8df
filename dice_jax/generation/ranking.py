"""Candidates with verdicts, and the order in which they are offered: correct, then fastest.

Order (best first):
1. correct (the verifier said OK with no exploit findings), fastest first; a correct but untimed
   candidate comes after every timed one; ties go to the smaller max error, then the earlier
   candidate;
2. the rest by how far they got: FLAGGED (passed but flagged), NO_GPU (compiled, never run),
   INCORRECT, TIMEOUT, RUNTIME_ERROR, BAD_REFERENCE, COMPILE_ERROR, REJECTED, FORMAT (no code
   found), INFRA_ERROR; then the earlier candidate.
Only a candidate of group 1 is ever called verified.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.eval import records

SAMPLE, INJECTED = "sample", "injected"
_PROGRESS = ("FLAGGED", "NO_GPU", "INCORRECT", "TIMEOUT", "RUNTIME_ERROR", "BAD_REFERENCE",
             "COMPILE_ERROR", "REJECTED", records.FORMAT, "INFRA_ERROR")


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One candidate: where it came from, the file graded (None: no code found), its verdict."""

  index: int
  origin: str  # SAMPLE (from the model) or INJECTED (given by the caller)
  source: str | None
  verdict: pb.Verdict
  completion: str | None = None  # the model's raw text, for samples

  @property
  def outcome(self) -> str:
    return records.outcome_label(self.verdict)

  @property
  def correct(self) -> bool:
    return self.outcome == "OK"

  @property
  def compiled(self) -> bool:
    return records.score(self.verdict).compiled

  @property
  def speedup(self) -> float | None:
    return records.speedup(self.verdict) if self.correct else None

  @property
  def max_abs_error(self) -> float | None:
    return records.max_abs_error(self.verdict)

  @property
  def name(self) -> str:
    return f"{self.origin} {self.index}"


def rank_key(c: Candidate) -> tuple:
  if c.correct:
    error = c.max_abs_error if c.max_abs_error is not None else math.inf
    return (0, -(c.speedup or 0.0), error, c.index)
  label = c.outcome
  progress = _PROGRESS.index(label) if label in _PROGRESS else len(_PROGRESS)
  return (1, progress, 0.0, c.index)


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
  """Best first (see module docstring)."""
  return sorted(candidates, key=rank_key)


def best_verified(ranked: Sequence[Candidate]) -> Candidate | None:
  """The first candidate if it is proven correct, else None."""
  return ranked[0] if ranked and ranked[0].correct else None


def best_compiled(ranked: Sequence[Candidate]) -> Candidate | None:
  """The best candidate that at least compiled (for compile-only verdicts), else None."""
  return next((c for c in ranked if c.compiled and c.source is not None), None)
