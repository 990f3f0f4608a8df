"""Verdicts -> rewards and reward metrics for one rollout, through the reward-shaping library API.

The shaper is dice_jax.rewards' `make_shaper` (presets, per-component weights and normalisation,
hack policy) plus the config's `rewards.custom` functions (`module:function`, imported here) plus
any `RewardComponent`s a Python caller hands to `run_rl`. Every component is logged on its own
(`reward/<name>`, `phase<p>/reward/<name>`). On top, per-row facts read from the verdicts give the
console's rates: `compile`, `correct`, `speedup` (geometric mean over correct, timed kernels),
`format` (code could be extracted), overall and per phase.

With several processes each one scores its own rows (groups never straddle processes, so group
normalisation is exact; `batch` normalisation is per process); the rates are computed over all
rows (the per-row facts are gathered).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import sys
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.config import ConfigError
from dice_jax.rewards import defaults, outcomes
from dice_jax.rewards.shaping import RewardComponent, RewardResult, RewardShaper
from dice_jax.rl.config import RewardsSection


def resolve_preset(section: RewardsSection, has_gpu: bool) -> str:
  if section.preset != "auto":
    return section.preset
  return "default" if has_gpu else "compile_only"


def _import_module(module_name: str):
  """`module_name` as installed, else from the working directory (as `python -m` would find it).

  Decision: the working directory is tried second and then stays on sys.path (so the module's own
  sibling imports work): a user's `myrewards.py` is found without PYTHONPATH=., yet cannot shadow
  an installed package of the same name.
  """
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    top = module_name.split(".")[0]
    cwd = os.getcwd()
    if e.name != top or cwd in sys.path:
      raise
    sys.path.append(cwd)
    return importlib.import_module(module_name)


def _import(path: str, name: str):
  module_name, _, attr = path.partition(":")
  try:
    fn = getattr(_import_module(module_name.strip()), attr.strip())
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"rewards.custom.{name}.fn: cannot import {path!r} (from the installed "
                      f"packages or {os.getcwd()}): {e}") from None
  if not callable(fn):
    raise ConfigError(f"rewards.custom.{name}.fn: {path!r} is not callable")
  return fn


def custom_components(section: RewardsSection) -> list[RewardComponent]:
  """The config's `rewards.custom` functions, imported (a bad path fails here, before anything starts)."""
  return [RewardComponent(name, _import(spec.fn, name), section.weights.get(name, spec.weight),
                          section.normalize.get(name, spec.normalize)) for name, spec in section.custom.items()]


def build_shaper(section: RewardsSection, has_gpu: bool, extra: Sequence[RewardComponent] = ()) -> RewardShaper:
  """The run's RewardShaper: preset (`auto` resolved against the verifier) + custom + `extra`."""
  custom = custom_components(section)
  try:
    base = defaults.RewardConfig(
        preset=resolve_preset(section, has_gpu),
        weights={k: v for k, v in section.weights.items() if k not in section.custom},
        normalize={k: v for k, v in section.normalize.items() if k not in section.custom},
        hack_mode=section.hack_mode, hack_penalty=section.hack_penalty,
        speedup_min_log2=section.speedup_min_log2, speedup_max_log2=section.speedup_max_log2)
    return defaults.make_shaper(base, extra=[*custom, *extra])
  except ValueError as e:
    raise ConfigError(f"rewards: {e}") from None


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
