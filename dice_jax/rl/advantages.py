"""Group-relative advantage estimators, chosen by name (`algo.advantage`).

Each maps the rewards of P groups of G responses to the same prompt, `rewards_PxG`, and which of
them count, `valid_PxG` (False: the verifier could not judge the candidate, see
dice_jax.rewards.shaping), to per-response advantages and loss weights:

  grpo    (r - mean) / (std + eps)    within the group (DeepSeekMath's GRPO; std with ddof=1)
  drgrpo  r - mean                    (Dr. GRPO: no std, so easy and hard prompts weigh the same)
  rloo    r - mean of the others      (RLOO: leave-one-out baseline, unbiased)

Statistics use the valid responses of a group only. A group whose valid rewards are all equal
(or that has fewer than two valid responses) carries no signal: its responses get weight 0 (and
advantage 0), and the count is reported as `adv/zero_var_groups`. Invalid responses always get
weight 0. Pure jnp: the update step computes them inside its jitted program.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Estimator = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
_STD_EPS = 1e-4
EQUAL = 1e-6  # rewards closer than this are "equal" (no variance)


def _group_stats(rewards_PxG: jax.Array, valid_PxG: jax.Array):
  v = valid_PxG.astype(jnp.float32)
  count_P = jnp.sum(v, axis=1)
  mean_P = jnp.sum(rewards_PxG * v, axis=1) / jnp.maximum(count_P, 1.0)
  return v, count_P, mean_P


def _grpo(rewards_PxG, v, count_P, mean_P):
  centered = (rewards_PxG - mean_P[:, None]) * v
  std_P = jnp.sqrt(jnp.sum(centered**2, axis=1) / jnp.maximum(count_P - 1.0, 1.0))
  return centered / (std_P[:, None] + _STD_EPS)


def _drgrpo(rewards_PxG, v, count_P, mean_P):
  del count_P
  return (rewards_PxG - mean_P[:, None]) * v


def _rloo(rewards_PxG, v, count_P, mean_P):
  scale_P = count_P / jnp.maximum(count_P - 1.0, 1.0)  # r - mean(others) = n/(n-1) (r - mean)
  return (rewards_PxG - mean_P[:, None]) * v * scale_P[:, None]


ESTIMATORS: dict[str, Estimator] = {"grpo": _grpo, "drgrpo": _drgrpo, "rloo": _rloo}


def compute(name: str, rewards_PxG: jax.Array, valid_PxG: jax.Array
            ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """(advantages_PxG, weights_PxG in {0, 1}, metrics) under estimator `name`."""
  if name not in ESTIMATORS:
    raise ValueError(f"advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
  rewards_PxG = rewards_PxG.astype(jnp.float32)
  v, count_P, mean_P = _group_stats(rewards_PxG, valid_PxG)
  big = jnp.finfo(jnp.float32).max
  spread_P = (jnp.max(jnp.where(valid_PxG, rewards_PxG, -big), axis=1)
              - jnp.min(jnp.where(valid_PxG, rewards_PxG, big), axis=1))
  signal_P = (count_P >= 2) & (spread_P > EQUAL)
  weights_PxG = v * signal_P[:, None]
  advantages_PxG = ESTIMATORS[name](rewards_PxG, v, count_P, mean_P) * weights_PxG
  groups = rewards_PxG.shape[0]
  metrics = {
      "adv/zero_var_groups": jnp.sum(~signal_P).astype(jnp.float32),
      "adv/zero_var_frac": jnp.mean(~signal_P).astype(jnp.float32),
      "adv/abs_mean": jnp.sum(jnp.abs(advantages_PxG)) / jnp.maximum(jnp.sum(weights_PxG), 1.0),
      "adv/weighted_frac": jnp.sum(weights_PxG) / (groups * rewards_PxG.shape[1]),
  }
  return advantages_PxG, weights_PxG, metrics
