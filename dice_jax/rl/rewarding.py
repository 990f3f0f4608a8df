"""Verdicts -> rewards and reward metrics for one rollout, through the reward-shaping library API.

The shaper is dice_jax.rewards.defaults.make_shaper of the `rewards` section (a RewardConfig:
presets, per-component weights and normalisation, hack policy, the `rewards.custom` functions)
plus any `RewardComponent`s a Python caller hands to `run_rl`. Every component is logged on its own
(`reward/<name>`, `phase<p>/reward/<name>`). On top, per-row facts read from the verdicts give the
console's rates: `compile`, `correct`, `speedup` (geometric mean over correct, timed kernels),
`format` (code could be extracted), overall and per phase.

With several processes each one scores its own rows (groups never straddle processes, so group
normalisation is exact; `batch` normalisation is per process); the rates are computed over all
rows (the per-row facts are gathered).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.rewards import defaults, outcomes
from dice_jax.rewards.shaping import RewardResult, RewardShaper


@dataclasses.dataclass(frozen=True)
class Scored:
  result: RewardResult  # this process's rows
  metrics: dict[str, float]
  speedups: np.ndarray  # of correct, timed kernels (all rows)
  labels: list[str]  # this process's rows: what happened to each (dice_jax.rewards.outcomes)


# Label <-> number, so labels travel with the other per-row facts when processes gather them.
_LABELS = (*outcomes.LABELS, *(n for n in pb.Outcome.keys() if n not in outcomes.LABELS))


def _facts(verdicts: Sequence[pb.Verdict]) -> np.ndarray:
  """[rows, 5]: compiled, correct, speedup (nan if none), code extracted, label index."""
  out = np.zeros((len(verdicts), 5), np.float64)
  for i, v in enumerate(verdicts):
    timed = v.outcome == pb.OK and v.HasField("timing") and v.timing.speedup > 0
    label = outcomes.label(v)
    out[i] = (defaults.compiled(v), v.outcome == pb.OK, v.timing.speedup if timed else math.nan,
              label != outcomes.FORMAT, _LABELS.index(label))
  return out


def _gather(x: np.ndarray) -> np.ndarray:
  return np.asarray(multihost_utils.process_allgather(x, tiled=True)) if jax.process_count() > 1 else x


def _rates(facts: np.ndarray, prefix: str) -> dict[str, float]:
  if not len(facts):
    return {}
  out = {f"{prefix}compile": float(facts[:, 0].mean()), f"{prefix}correct": float(facts[:, 1].mean()),
         f"{prefix}format": float(facts[:, 3].mean())}
  timed = facts[:, 2][np.isfinite(facts[:, 2])]
  if len(timed):
    out[f"{prefix}speedup"] = float(np.exp(np.mean(np.log(timed))))
  return out


def score(shaper: RewardShaper, prompts: Sequence[str], completions: Sequence[str], verdicts: Sequence[pb.Verdict],
          columns: dict[str, list], group_ids: Sequence[int]) -> Scored:
  """Rewards of this process's rows and the metrics of all rows (`group_ids`: the GRPO group of each
  row, for components normalised per group)."""
  result = shaper(list(prompts), list(completions), list(verdicts), group_ids=list(group_ids), **columns)
  local = np.concatenate([_facts(verdicts), np.asarray(columns["phase"], np.float64)[:, None],
                          result.total[:, None], result.valid[:, None]], axis=1)
  rows = _gather(local)
  facts, phase, total, valid = rows[:, :5], rows[:, 5], rows[:, 6], rows[:, 7] > 0
  metrics = dict(result.metrics)
  metrics["reward"] = float(total[valid].mean()) if valid.any() else 0.0
  metrics |= _rates(facts, "")
  metrics |= outcomes.metrics([_LABELS[int(i)] for i in facts[:, 4]], [int(p) for p in phase])
  for p in (1, 2):
    sel = phase == p
    metrics |= _rates(facts[sel], f"phase{p}/")
    if sel.any():
      metrics[f"phase{p}/reward"] = float(total[sel & valid].mean()) if (sel & valid).any() else 0.0
  speedups = facts[:, 2][np.isfinite(facts[:, 2])]
  return Scored(result=result, metrics=metrics, speedups=speedups, labels=[outcomes.label(v) for v in verdicts])
