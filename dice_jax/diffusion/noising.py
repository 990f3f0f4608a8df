"""Forward (noising) process of masked diffusion: replace a random fraction t of response tokens
with the mask token. Prompts are never masked.

As in LLaDA and SDAR, one rate t ~ U[eps, 1] is drawn per sequence and each maskable token is masked
independently with probability t; eps keeps 1/t finite. (SDAR additionally re-draws when nothing
was masked; we do not: such a row simply contributes zero loss, keeping shapes static.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_mask_rate(rng: jax.Array, batch: int, eps: float = 1e-3) -> jax.Array:
  """t_B uniform on [eps, 1]."""
  return (1.0 - eps) * jax.random.uniform(rng, (batch,), jnp.float32) + eps


def mask_tokens(rng: jax.Array, tokens_BxL: jax.Array, maskable_BxL: jax.Array, t_B: jax.Array,
                mask_token_id: int) -> tuple[jax.Array, jax.Array]:
  """(noisy_BxL, masked_BxL): each maskable token becomes `mask_token_id` with probability t_B."""
  masked_BxL = (jax.random.uniform(rng, tokens_BxL.shape) < t_B[:, None]) & maskable_BxL.astype(bool)
  return jnp.where(masked_BxL, mask_token_id, tokens_BxL), masked_BxL


def two_copy_tokens(noisy_BxL: jax.Array, clean_BxL: jax.Array) -> jax.Array:
  """SDAR's training input [noisy x_t | clean x_0], B x 2L (attend it with masks.two_copy)."""
  return jnp.concatenate([noisy_BxL, clean_BxL], axis=1)
