"""Reward shaping: the library API users write rewards against (README.md, "Reward shaping").

A reward function is a plain callable

    fn(prompts, completions, verdicts, **item_columns) -> list[float]

with one entry per completion: `prompts` and `completions` are the texts (Tunix's shape),
`verdicts` the verifier's `Verdict` protos, and `item_columns` the data columns repeated per
completion (`phase`, `problem_id`, `level`, `reference_source`, `prefix`, `suffix`, ...; accept
`**kwargs` and take what you need). `RewardShaper` composes several with explicit weights:

    shaper = RewardShaper([RewardComponent("correct", correctness_reward, weight=1.0),
                           RewardComponent("speed", speedup_reward(), 0.5, normalize="group")])
    result = shaper(prompts, completions, verdicts, group_ids=ids, **columns)
    result.total        # per-completion reward for the advantage estimator
    result.metrics      # {"reward/correct": ..., "reward/speed": ..., "phase2/reward/total": ...}

Each component is computed, optionally z-scored on its own ("batch": over the batch, "group": over
completions with the same group id), multiplied by its weight, and summed.

Two kinds of verdict are not scored as the candidate's performance:
- *Excluded* outcomes (`exclude`; default INFRA_ERROR, BAD_REFERENCE and NO_GPU): the verifier
  could not judge the candidate, so "incorrect" would be a lie. They get total 0 and
  `valid=False`; the trainer must give them zero weight in the loss (and logs
  `reward/excluded_frac`). NO_GPU is excluded by default because correctness was never run; the
  `compile_only` preset (see defaults.py) drops it from the set and scores compilation only.
- *Hacks* (`HackPolicy`): a verdict carrying exploit findings (`Verdict.exploits`, which is also
  how the verifier explains a REJECTED-for-exploit verdict) gets total 0 (`mode="zero"`), or
  `-penalty` (`mode="penalty"`, replacing the total so an exploit can never keep other credit),
  or is left alone (`mode="ignore"`). `exploits` limits which kinds count (default: all).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from dice.verifier.v1 import verifier_pb2 as pb

RewardFn = Callable[..., Sequence[float]]
Normalize = Literal["none", "batch", "group"]
DEFAULT_EXCLUDED = frozenset({pb.INFRA_ERROR, pb.BAD_REFERENCE, pb.NO_GPU})


@dataclasses.dataclass(frozen=True)
class RewardComponent:
  """A named reward function, its weight, and whether it is z-scored before the weighted sum."""

  name: str
  fn: RewardFn
  weight: float = 1.0
  normalize: Normalize = "none"

  def __post_init__(self):
    if not self.name or "/" in self.name:
      raise ValueError(f"reward component name must be non-empty without '/', got {self.name!r}")
    if not math.isfinite(self.weight):
      raise ValueError(f"reward component {self.name!r}: weight must be finite, got {self.weight}")
    if self.normalize not in ("none", "batch", "group"):
      raise ValueError(f"reward component {self.name!r}: normalize must be none, batch or group, "
                       f"got {self.normalize!r}")


@dataclasses.dataclass(frozen=True)
class HackPolicy:
  """What a verdict with exploit findings gets (see the module docstring)."""

  mode: Literal["zero", "penalty", "ignore"] = "zero"
  penalty: float = 1.0
  exploits: frozenset[int] | None = None  # Exploit enum values that count; None: every kind

  def __post_init__(self):
    if self.mode not in ("zero", "penalty", "ignore"):
      raise ValueError(f"hack policy mode must be zero, penalty or ignore, got {self.mode!r}")
    if not (math.isfinite(self.penalty) and self.penalty >= 0):
      raise ValueError(f"hack penalty must be finite and >= 0, got {self.penalty}")

  def flags(self, verdicts: Sequence[pb.Verdict]) -> np.ndarray:
    return np.array([any(self.exploits is None or f.kind in self.exploits for f in v.exploits)
                     for v in verdicts], dtype=bool)


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """Per-completion arrays (shape [N]) and scalar metrics for logging."""

  total: np.ndarray                   # float32, what the advantage estimator uses
  components: dict[str, np.ndarray]   # raw values per component
  normalized: dict[str, np.ndarray]   # after each component's own normalisation (raw if "none")
  valid: np.ndarray                   # bool; False: excluded outcome, give it zero weight
  hacked: np.ndarray                  # bool; exploit findings under the hack policy's kinds
  metrics: dict[str, float]


def zscore(x: np.ndarray, mask: np.ndarray, groups: np.ndarray | None = None,
           eps: float = 1e-6) -> np.ndarray:
  """(x - mean) / std over masked entries, per group when `groups` is given; 0 where std < eps.

  A group whose values are all equal carries no signal, so it becomes 0 rather than noise.
  Entries outside `mask` are 0 and do not enter the statistics.
  """
  out = np.zeros_like(x, dtype=np.float64)
  keys = np.zeros(len(x), dtype=np.int64) if groups is None else groups
  for key in np.unique(keys[mask]) if mask.any() else []:
    sel = mask & (keys == key)
    values = x[sel].astype(np.float64)
    std = values.std()
    if std >= eps:
      out[sel] = (values - values.mean()) / std
  return out


def _group_index(group_ids: Sequence[Hashable], n: int) -> np.ndarray:
  if len(group_ids) != n:
    raise ValueError(f"group_ids has {len(group_ids)} entries for {n} completions")
  index: dict[Hashable, int] = {}
  return np.array([index.setdefault(g, len(index)) for g in group_ids], dtype=np.int64)


class RewardShaper:
  """Weighted sum of reward components with per-component normalisation, exclusion and hack policy."""

  def __init__(self, components: Sequence[RewardComponent], *, hack: HackPolicy = HackPolicy(),
               exclude: frozenset[int] = DEFAULT_EXCLUDED, eps: float = 1e-6):
    if not components:
      raise ValueError("a reward shaper needs at least one component")
    names = [c.name for c in components]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
      raise ValueError(f"reward component names must be unique; repeated: {duplicates}")
    self.components, self.hack, self.exclude, self.eps = tuple(components), hack, frozenset(exclude), eps

  def __call__(self, prompts: Sequence[Any], completions: Sequence[str],
               verdicts: Sequence[pb.Verdict], *, group_ids: Sequence[Hashable] | None = None,
               **item_columns: Sequence[Any]) -> RewardResult:
    n = len(completions)
    for name, column in [("prompts", prompts), ("verdicts", verdicts), *item_columns.items()]:
      if len(column) != n:
        raise ValueError(f"{name} has {len(column)} entries for {n} completions; item columns must be "
                         "repeated per completion")
    groups = _group_index(group_ids, n) if group_ids is not None else None
    valid = np.array([v.outcome not in self.exclude for v in verdicts], dtype=bool)
    hacked = self.hack.flags(verdicts) if self.hack.mode != "ignore" else np.zeros(n, dtype=bool)
    scored = valid & ~hacked  # hacks are overwritten below, so they stay out of the statistics
    raw, normalized = {}, {}
    total = np.zeros(n, dtype=np.float64)
    for c in self.components:
      values = self._evaluate(c, prompts, completions, verdicts, item_columns, n)
      raw[c.name] = values
      if c.normalize == "none":
        normalized[c.name] = np.where(valid, values, 0.0)
      elif c.normalize == "batch":
        normalized[c.name] = zscore(values, scored, None, self.eps)
      else:
        if groups is None:
          raise ValueError(f"reward component {c.name!r} normalises per group: pass group_ids")
        normalized[c.name] = zscore(values, scored, groups, self.eps)
      total += c.weight * normalized[c.name]
    if self.hack.mode == "zero":
      total[hacked] = 0.0
    elif self.hack.mode == "penalty":
      total[hacked] = -self.hack.penalty
    total[~valid] = 0.0
    metrics = _metrics(raw, total, valid, hacked, verdicts, item_columns.get("phase"))
    return RewardResult(total=total.astype(np.float32), components=raw, normalized=normalized,
                        valid=valid, hacked=hacked, metrics=metrics)

  @staticmethod
  def _evaluate(c: RewardComponent, prompts, completions, verdicts, columns, n: int) -> np.ndarray:
    values = c.fn(prompts, completions, verdicts, **columns)
    try:
      array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
      raise ValueError(f"reward component {c.name!r} must return numbers: {e}") from None
    if array.shape != (n,):
      raise ValueError(f"reward component {c.name!r} returned shape {array.shape}, expected ({n},)")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
      raise ValueError(f"reward component {c.name!r} returned {array[bad[0]]} at index {bad[0]}")
    return array


def _summary(raw: Mapping[str, np.ndarray], total: np.ndarray, valid: np.ndarray, hacked: np.ndarray,
             verdicts: Sequence[pb.Verdict], prefix: str) -> dict[str, float]:
  metrics = {f"{prefix}reward/total": float(total[valid].mean()) if valid.any() else 0.0,
             f"{prefix}reward/excluded_frac": float(1.0 - valid.mean()) if len(valid) else 0.0,
             f"{prefix}reward/hacked_frac": float(hacked.mean()) if len(hacked) else 0.0}
  for name, values in raw.items():
    metrics[f"{prefix}reward/{name}"] = float(values[valid].mean()) if valid.any() else 0.0
  counts = collections.Counter(pb.Outcome.Name(v.outcome) for v in verdicts)
  for outcome, count in counts.items():
    metrics[f"{prefix}verdict/{outcome.lower()}_frac"] = count / len(verdicts)
  return metrics


def _metrics(raw, total, valid, hacked, verdicts, phases) -> dict[str, float]:
  """Batch metrics, and the same per phase when a `phase` column is given."""
  metrics = _summary(raw, total, valid, hacked, verdicts, "")
  if phases is not None:
    phases = np.asarray(phases)
    for phase in np.unique(phases):
      sel = phases == phase
      part = {name: values[sel] for name, values in raw.items()}
      metrics |= _summary(part, total[sel], valid[sel], hacked[sel],
                          [v for v, s in zip(verdicts, sel) if s], f"phase{int(phase)}/")
  return metrics
