"""Noising + forward pass + loss in one pure function: what an SFT or pretraining step differentiates.

    loss, metrics = diffusion_loss(graphdef, state, tokens_BxL, response_BxL, rng, objective="two_copy")
    grads = jax.grad(lambda s: diffusion_loss(graphdef, s, ...)[0])(state)

Objectives:
- "masked": MDLM/LLaDA. Mask the response at rate t, one forward pass over x_t with the model's
  default attention (LLaDA/Dream: bidirectional) or `attention`.
- "two_copy": SDAR block diffusion. One forward pass over [x_t | x_0] (2L tokens) with the
  two-copy mask; the lm_head runs on the noisy half only (saves half its FLOPs).
`response_BxL` marks the maskable tokens (the answer); prompt and padding should be False there,
unless, like LLaDA's SFT, you deliberately train on EOS padding.
"""

from __future__ import annotations

import jax
from flax import nnx

from dice_jax.diffusion import chunked_xent, losses, noising
from dice_jax.model import masks

OBJECTIVES = ("masked", "two_copy")


def diffusion_loss(graphdef: nnx.GraphDef, state: nnx.State, tokens_BxL: jax.Array, response_BxL: jax.Array,
                   rng: jax.Array, *, objective: str = "masked", attention: str | masks.AttentionMask | None = None,
                   eps: float = 1e-3, normalize: str = "tokens",
                   chunk_tokens: int = chunked_xent.DEFAULT_CHUNK_TOKENS) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(loss, metrics) of one batch under `objective`; pure, so jit/grad it freely.

  The lm_head and cross-entropy run over sequence chunks of `chunk_tokens` (batch x chunk length)
  tokens straight from the hidden states: the float32 BxLxV logits are never formed.
  """
  model = nnx.merge(graphdef, state)
  cfg = model.config
  if cfg.mask_token_id is None:
    raise ValueError(f"{cfg.architecture} config has no mask_token_id: it cannot be trained as a diffusion model")
  batch, length = tokens_BxL.shape
  rate_rng, mask_rng = jax.random.split(rng)
  t_B = noising.sample_mask_rate(rate_rng, batch, eps)
  noisy_BxL, masked_BxL = noising.mask_tokens(mask_rng, tokens_BxL, response_BxL, t_B, cfg.mask_token_id)
  if objective == "masked":
    x_BxLxD = model.align_to_tokens(model.hidden_states(noisy_BxL, attention))
  elif objective == "two_copy":
    if attention is not None:
      raise ValueError("the two_copy objective sets its own attention mask")
    x_BxLxD = model.hidden_states(noising.two_copy_tokens(noisy_BxL, tokens_BxL), "two_copy")
    x_BxLxD = model.align_to_tokens(x_BxLxD)[:, :length]  # the noisy half: only it is scored
  else:
    raise ValueError(f"objective={objective!r}; choose one of {OBJECTIVES}")
  return losses.masked_diffusion_loss_from_hidden(x_BxLxD, model.head_weights(), tokens_BxL, masked_BxL, t_B,
                                                  response_BxL, normalize=normalize, chunk_tokens=chunk_tokens)
