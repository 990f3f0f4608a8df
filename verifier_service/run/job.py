"""The options one job runs with, as one typed value on every side of the worker boundary.

The scheduler resolves a request's VerifyOptions against the server's settings
(`service/config.resolve_options`), the job carries them to the worker as JSON (`to_json`), and the
judge, the candidate's process and the verdict merge read them back (`from_json`), which refuses a
missing or unknown field or a precision or policy name the proto does not have: a slip fails where
it is made, not as an INFRA_ERROR at run time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier_service import enums

# The judge's note to the worker that its timing stage is over: the worker's next pair of job
# processes may create their CUDA contexts now without one being made while a judge times.
PHASE_TIMED = "TIMED"


@dataclasses.dataclass(frozen=True)
class JobOptions:
  precision: str  # enums.PRECISIONS
  num_correctness_trials: int
  atol: float  # 0: the precision's default tolerance
  rtol: float
  skip_timing: bool
  num_timing_trials: int
  compile_timeout_s: float
  run_timeout_s: float
  seed: int
  plausible_speedup: float  # a larger speedup is reported as IMPLAUSIBLE_SPEEDUP
  policy: str  # enums.POLICIES
  min_custom_kernel_fraction: float  # the strict policy's bound
  # The run stage's budget scaled to the problem (run/budget.py): at least this many seconds per
  # stretch, and a candidate call allowed `budget_slowdown` x the reference's before its own pace
  # is known; 0: no scaled budget, `run_timeout_s` alone.
  budget_floor_s: float
  budget_slowdown: float

  def __post_init__(self) -> None:
    if self.precision not in enums.PRECISIONS:
      raise ValueError(f"precision {self.precision!r} is not one of {sorted(enums.PRECISIONS)}")
    if self.policy not in enums.POLICIES:
      raise ValueError(f"policy {self.policy!r} is not one of {sorted(enums.POLICIES)}")

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> JobOptions:
    fields = {f.name for f in dataclasses.fields(cls)}
    missing, unknown = sorted(fields - set(data)), sorted(set(data) - fields)
    if missing or unknown:
      raise ValueError(f"job options: missing {missing}, unknown {unknown}")
    return cls(**data)
