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

Stale rollouts (`decoupled=True`, set by dice_jax.rl.setup when `pipeline.overlap` samples step
k+1 before update k and `algo.stale_correction=decoupled`). Decision: re-score, not forbid. Before
its first minibatch the update scores every row under the params it starts from (the *proximal*
policy, `RLBatch.prox_logp`), one forward pass per micro-batch of the split, no gradient; the loss
then takes its ratio and trust region against those and weights each token by the truncated
importance weight min(pi_prox / pi_behaviour, algo.is_cap) (dice_jax.rl.loss). So the clip sees
only this update's own drift however stale the rollout, and the behaviour policy's log-probs
(`old_logp`, from the params that sampled) only enter through that weight. Forbidding
overlap would leave the accelerator idle while kernels compile; re-scoring the old log-probs with
the sampling params is what `old_logp` already is (algo.old_logprobs). The cost is one forward
pass of the batch per update (about a third of the update's compute); a fresh rollout's weight is
1 up to the sampler/trainer numeric mismatch, which it then also corrects.

The batch is a dice_jax.rl.batch.RLBatch (all rows on the leading axis, sharded over data x
fsdp): the rollout and its old log-probs, the rewards, and `ref_logp` when the KL is to a frozen
reference (`AlgoSection.uses_reference`). Nothing here does I/O or branches on traced values; compile it once with
dice_jax.train.step.compile_train_step (explicit shardings, the state donated).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dice_jax.config import require
from dice_jax.rl import advantages as advantages_lib
from dice_jax.rl import loss as loss_lib
from dice_jax.rl.batch import RLBatch
from dice_jax.rl.logprobs import policy_logprobs
from dice_jax.sampler.config import Resolved
from dice_jax.train.optim import cast_floating, lr_scale
from dice_jax.train.step import make_train_step, reduce_metric
from dice_jax.train.train_state import TrainState


@dataclasses.dataclass(frozen=True)
class AlgoSection:
  """The update's estimators and loss, each chosen by name from its registry (the `algo` config
  section of `dice train`)."""
  advantage: Literal["grpo", "drgrpo", "rloo"] = "grpo"
  logprob: Literal["trace", "one_step", "coupled"] = "trace"
  loss: Literal["clipped", "unclipped"] = "clipped"
  clip_eps: float = 0.2
  clip_eps_high: float | None = None  # null: clip_eps (symmetric)
  kl_beta: float = 0.01  # 0 turns the KL term off
  kl_reference: Literal["old", "reference"] = "old"  # KL to the proximal (old) policy or the start model
  # k2: Huber d^2/2, gradient bounded by the clamp; k3: DICE's estimator, gradient up to e^10 (loss.py).
  kl_estimator: Literal["k2", "k3"] = "k2"
  dual_clip: float | None = 3.0  # A < 0: the surrogate is capped at dual_clip * |A| (null: off)
  # A rollout sampled before the previous update (pipeline.overlap): `decoupled` re-scores it under
  # the update's starting params and weights tokens by min(pi_prox / pi_behaviour, is_cap);
  # `none` takes the ratio against the behaviour policy (see the module docstring).
  stale_correction: Literal["decoupled", "none"] = "decoupled"
  is_cap: float = 2.0
  # "Old" log-probs (the ratio's denominator): the sampler's recorded ones (trace only), or
  # recomputed by the trainer's forward under the behaviour params (removes sampler/trainer
  # numeric mismatch, e.g. bf16 cached decoding; costs one forward per rollout).
  old_logprobs: Literal["sampler", "recompute"] = "sampler"
  norm_length: int | None = None  # the loss's constant length normaliser; null: rollout.gen_length
  prompt_mask_prob: float = 0.15  # one_step (d1): probability of masking each prompt token

  def __post_init__(self):
    require(0 < self.clip_eps < 1, "clip_eps", f"must be in (0, 1), got {self.clip_eps}")
    require(self.clip_eps_high is None or self.clip_eps_high > 0, "clip_eps_high",
            f"must be > 0, got {self.clip_eps_high}")
    require(self.kl_beta >= 0, "kl_beta", f"must be >= 0, got {self.kl_beta}")
    require(self.dual_clip is None or self.dual_clip > 1, "dual_clip", f"must be > 1 or null, got {self.dual_clip}")
    require(self.is_cap >= 1, "is_cap", f"must be >= 1, got {self.is_cap}")
    require(self.norm_length is None or self.norm_length > 0, "norm_length", f"must be > 0, got {self.norm_length}")
    require(0 <= self.prompt_mask_prob < 1, "prompt_mask_prob", f"must be in [0, 1), got {self.prompt_mask_prob}")
    require(self.logprob == "trace" or self.old_logprobs == "recompute", "old_logprobs",
            f"the sampler records trace log-probs only; logprob={self.logprob!r} needs old_logprobs=recompute")

  @property
  def uses_reference(self) -> bool:
    """Whether the KL is to a frozen reference model (whose log-probs the batch then carries)."""
    return self.kl_beta > 0 and self.kl_reference == "reference"


def make_loss_fn(graphdef: nnx.GraphDef, spec: Resolved, algo: AlgoSection) -> Callable:
  """loss_fn(params in compute dtype, minibatch, rng, context) -> (loss, metrics) for make_train_step.

  No context: a frozen reference's log-probs arrive precomputed in the batch (`ref_logp`, scored at
  rollout time), so the reference params never enter the update's program.
  """
  eps_high = algo.clip_eps if algo.clip_eps_high is None else algo.clip_eps_high
  norm_length = algo.norm_length or spec.gen_length

  def loss_fn(params: Any, mb: RLBatch, rng: jax.Array, context: Any = None):
    del rng, context  # masks come from the rows' own keys, so old and new log-probs see the same states
    logp_BxG, entropy_BxG = policy_logprobs(graphdef, params, spec, algo.logprob, mb, algo.prompt_mask_prob)
    loss, metrics = loss_lib.policy_loss(
        algo.loss, logp_BxG, mb.old_logp, mb.advantages, mb.weights, mb.valid,
        eps_low=algo.clip_eps, eps_high=eps_high, norm_length=norm_length, kl_beta=algo.kl_beta,
        kl_ref_BxG=mb.ref_logp, kl_estimator=algo.kl_estimator, dual_clip=algo.dual_clip,
        prox_logp_BxG=mb.prox_logp, is_cap=algo.is_cap)
    valid = mb.valid.astype(jnp.float32)
    metrics["entropy"] = jnp.sum(entropy_BxG * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    return loss, metrics

  return loss_fn


def _strided_split(batch: RLBatch, num: int) -> RLBatch:
  def split(x):
    return jnp.swapaxes(x.reshape(x.shape[0] // num, num, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def _proximal_logp(graphdef: nnx.GraphDef, spec: Resolved, algo: AlgoSection, params: Any, batch: RLBatch,
                   parts: int, compute_dtype: Any) -> jax.Array:
  """BxG log-probs of the batch under `params` (the update's starting point), scored `parts` strided
  micro-batches at a time so that the forward pass holds no more than a training micro-batch."""
  params = cast_floating(params, compute_dtype)

  def one(mb: RLBatch) -> jax.Array:
    return policy_logprobs(graphdef, params, spec, algo.logprob, mb, algo.prompt_mask_prob)[0]

  logp_NxRxG = jax.lax.map(one, _strided_split(batch, parts))
  return jnp.swapaxes(logp_NxRxG, 0, 1).reshape(batch.tokens.shape)


def make_update_step(graphdef: nnx.GraphDef, spec: Resolved, algo: AlgoSection, tx: optax.GradientTransformation,
                     schedule: optax.Schedule, *, group_size: int, num_minibatches: int, grad_accum_steps: int,
                     compute_dtype: Any, decoupled: bool = False
                     ) -> Callable[[TrainState, RLBatch], tuple[TrainState, dict]]:
  """`update_step(state, batch) -> (state, metrics)`; see the module docstring. `decoupled`: score
  the proximal policy's log-probs first (stale rollouts)."""
  train_step = make_train_step(make_loss_fn(graphdef, spec, algo), tx, schedule, compute_dtype=compute_dtype,
                               grad_accum_steps=grad_accum_steps)

  def update_step(state: TrainState, batch: RLBatch) -> tuple[TrainState, dict[str, jax.Array]]:
    rows = batch.rewards.shape[0]
    adv_PxG, weight_PxG, adv_metrics = advantages_lib.compute(
        algo.advantage, batch.rewards.reshape(rows // group_size, group_size),
        batch.reward_valid.reshape(rows // group_size, group_size))
    batch = dataclasses.replace(batch, advantages=adv_PxG.reshape(rows), weights=weight_PxG.reshape(rows))
    if decoupled:
      batch = dataclasses.replace(
          batch, prox_logp=_proximal_logp(graphdef, spec, algo, state.params, batch,
                                          num_minibatches * grad_accum_steps, compute_dtype))
    state, per_mb = jax.lax.scan(train_step, state, _strided_split(batch, num_minibatches))
    metrics = {k: reduce_metric(k, v) for k, v in per_mb.items()}
    scale = lr_scale(state.opt_state)
    if scale is not None:  # the KL guard's cut (dice_jax.rl.guard): the rate actually applied
      metrics["lr"] = metrics["lr"] * scale
    valid = batch.reward_valid.astype(jnp.float32)
    metrics["reward_mean"] = jnp.sum(batch.rewards * valid) / jnp.maximum(jnp.sum(valid), 1.0)
    return state, metrics | adv_metrics

  return update_step
