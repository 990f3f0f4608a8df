"""Masked-diffusion losses: pure functions of logits, targets and masks (no model inside).

The MDLM/LLaDA objective is the negative ELBO
    L = E_t [ (1/t) * sum_{i masked} -log p(x0_i | x_t) ] / normaliser,
a cross-entropy on masked positions only, each weighted by 1/t of its sequence.
Normalisers: "tokens" divides by the number of response tokens in the batch (SDAR's
`loss / answer_len`); "sequence" divides each sequence by its own response length and averages
over the batch (LLaDA's SFT). Logits predict the token at the *same* position (Dream-style models
are shifted in the model, see ModelConfig.logits_shift).

SDAR's block-diffusion objective is the same sum over the masked positions of the noisy half of a
two-copy forward pass `[x_t | x_0]` (the clean half only provides context).

Training uses the `*_from_hidden` form: the same loss from hidden states and the lm_head, computed
in sequence chunks so the float32 BxLxV logits never exist (dice_jax.diffusion.chunked_xent).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dice_jax.diffusion import chunked_xent

NORMALIZERS = ("tokens", "sequence")


def token_nll(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
  """-log softmax(logits)[target] per position, in float32."""
  logits = logits_BxLxV.astype(jnp.float32)
  target_logit_BxL = jnp.take_along_axis(logits, targets_BxL[..., None], axis=-1)[..., 0]
  return jax.nn.logsumexp(logits, axis=-1) - target_logit_BxL


def loss_weights(masked_BxL: jax.Array, t_B: jax.Array, response_BxL: jax.Array, normalize: str = "tokens"
                 ) -> jax.Array:
  """w_BxL with loss = sum(w * nll): masked/t over the normaliser (see the module docstring)."""
  if normalize not in NORMALIZERS:
    raise ValueError(f"normalize={normalize!r}; choose one of {NORMALIZERS}")
  weighted_BxL = masked_BxL.astype(jnp.float32) / t_B[:, None].astype(jnp.float32)
  response_B = jnp.sum(response_BxL.astype(jnp.float32), axis=1)
  if normalize == "tokens":
    return weighted_BxL / jnp.maximum(jnp.sum(response_B), 1.0)
  return weighted_BxL / (jnp.maximum(response_B, 1.0) * response_B.shape[0])[:, None]


def _metrics(loss: jax.Array, nll_BxL: jax.Array, masked_BxL: jax.Array, response_BxL: jax.Array
             ) -> dict[str, jax.Array]:
  masked = masked_BxL.astype(jnp.float32)
  num_masked = jnp.sum(masked)
  return {"loss": loss, "masked_tokens": num_masked, "response_tokens": jnp.sum(response_BxL.astype(jnp.float32)),
          "masked_nll": jnp.sum(nll_BxL * masked) / jnp.maximum(num_masked, 1.0)}


def masked_diffusion_loss(logits_BxLxV: jax.Array, targets_BxL: jax.Array, masked_BxL: jax.Array,
                          t_B: jax.Array, response_BxL: jax.Array, *, normalize: str = "tokens"
                          ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """1/t-weighted cross-entropy on masked positions; returns (loss, metrics)."""
  weights_BxL = loss_weights(masked_BxL, t_B, response_BxL, normalize)
  nll_BxL = token_nll(logits_BxLxV, targets_BxL)
  loss = jnp.sum(weights_BxL * nll_BxL)
  return loss, _metrics(loss, nll_BxL, masked_BxL, response_BxL)


def masked_diffusion_loss_from_hidden(x_BxLxD: jax.Array, head_DxV: jax.Array, targets_BxL: jax.Array,
                                      masked_BxL: jax.Array, t_B: jax.Array, response_BxL: jax.Array, *,
                                      normalize: str = "tokens",
                                      chunk_tokens: int = chunked_xent.DEFAULT_CHUNK_TOKENS
                                      ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`masked_diffusion_loss` of logits x @ head, without ever holding the BxLxV logits.

  x_BxLxD: hidden states after the final norm (Transformer.hidden_states, aligned to the targets);
  the lm_head and softmax run in chunks of `chunk_tokens` (dice_jax.diffusion.chunked_xent), so
  training memory does not grow with the vocabulary. Same loss and gradients up to float rounding.
  """
  weights_BxL = loss_weights(masked_BxL, t_B, response_BxL, normalize)
  loss, nll_BxL = chunked_xent.weighted_token_nll(x_BxLxD, head_DxV, targets_BxL, weights_BxL,
                                                  chunk_tokens=chunk_tokens)
  return loss, _metrics(loss, nll_BxL, masked_BxL, response_BxL)
