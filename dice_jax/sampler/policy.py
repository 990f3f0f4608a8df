"""The sampling policy of one denoising step: draw tokens, score them, choose which to commit.

Log-probability of a committed token (what TraceRL must recompute for an on-policy ratio of 1):
    log_softmax(logits_f32 / temperature)[token]
with `logits_f32` the model's float32 logits at that position given the partially masked state the
step decoded from, *before* top-k/top-p truncation (truncation only restricts which tokens can be
drawn, and the mask token is never drawn). Recomputing it needs no knowledge of top-k/top-p; the
trainer applies the same formula.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dice_jax.sampler.config import SamplerConfig

NEVER = jnp.iinfo(jnp.int32).max  # commit step of a position that was never committed


def _top_p_filter(scaled_NxV: jax.Array, top_p: float) -> jax.Array:
  """-inf outside the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
  sorted_NxV = -jnp.sort(-scaled_NxV, axis=-1)
  probs_NxV = jax.nn.softmax(sorted_NxV, axis=-1)
  mass_before_NxV = jnp.cumsum(probs_NxV, axis=-1) - probs_NxV
  kept_N = jnp.maximum(jnp.sum(mass_before_NxV < top_p, axis=-1), 1)
  cutoff_Nx1 = jnp.take_along_axis(sorted_NxV, kept_N[:, None] - 1, axis=-1)
  return jnp.where(scaled_NxV >= cutoff_Nx1, scaled_NxV, -jnp.inf)


def sample_tokens(logits_BxQxV: jax.Array, key: jax.Array, config: SamplerConfig, mask_id: int
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(tokens BxQ, log-probs BxQ, confidence BxQ) for every position of the block."""
  scaled_BxQxV = logits_BxQxV.astype(jnp.float32) / config.temperature
  log_norm_BxQ = jax.nn.logsumexp(scaled_BxQxV, axis=-1)  # log-probs without materialising them over V
  # The mask token is not text: never draw it (a trained model gives it ~no mass anyway).
  filtered = jnp.where(jnp.arange(scaled_BxQxV.shape[-1]) == mask_id, -jnp.inf, scaled_BxQxV)
  if config.greedy:
    tokens_BxQ = jnp.argmax(filtered, axis=-1)
  else:
    if config.top_k > 1:
      kth_BxQx1 = jax.lax.top_k(filtered, config.top_k)[0][..., -1:]
      filtered = jnp.where(filtered >= kth_BxQx1, filtered, -jnp.inf)
    if config.top_p < 1.0:
      b, q, v = filtered.shape
      filtered = _top_p_filter(filtered.reshape(b * q, v), config.top_p).reshape(b, q, v)
    tokens_BxQ = jax.random.categorical(key, filtered, axis=-1)
  tokens_BxQ = tokens_BxQ.astype(jnp.int32)
  logprob_BxQ = jnp.take_along_axis(scaled_BxQxV, tokens_BxQ[..., None], axis=-1)[..., 0] - log_norm_BxQ
  return tokens_BxQ, logprob_BxQ, jnp.exp(logprob_BxQ)


def _rank_desc(score_BxQ: jax.Array) -> jax.Array:
  """Rank of each entry in its row by descending score, ties broken by position (0 = best)."""
  q = score_BxQ.shape[1]
  idx = jnp.arange(q)
  better = (score_BxQ[:, None, :] > score_BxQ[:, :, None]) | (
      (score_BxQ[:, None, :] == score_BxQ[:, :, None]) & (idx[None, :] < idx[:, None]))
  return jnp.sum(better, axis=-1)


def select_commits(confidence_BxQ: jax.Array, masked_BxQ: jax.Array, block_step: jax.Array,
                   steps_per_block: int, config: SamplerConfig) -> jax.Array:
  """Which masked positions this step commits (see SamplerConfig's docstring for the rules)."""
  remaining_B = jnp.sum(masked_BxQ, axis=1)
  steps_left = jnp.maximum(steps_per_block - block_step, 1)
  count_B = -(-remaining_B // steps_left)  # ceil: the static schedule, >= 1 while anything is masked
  score_BxQ = jnp.where(masked_BxQ, confidence_BxQ, -jnp.inf)
  if config.mode == "dynamic":
    count_B = jnp.maximum(count_B, jnp.sum(masked_BxQ & (confidence_BxQ >= config.threshold), axis=1))
  return masked_BxQ & (_rank_desc(score_BxQ) < count_B[:, None])
