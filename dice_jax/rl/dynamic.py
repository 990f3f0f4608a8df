"""DAPO's dynamic sampling (Yu et al. 2025): a step's batch holds groups that carry a signal.

A group whose valid rewards are all equal (every response wrong, or every one right, under a binary
reward) has advantage 0 and weight 0 (dice_jax.rl.advantages): it costs sampling, verification and
an update's compute, and teaches nothing. With `rollout.dynamic_sampling` the loop, once a step's
rewards are known, counts the informative groups; while there are fewer than `prompts_per_step`
and fewer than `rollout.max_refills` extra rollouts were made, it draws prompts_per_step more
prompts from the data stream (in the step's phase mix), samples them with the current params and
waits for their verdicts (`fill`). The batch is then the first prompts_per_step informative groups
in sampling order, topped up, if the budget ran out, with the step's own uninformative groups
(which keep weight 0). Its shape never changes, so the update stays one compiled program.

Metrics (`dynamic/...`): `dropped_groups` (uninformative groups among all sampled this step),
`refills` (extra rollouts), `filled_groups` (uninformative groups kept to fill the batch) and
`sampled_rows` (responses verified this step: the verdict budget). Reward metrics of the step stay
those of its first rollout, an unfiltered sample of the policy.

Decision: a refill is a whole rollout of prompts_per_step prompts, the sampler call the run already
compiled, rather than exactly the missing number of prompts (another shape, another compile). A
single process only (checked at start-up): which groups to keep is decided where rewards are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dice_jax.rl import advantages
from dice_jax.rl.batch import RLBatch
from dice_jax.rl.rewarding import Scored
from dice_jax.rl.rollout import InFlight


@dataclasses.dataclass(frozen=True)
class Sampled:
  """One rollout with its verdicts in and its rewards scored."""
  rollout: InFlight
  scored: Scored


@dataclasses.dataclass(frozen=True)
class Filled:
  batch: RLBatch  # prompts_per_step groups, rewards set
  metrics: dict[str, float]


def informative(rewards: np.ndarray, valid: np.ndarray, group_size: int) -> np.ndarray:
  """Per group: at least two valid responses whose rewards differ (the advantage estimators' rule,
  dice_jax.rl.advantages, with its tolerance)."""
  r = np.asarray(rewards, np.float64).reshape(-1, group_size)
  v = np.asarray(valid, bool).reshape(-1, group_size)
  hi = np.where(v, r, -np.inf).max(axis=1)
  lo = np.where(v, r, np.inf).min(axis=1)
  return (v.sum(axis=1) >= 2) & (hi - lo > advantages.EQUAL)


def choose(signal: Sequence[np.ndarray], groups: int) -> list[tuple[int, int]]:
  """(rollout, group) pairs of the batch: informative groups in sampling order, then rollout 0's
  uninformative ones, `groups` in all."""
  picked = [(p, g) for p, part in enumerate(signal) for g in np.flatnonzero(part)][:groups]
  fill = [(0, int(g)) for g in np.flatnonzero(~signal[0])]
  return [(p, int(g)) for p, g in picked] + fill[:groups - len(picked)]


def fill(first: Sampled, more: Callable[[int], Sampled], *, groups: int, group_size: int, max_refills: int,
         reward_array: Callable[[np.ndarray, str], jax.Array]) -> Filled:
  """The step's batch from `first` and up to `max_refills` calls of `more(round)` (round 1, 2, ...),
  made only while fewer than `groups` informative groups are in hand. `reward_array` puts a row
  array in the batch's layout (RolloutEngine.reward_array)."""
  parts = [first]
  signal = [informative(first.scored.result.total, first.scored.result.valid, group_size)]
  while sum(int(s.sum()) for s in signal) < groups and len(parts) <= max_refills:
    parts.append(more(len(parts)))
    signal.append(informative(parts[-1].scored.result.total, parts[-1].scored.result.valid, group_size))
  chosen = choose(signal, groups)
  rows = np.array([p * groups * group_size + g * group_size + j for p, g in chosen for j in range(group_size)])
  total = np.concatenate([np.asarray(s.scored.result.total, np.float32) for s in parts])[rows]
  valid = np.concatenate([np.asarray(s.scored.result.valid, bool) for s in parts])[rows]
  if len(parts) == 1 and np.array_equal(rows, np.arange(len(rows))):
    batch = first.rollout.batch
  else:
    index = jnp.asarray(rows)
    batch = jax.tree.map(lambda *xs: jnp.concatenate(xs)[index], *[s.rollout.batch for s in parts])
  batch = dataclasses.replace(batch, rewards=reward_array(total, "float32"), reward_valid=reward_array(valid, "bool"))
  sampled = sum(len(s) for s in signal)
  metrics = {"dynamic/dropped_groups": float(sampled - sum(int(s.sum()) for s in signal)),
             "dynamic/refills": float(len(parts) - 1),
             "dynamic/filled_groups": float(sum(1 for p, g in chosen if not signal[p][g])),
             "dynamic/sampled_rows": float(sampled * group_size)}
  return Filled(batch=batch, metrics=metrics)
