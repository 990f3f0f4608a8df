"""The numbers KernelBench reports, as pure functions of per-sample scores.

Definitions (Ouyang et al. 2025, KernelBench; Chen et al. 2021 for pass@k). For a group of problems
(one level, or all), each with n_i >= 1 samples:
- compile rate: fraction of samples that compiled, averaged per problem, then over problems;
- execution accuracy (`correct_rate`): fraction of samples that compiled AND passed every
  correctness trial (outcome OK), averaged the same way; with one sample per problem it is the
  fraction of problems solved, and with n it is the unbiased pass@1;
- fast_p: fraction of samples that are correct AND faster than the reference by more than a
  factor p (speedup > p), over ALL samples of ALL problems (a failed or untimed sample counts as not
  fast), averaged the same way; fast_0 = correct_rate when every correct kernel was timed;
- pass@k: mean over problems of the unbiased estimator 1 - C(n-c, k)/C(n, k), for k <= min n_i;
- speedups: mean, geometric mean and median of the speedups of correct, timed samples. The
  verifier times each call twice, cold (L2 flushed, what fast_p and rewards use) and warm (no
  flush, KernelBench's condition); `speedup_warm_geomean`/`_median` are the warm figures, so a
  run can be set beside KernelBench's numbers.

Every sample weighs 1/n_i within its problem and every problem weighs the same, so a problem with
more samples does not count more. Verdicts from a verifier without a GPU (NO_GPU) compiled but were
never run: a group containing any has `correctness_available = False` and None for every
correctness or speed metric, never a number that would read as "0% correct". INFRA_ERROR (the
verifier failed) and BAD_REFERENCE (the problem is unusable) count as failures here and are
reported separately so a reader can see when the numbers are incomplete.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

FAST_P = (1.0, 2.0)
# The p grid of the fast_p curve; extended past 2 when some kernel is that fast.
CURVE_STEP = 0.05


@dataclasses.dataclass(frozen=True)
class SampleScore:
  """What the metrics need from one sample's verdict (see dice_jax.eval.records for the mapping).

  outcome: the proto Outcome name, or FORMAT when no candidate could be extracted.
  speedup: reference time / candidate time, cold calls; None unless the sample is correct and
    was timed. speedup_warm: the same over warm calls (None where the verdict has none).
  """

  outcome: str
  compiled: bool = False
  correct: bool = False
  speedup: float | None = None
  speedup_warm: float | None = None

  def __post_init__(self):
    if self.correct and not self.compiled:
      raise ValueError("a correct sample must have compiled")
    for name, value in (("speedup", self.speedup), ("speedup_warm", self.speedup_warm)):
      if value is not None and not (self.correct and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number of a correct sample, got "
                         f"{value} (correct={self.correct})")

  def fast(self, p: float) -> bool:
    return self.correct and self.speedup is not None and self.speedup > p


@dataclasses.dataclass(frozen=True)
class ProblemScores:
  """All samples of one problem."""

  problem_id: str
  level: int | None
  samples: tuple[SampleScore, ...]

  def __post_init__(self):
    if not self.samples:
      raise ValueError(f"problem {self.problem_id!r} has no samples")


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k: 1 - C(n-c, k) / C(n, k), as the product form that cannot overflow."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def geometric_mean(values: Iterable[float]) -> float | None:
  """exp(mean(log x)) of positive values; None for none."""
  values = list(values)
  if not values:
    return None
  if any(not v > 0 for v in values):
    raise ValueError(f"geometric mean needs positive values, got {min(values)}")
  return float(math.exp(math.fsum(math.log(v) for v in values) / len(values)))


def default_ks(n_min: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to n_min, and n_min itself."""
  ks = {n_min}
  k = 1
  while k <= n_min:
    ks.add(k)
    k *= 2
  return tuple(sorted(ks))


def _per_problem_mean(problems: Sequence[ProblemScores], hit) -> float:
  return float(np.mean([np.mean([hit(s) for s in p.samples]) for p in problems]))


def fast_p(problems: Sequence[ProblemScores], p: float) -> float:
  """fast_p over every sample of every problem (see module docstring)."""
  return _per_problem_mean(problems, lambda s: s.fast(p))


