"""From a verifier `Verdict` to what reports show: an outcome label, a score, a compact row.

Labels are the proto's Outcome names plus two of ours:
- FORMAT: no candidate could be extracted from the generation (never sent to the verifier; the
  local verdict of `dice_jax.rewards.candidates.format_verdict`).
- FLAGGED: the verifier said OK but reported exploit findings (e.g. IMPLAUSIBLE_SPEEDUP). Such a
  sample is not counted as correct, the same policy as the default reward shaping ("hacks zeroed");
  the per-problem files keep the findings so a reader can overrule it.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import json_format

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.eval.metrics import SampleScore
from dice_jax.rewards import defaults
from dice_jax.rewards.candidates import is_format_verdict

FORMAT = "FORMAT"
FLAGGED = "FLAGGED"


def outcome_label(verdict: pb.Verdict) -> str:
  if is_format_verdict(verdict):
    return FORMAT
  if verdict.outcome == pb.OK and verdict.exploits:
    return FLAGGED
  return pb.Outcome.Name(verdict.outcome)


def speedup(verdict: pb.Verdict, warm: bool = False) -> float | None:
  """The measured speedup of an OK verdict that was timed (over cold calls, or `warm` ones:
  KernelBench's condition), else None."""
  if verdict.outcome != pb.OK or not verdict.HasField("timing"):
    return None
  value = verdict.timing.speedup_warm if warm else verdict.timing.speedup
  return value if math.isfinite(value) and value > 0 else None


def max_abs_error(verdict: pb.Verdict) -> float | None:
  """The largest absolute error over the correctness trials, None when none ran."""
  errors = [t.max_abs_error for t in verdict.trials if math.isfinite(t.max_abs_error)]
  return max(errors) if errors else None


def compiled(verdict: pb.Verdict) -> bool:
  """Whether the candidate compiled (the reward's rule; never for FORMAT or COMPILE_ERROR)."""
  return (verdict.outcome != pb.COMPILE_ERROR and not is_format_verdict(verdict)
          and defaults.compiled(verdict))


def score(verdict: pb.Verdict) -> SampleScore:
  label = outcome_label(verdict)
  correct = label == "OK"
  return SampleScore(outcome=label, compiled=compiled(verdict), correct=correct,
                     speedup=speedup(verdict) if correct else None,
                     speedup_warm=speedup(verdict, warm=True) if correct else None)


def compact(verdict: pb.Verdict) -> dict[str, Any]:
  """The row a table or a per-problem file shows for one verdict."""
  label = outcome_label(verdict)
  return {
      "outcome": label,
      "stage": pb.Stage.Name(verdict.stage).removeprefix("STAGE_"),
      "compiled": compiled(verdict),
      "correct": label == "OK",
      "speedup": speedup(verdict),
      "speedup_warm": speedup(verdict, warm=True),
      "max_abs_error": max_abs_error(verdict),
      "exploits": [pb.Exploit.Name(e.kind) for e in verdict.exploits],
      "message": verdict.message,
  }


def to_dict(verdict: pb.Verdict) -> dict[str, Any]:
  """The whole verdict as JSON (proto field names; enums as names)."""
  return json_format.MessageToDict(verdict, preserving_proto_field_name=True)


def from_dict(data: dict[str, Any]) -> pb.Verdict:
  return json_format.ParseDict(data, pb.Verdict(), ignore_unknown_fields=True)
