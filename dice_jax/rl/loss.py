"""Policy losses over per-token log-probs, chosen by name (`algo.loss`).

Per generated token t of response i (ratio r = exp(logp - old_logp), advantage A_i):
  clipped    -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)     (PPO/GRPO surrogate)
  unclipped  -r A                                                  (importance-weighted policy gradient)
plus `beta * k3`, the k3 estimator of KL(pi || pi_ref) = exp(d) - d - 1 with d = ref_logp - logp
clamped to +-10 as DICE does, where ref is the behaviour ("old") policy or a frozen reference model
(`algo.kl_reference`).

Normalisation is by a *constant*: the sum over every token of every response in the minibatch,
divided by (responses in the minibatch x `norm_length`), as Dr. GRPO argues: dividing each response
by its own length would favour short wrong answers and long right ones. Tokens after EOS (and of
never-generated blocks) have mask 0; responses with weight 0 (zero-variance groups, verdicts the
verifier could not give) contribute nothing, KL included. On-policy (old == current) the ratio is 1
and the gradient is exactly -A * grad logp per token (tests/rl check both).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


# DICE (and TraceRL) clamp the k3 log-ratio to this range: one token whose policy moved far from
# the reference (log-prob -30 against -2, say) would otherwise dominate the whole KL term.
KL_LOG_RATIO_CLAMP = 10.0


def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Schulman's k3 estimator of KL(pi || ref) per token, exp(d) - d - 1 with d = ref_logp - logp
  clamped to +-KL_LOG_RATIO_CLAMP: unbiased inside the clamp, >= 0, low variance, always finite."""
  d = jnp.clip(jax.lax.stop_gradient(ref_logp) - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
  return jnp.exp(d) - d - 1.0


def _clipped(ratio, adv, eps_low, eps_high):
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = -jnp.minimum(ratio * adv, clipped * adv)
  active = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
  return loss, active


def _unclipped(ratio, adv, eps_low, eps_high):
  del eps_low, eps_high
  return -ratio * adv, jnp.zeros(ratio.shape, jnp.bool_)


SurrogateFn = Callable[..., tuple[jax.Array, jax.Array]]
LOSSES: dict[str, SurrogateFn] = {"clipped": _clipped, "unclipped": _unclipped}


def policy_loss(name: str, logp_BxG: jax.Array, old_logp_BxG: jax.Array, advantages_B: jax.Array,
                weights_B: jax.Array, mask_BxG: jax.Array, *, eps_low: float, eps_high: float,
                norm_length: int, kl_beta: float = 0.0, kl_ref_BxG: jax.Array | None = None
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(scalar loss, metrics) of one minibatch; see the module docstring."""
  if name not in LOSSES:
    raise ValueError(f"policy loss {name!r}; choose one of {sorted(LOSSES)}")
  # Positions outside the mask (after EOS, never-generated blocks) hold whatever log-probs the
  # model gives them while the recorded ones are 0: they enter exp() as 0, so an extreme value there
  # cannot turn into inf * 0 = NaN in the masked sums (or in their gradients).
  logp = jnp.where(mask_BxG, logp_BxG.astype(jnp.float32), 0.0)
  old = jnp.where(mask_BxG, old_logp_BxG.astype(jnp.float32), 0.0)
  ref = old if kl_ref_BxG is None else jnp.where(mask_BxG, kl_ref_BxG.astype(jnp.float32), 0.0)
  ratio = jnp.exp(logp - jax.lax.stop_gradient(old))
  adv_BxG = jnp.broadcast_to(advantages_B[:, None], logp.shape).astype(jnp.float32)
  surrogate, clip_active = LOSSES[name](ratio, adv_BxG, eps_low, eps_high)
  kl = k3(logp, ref)
  token_w = mask_BxG.astype(jnp.float32) * weights_B[:, None].astype(jnp.float32)
  denominator = logp.shape[0] * float(norm_length)
  pg_loss = jnp.sum(surrogate * token_w) / denominator
  kl_loss = jnp.sum(kl * token_w) / denominator
  loss = pg_loss + kl_beta * kl_loss
  valid = mask_BxG.astype(jnp.float32)
  counted = jnp.maximum(jnp.sum(token_w), 1.0)
  n_valid = jnp.maximum(jnp.sum(valid), 1.0)
  metrics = {
      "pg_loss": pg_loss,
      "kl": jnp.sum(kl * valid) / n_valid,  # drift of every response, weighted or not
      "clip_frac": jnp.sum(clip_active * token_w) / counted,
      "ratio_mean": jnp.sum(ratio * valid) / n_valid,
      "ratio_max": jnp.max(jnp.where(mask_BxG, ratio, 1.0)),
      "ratio_min": jnp.min(jnp.where(mask_BxG, ratio, 1.0)),
      "logp_mean": jnp.sum(logp * valid) / n_valid,
      "response_tokens": jnp.sum(valid) / logp.shape[0],
  }
  return loss, metrics