def curve_ps(problems: Sequence[ProblemScores]) -> list[float]:
  """p from 0 to max(2.5, the largest speedup, capped at 10) in CURVE_STEP steps."""
  top = max([s.speedup for p in problems for s in p.samples if s.speedup is not None], default=0.0)
  end = min(max(2.5, top * 1.05), 10.0)
  return [round(i * CURVE_STEP, 4) for i in range(int(round(end / CURVE_STEP)) + 1)]


def correctness_available(problems: Sequence[ProblemScores]) -> bool:
  return not any(s.outcome == "NO_GPU" for p in problems for s in p.samples)


def group_metrics(problems: Sequence[ProblemScores], *, ps: Sequence[float] = FAST_P,
                  ks: Sequence[int] | None = None, curve: bool = True) -> dict[str, Any]:
  """The metrics of one group of problems as a JSON-ready dict (None where unavailable)."""
  if not problems:
    raise ValueError("no problems to score")
  samples = [s for p in problems for s in p.samples]
  outcomes: dict[str, int] = {}
  for s in samples:
    outcomes[s.outcome] = outcomes.get(s.outcome, 0) + 1
  n_min = min(len(p.samples) for p in problems)
  available = correctness_available(problems)
  speedups = [s.speedup for s in samples if s.speedup is not None]
  out: dict[str, Any] = {
      "problems": len(problems),
      "samples": len(samples),
      "samples_per_problem": n_min if all(len(p.samples) == n_min for p in problems) else None,
      "outcomes": dict(sorted(outcomes.items())),
      "compile_rate": _per_problem_mean(problems, lambda s: s.compiled),
      "correctness_available": available,
      "no_gpu": outcomes.get("NO_GPU", 0),
      "infra_errors": outcomes.get("INFRA_ERROR", 0),
      "bad_reference": outcomes.get("BAD_REFERENCE", 0),
  }
  if not available:
    out.update({"correct_rate": None, "pass_at_k": None, "timed_correct": None,
                "speedup_mean": None, "speedup_geomean": None, "speedup_median": None,
                "speedup_warm_geomean": None, "speedup_warm_median": None,
                "fast_p_curve": None}, **{fast_key(p): None for p in ps})
    return out
  ks = ks or default_ks(n_min)
  if max(ks) > n_min:
    raise ValueError(f"pass@{max(ks)} needs at least {max(ks)} samples per problem; the smallest "
                     f"problem has {n_min}")
  out["correct_rate"] = _per_problem_mean(problems, lambda s: s.correct)
  out.update({fast_key(p): fast_p(problems, p) for p in ps})
  out["pass_at_k"] = {str(k): float(np.mean([
      pass_at_k(len(p.samples), sum(s.correct for s in p.samples), k) for p in problems]))
                      for k in ks}
  out["timed_correct"] = len(speedups)
  out["speedup_mean"] = float(np.mean(speedups)) if speedups else None
  out["speedup_geomean"] = geometric_mean(speedups)
  out["speedup_median"] = float(np.median(speedups)) if speedups else None
  warm = [s.speedup_warm for s in samples if s.speedup_warm is not None]
  out["speedup_warm_geomean"] = geometric_mean(warm)
  out["speedup_warm_median"] = float(np.median(warm)) if warm else None
  if curve:
    grid = curve_ps(problems)
    out["fast_p_curve"] = {"p": grid, "fast_p": [fast_p(problems, p) for p in grid]}
  return out


def fast_key(p: float) -> str:
  """fast_1, fast_2, fast_1.5."""
  return f"fast_{p:g}"


def level_key(level: int | None) -> str:
  return "unleveled" if level is None else f"level_{level}"


def summarize(problems: Sequence[ProblemScores], *, ps: Sequence[float] = FAST_P,
              ks: Sequence[int] | None = None) -> dict[str, Any]:
  """{"overall": metrics, "levels": {"level_1": metrics, ...}} (levels sorted, unleveled last)."""
  by_level: dict[int | None, list[ProblemScores]] = {}
  for p in problems:
    by_level.setdefault(p.level, []).append(p)
  order = sorted(by_level, key=lambda lv: (lv is None, lv if lv is not None else 0))
  return {"overall": group_metrics(problems, ps=ps, ks=ks),
          "levels": {level_key(lv): group_metrics(by_level[lv], ps=ps, ks=ks) for lv in order}}


def groups(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
  """[(name, metrics)] of a summary: each level, then "overall" (for tables and plots)."""
  return list(summary["levels"].items()) + [("overall", summary["overall"])]
