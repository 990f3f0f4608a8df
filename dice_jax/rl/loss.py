"""Policy losses over per-token log-probs, chosen by name (`algo.loss`), and the KL estimators.

Per generated token t of response i, with advantage A_i and the ratio r = exp(logp - prox_logp)
to the *proximal* policy (the params at the start of this update; the behaviour policy that
sampled the rollout unless a stale rollout was re-scored, see below):
  clipped    -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)     (PPO/GRPO surrogate)
             and, for A < 0, at most `dual_clip` * |A| (dual clip)
  unclipped  -r A                                                  (importance-weighted policy gradient)
plus `beta * KL` per token (`algo.kl_estimator`) to the proximal policy or a frozen reference
model (`algo.kl_reference`), with d = logp - ref_logp:
  k2   d^2 / 2 inside |d| <= C, linear beyond (a Huber loss): its gradient is clip(d, -C, C) per
       token, so a collapsed token pulls back with a force of at most C. On-policy, the gradient of
       E[d^2 / 2] is E[d grad logp] = grad KL(pi || ref) (Tang & Munos 2025, arXiv 2506.09477).
  k3   exp(-d) + d - 1 with d clamped to +-C (Schulman's estimator, as DICE uses it as a loss). Its
       gradient 1 - exp(-d) reaches e^C ~ 22,000 at the clamp (and 0 beyond it), and it is the
       gradient of a different divergence; kept for recipes that reproduce DICE.
C is `KL_LOG_RATIO_CLAMP`; `kl_clamp_frac` is the share of valid tokens with |d| >= C.

Dual clip (Ye et al. 2020): with A < 0 the clipped surrogate -min(r A, clip(r) A) = r |A| grows
without bound in r, so one token whose probability rose 50-fold under a negative advantage would
dominate the minibatch (ratio_max 23 was logged in a collapsed run). Capping it at c |A| stops
its gradient once r > c; `dual_clip_frac` counts those tokens.

Stale rollouts (dice_jax.rl.update, `algo.stale_correction=decoupled`): a rollout sampled before
the previous update finished was drawn by older params (the behaviour policy, `old_logp`). The
decoupled objective (Hilton et al. 2021) takes the ratio and its trust region against the proximal
policy `prox_logp` and weights each token by w = min(exp(prox_logp - old_logp), is_cap), a
truncated importance weight from behaviour to proximal (no gradient through it). Without
`prox_logp` the proximal policy is the behaviour policy and w = 1.

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
import optax


# C: the KL's log-ratio clamp, as DICE (and TraceRL) clamp k3's. One token whose policy moved far
# from the reference (log-prob -30 against -2, say) would otherwise dominate the whole KL term.
KL_LOG_RATIO_CLAMP = 10.0


def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Schulman's k3 estimator of KL(pi || ref) per token, exp(d) - d - 1 with d = ref_logp - logp
  clamped to +-KL_LOG_RATIO_CLAMP: unbiased inside the clamp, >= 0, low variance, always finite."""
  d = jnp.clip(jax.lax.stop_gradient(ref_logp) - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
  return jnp.exp(d) - d - 1.0


def k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """d^2 / 2 per token with d = logp - ref_logp, linear beyond |d| = KL_LOG_RATIO_CLAMP (optax's
  Huber loss): the gradient with respect to logp is clip(d, -C, C), bounded everywhere."""
  return optax.huber_loss(logp - jax.lax.stop_gradient(ref_logp), delta=KL_LOG_RATIO_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {"k2": k2, "k3": k3}


def _clipped(ratio, adv, eps_low, eps_high, dual_clip):
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = -jnp.minimum(ratio * adv, clipped * adv)
  active = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
  dual = (adv < 0) & (ratio > dual_clip)
  return jnp.where(dual, -dual_clip * adv, loss), active | dual, dual


def _unclipped(ratio, adv, eps_low, eps_high, dual_clip):
  del eps_low, eps_high, dual_clip
  none = jnp.zeros(ratio.shape, jnp.bool_)
  return -ratio * adv, none, none


# (ratio, advantage, eps_low, eps_high, dual_clip) -> (per-token loss, gradient stopped, dual-clipped)
SurrogateFn = Callable[..., tuple[jax.Array, jax.Array, jax.Array]]
LOSSES: dict[str, SurrogateFn] = {"clipped": _clipped, "unclipped": _unclipped}


def policy_loss(name: str, logp_BxG: jax.Array, old_logp_BxG: jax.Array, advantages_B: jax.Array,
                weights_B: jax.Array, mask_BxG: jax.Array, *, eps_low: float, eps_high: float,
                norm_length: int, kl_beta: float = 0.0, kl_ref_BxG: jax.Array | None = None,
                kl_estimator: str = "k2", dual_clip: float | None = 3.0,
                prox_logp_BxG: jax.Array | None = None, is_cap: float = 2.0
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(scalar loss, metrics) of one minibatch; see the module docstring.

  `old_logp_BxG` is the behaviour policy's; `prox_logp_BxG` (None: the behaviour policy's) the
  proximal one; `kl_ref_BxG` (None: the proximal policy) what the KL is measured against.
  """
  if name not in LOSSES:
    raise ValueError(f"policy loss {name!r}; choose one of {sorted(LOSSES)}")
  if kl_estimator not in KL_ESTIMATORS:
    raise ValueError(f"KL estimator {kl_estimator!r}; choose one of {sorted(KL_ESTIMATORS)}")
  # Positions outside the mask (after EOS, never-generated blocks) hold whatever log-probs the
  # model gives them while the recorded ones are 0: they enter exp() as 0, so an extreme value there
  # cannot turn into inf * 0 = NaN in the masked sums (or in their gradients).
  def masked(x):
    return jnp.where(mask_BxG, jax.lax.stop_gradient(x).astype(jnp.float32), 0.0)

  logp = jnp.where(mask_BxG, logp_BxG.astype(jnp.float32), 0.0)
  old = masked(old_logp_BxG)
  prox = old if prox_logp_BxG is None else masked(prox_logp_BxG)
  ref = prox if kl_ref_BxG is None else masked(kl_ref_BxG)
  is_w = jnp.minimum(jnp.exp(prox - old), is_cap)  # 1 when the proximal policy is the behaviour one
  ratio = jnp.exp(logp - prox)
  adv_BxG = jnp.broadcast_to(advantages_B[:, None], logp.shape).astype(jnp.float32)
  cap = jnp.inf if dual_clip is None else dual_clip
  surrogate, clip_active, dual_active = LOSSES[name](ratio, adv_BxG, eps_low, eps_high, cap)
  kl = KL_ESTIMATORS[kl_estimator](logp, ref)
  token_w = mask_BxG.astype(jnp.float32) * weights_B[:, None].astype(jnp.float32)
  denominator = logp.shape[0] * float(norm_length)
  pg_loss = jnp.sum(surrogate * is_w * token_w) / denominator
  kl_loss = jnp.sum(kl * token_w) / denominator
  loss = pg_loss + kl_beta * kl_loss
  valid = mask_BxG.astype(jnp.float32)
  counted = jnp.maximum(jnp.sum(token_w), 1.0)
  n_valid = jnp.maximum(jnp.sum(valid), 1.0)
  at_clamp = jnp.abs(jax.lax.stop_gradient(logp) - ref) >= KL_LOG_RATIO_CLAMP
  metrics = {
      "pg_loss": pg_loss,
      "kl": jnp.sum(kl * valid) / n_valid,  # drift of every response, weighted or not
      "kl_clamp_frac": jnp.sum(at_clamp * valid) / n_valid,
      "clip_frac": jnp.sum(clip_active * token_w) / counted,
      "dual_clip_frac": jnp.sum(dual_active * token_w) / counted,
      "ratio_mean": jnp.sum(ratio * valid) / n_valid,
      "ratio_max": jnp.max(jnp.where(mask_BxG, ratio, 1.0)),
      "ratio_min": jnp.min(jnp.where(mask_BxG, ratio, 1.0)),
      "is_weight_mean": jnp.sum(is_w * valid) / n_valid,
      "is_trunc_frac": jnp.sum((jnp.exp(prox - old) > is_cap) * valid) / n_valid,
      "logp_mean": jnp.sum(logp * valid) / n_valid,
      "response_tokens": jnp.sum(valid) / logp.shape[0],
  }
  return loss, metrics
