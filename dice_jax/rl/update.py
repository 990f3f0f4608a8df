"""The RL update as ONE pure function `update_step(state, batch) -> (state, metrics)`.

One call consumes one rollout batch of P prompts x G responses (rows grouped by prompt):
  1. advantages and weights per group (dice_jax.rl.advantages, by name);
  2. the rows split into `num_minibatches` strided minibatches (row r -> minibatch r % m, so a
     batch sharded over devices stays where it is), scanned in order; each is one optimizer update
     of the shared SFT/RL step (dice_jax.train.step: float32 master params, compute-dtype forward,
     gradient accumulation, AdamW), so the later minibatches are off-policy and the clipped ratio
     and the KL to the behaviour policy do their work (DICE: 4 updates per rollout batch);
  3. metrics combined over minibatches and micro-batches by dice_jax.train.step.reduce_metric
     (ratio_max / ratio_min are the true max and min; the rest are means).

The batch (all rows on the leading axis, sharded over data x fsdp):
  prompt int32 BxP, prompt_lengths int32 B       the sampler's input
  tokens int32 BxG, valid bool BxG, commit_rank int32 BxG   the rollout (dice_jax.sampler.Rollout)
  old_logp float32 BxG    the behaviour policy's log-probs: recorded by the sampler, or recomputed
                          at rollout time with the params that sampled it (algo.old_logprobs)
  ref_logp float32 BxG    (only with algo.kl_reference=reference) the frozen start model's
  rewards float32 B, reward_valid bool B                    from the verifier and reward shaping
  score_keys uint32 Bx2   per-row keys of the one_step / coupled masks
Nothing here does I/O or branches on traced values; compile it once with
dice_jax.train.step.compile_train_step (explicit shardings, the state donated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dice_jax.rl import advantages as advantages_lib
from dice_jax.rl import loss as loss_lib
from dice_jax.rl.config import AlgoSection
from dice_jax.rl.logprobs import policy_logprobs
from dice_jax.rl.scoring import ScoringSpec
from dice_jax.train.step import make_train_step, reduce_metric
from dice_jax.train.train_state import TrainState


def batch_keys(algo: AlgoSection) -> tuple[str, ...]:
  keys = ("prompt", "prompt_lengths", "tokens", "valid", "commit_rank", "old_logp", "rewards", "reward_valid",
          "score_keys")
  return keys + (("ref_logp",) if algo.kl_beta > 0 and algo.kl_reference == "reference" else ())


def make_loss_fn(graphdef: nnx.GraphDef, spec: ScoringSpec, algo: AlgoSection) -> Callable:
  """loss_fn(params in compute dtype, minibatch, rng, context) -> (loss, metrics) for make_train_step.

  No context: a frozen reference's log-probs arrive precomputed in the batch (`ref_logp`, scored at
  rollout time), so the reference params never enter the update's program.
  """
  eps_high = algo.clip_eps if algo.clip_eps_high is None else algo.clip_eps_high
  norm_length = algo.norm_length or spec.gen_length

  def loss_fn(params: Any, mb: dict[str, jax.Array], rng: jax.Array, context: Any = None):
    del rng, context  # masks come from the rows' own keys, so old and new log-probs see the same states
    logp_BxG, entropy_BxG = policy_logprobs(graphdef, params, spec, algo.logprob, mb, algo.prompt_mask_prob)
    loss, metrics = loss_lib.policy_loss(
        algo.loss, logp_BxG, mb["old_logp"], mb["advantages"], mb["weights"], mb["valid"],
        eps_low=algo.clip_eps, eps_high=eps_high, norm_length=norm_length, kl_beta=algo.kl_beta,
        kl_ref_BxG=mb.get("ref_logp"))
    valid = mb["valid"].astype(jnp.float32)
    metrics["entropy"] = jnp.sum(entropy_BxG * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    return loss, metrics

  return loss_fn


def _strided_split(batch: dict[str, jax.Array], num: int) -> dict[str, jax.Array]:
  def split(x):
    return jnp.swapaxes(x.reshape(x.shape[0] // num, num, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def make_update_step(graphdef: nnx.GraphDef, spec: ScoringSpec, algo: AlgoSection, tx: optax.GradientTransformation,
                     schedule: optax.Schedule, *, group_size: int, num_minibatches: int, grad_accum_steps: int,
                     compute_dtype: Any) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
  """`update_step(state, batch) -> (state, metrics)`; see the module docstring."""
  train_step = make_train_step(make_loss_fn(graphdef, spec, algo), tx, schedule, compute_dtype=compute_dtype,
                               grad_accum_steps=grad_accum_steps)

  def update_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    rows = batch["rewards"].shape[0]
    adv_PxG, weight_PxG, adv_metrics = advantages_lib.compute(
        algo.advantage, batch["rewards"].reshape(rows // group_size, group_size),
        batch["reward_valid"].reshape(rows // group_size, group_size))
    batch = {**batch, "advantages": adv_PxG.reshape(rows), "weights": weight_PxG.reshape(rows)}
    state, per_mb = jax.lax.scan(train_step, state, _strided_split(batch, num_minibatches))
    metrics = {k: reduce_metric(k, v) for k, v in per_mb.items()}
    valid = batch["reward_valid"].astype(jnp.float32)
    metrics["reward_mean"] = jnp.sum(batch["rewards"] * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    return state, metrics | adv_metrics

  return update_step
