"""Cross-entropy straight from hidden states, the lm_head run over sequence chunks.

Why: a training batch's float32 logits are huge with Qwen3's 151,936-token vocabulary (B=8,
L=2048: 10 GB), and autodiff of `logits -> log_softmax` keeps them and their float32 gradient
alive at once. Here one chunk's logits [B, c, V] exist at a time, and nothing is recomputed: the
loss is a weighted sum of token NLLs, sum_i w_i * nll_i, whose gradient with respect to logits_i is
w_i * (softmax_i - onehot_i), known as soon as chunk i's logsumexp is. So when differentiated, the
forward pass also forms d loss/d x and d loss/d head (the same three matmuls per chunk that
autodiff would run) and the backward pass only scales them by the incoming cotangent. The weights
are masks, 1/t and normalisers, constants of the step: they are treated as such (no gradient flows
into them), which is what lets prompt-only chunks be skipped.

Chunks whose weights are all zero (prompt and padding only) skip the lm_head entirely: their NLL
is reported as 0 and they contribute nothing to the loss or its gradient.

Numerics equal the unchunked `logits -> log_softmax` path up to float rounding: matmuls in x's
dtype with float32 accumulation, logits/softmax/NLL in float32, and the logits gradient rounded to
x's dtype before its two matmuls (as autodiff of a bf16 logits matmul does).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from dice_jax import sharding

# Tokens (batch x chunk length) whose float32 logits exist at once: 2048 x 151,936 x 4 B = 1.2 GB.
# Decision: 2048, not 4096: a chunk is still a large matmul (2048 x hidden x 151,936), and finer
# chunks skip more of the prompt (B=4, L=2048, prompt L/4: the first chunk of 512 positions is all
# prompt and skips the head, a quarter of the head's FLOPs), for one more read-modify-write of the
# float32 head gradient (1.2 GB) per chunk.
DEFAULT_CHUNK_TOKENS = 2048
_HEAD_AXES = ("embed", "vocab")  # the lm_head's logical axes: its gradient accumulates sharded like it


def weighted_token_nll(x_BxLxD: jax.Array, head_DxV: jax.Array, targets_BxL: jax.Array, weights_BxL: jax.Array,
                       *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> tuple[jax.Array, jax.Array]:
  """(sum_i w_i * nll_i, nll_BxL) with nll = -log softmax(x @ head)[target], float32.

  x_BxLxD: hidden states in the compute dtype (the head is cast to it); head_DxV: the lm_head in
  any dtype (its gradient comes back in that dtype). weights_BxL are constants (gradient stopped).
  nll_BxL is for metrics: it carries no gradient, and it is 0 in chunks whose weights are all zero
  (they skip the head).
  """
  batch, length, _ = x_BxLxD.shape
  chunk = max(1, min(length, chunk_tokens // batch))
  weights_BxL = jax.lax.stop_gradient(weights_BxL.astype(jnp.float32))
  loss, nll_BxL = _weighted_nll(x_BxLxD, head_DxV, targets_BxL, weights_BxL, chunk)
  return loss, jax.lax.stop_gradient(nll_BxL)


def _to_chunks(a_BxL: jax.Array, chunk: int) -> jax.Array:
  """[B, L, ...] -> [n, B, chunk, ...], zero-padded to n * chunk positions."""
  batch, length = a_BxL.shape[:2]
  n = -(-length // chunk)
  a = jnp.pad(a_BxL, [(0, 0), (0, n * chunk - length)] + [(0, 0)] * (a_BxL.ndim - 2))
  return jnp.moveaxis(a.reshape(batch, n, chunk, *a_BxL.shape[2:]), 1, 0)


def _from_chunks(a_NxBxC: jax.Array, length: int) -> jax.Array:
  n, batch, chunk = a_NxBxC.shape[:3]
  return jnp.moveaxis(a_NxBxC, 0, 1).reshape(batch, n * chunk, *a_NxBxC.shape[3:])[:, :length]


def _run(x_BxLxD, head_DxV, targets_BxL, weights_BxL, chunk: int, with_grads: bool):
  """nll_BxL, plus (d sum(w nll)/dx in x's dtype, d/dhead in head's dtype) when `with_grads`."""
  dt = x_BxLxD.dtype
  head_c = head_DxV.astype(dt)
  length = x_BxLxD.shape[1]

  def compute(dhead_acc, x_c, t_c, w_c):
    logits = jnp.einsum("bcd,dv->bcv", x_c, head_c, preferred_element_type=jnp.float32)
    logits = sharding.constrain(logits, ("batch", "length", "act_vocab"))
    lse = jax.nn.logsumexp(logits, axis=-1)
    is_target = t_c[..., None] == jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    nll = lse - jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)
    if not with_grads:
      return dhead_acc, nll, ()
    dlogits = (w_c[..., None] * (jnp.exp(logits - lse[..., None]) - is_target)).astype(dt)
    dx_c = jnp.einsum("bcv,dv->bcd", dlogits, head_c, preferred_element_type=jnp.float32).astype(dt)
    dhead_acc = dhead_acc + jnp.einsum("bcd,bcv->dv", x_c, dlogits, preferred_element_type=jnp.float32)
    return sharding.constrain(dhead_acc, _HEAD_AXES), nll, dx_c

  def skip(dhead_acc, x_c, t_c, w_c):  # prompt/padding-only chunk: no head, nothing to learn
    del w_c
    return dhead_acc, jnp.zeros(t_c.shape, jnp.float32), (jnp.zeros_like(x_c) if with_grads else ())

  def body(dhead_acc, chunk_in):
    x_c, t_c, w_c = chunk_in
    dhead_acc, nll, dx_c = jax.lax.cond(jnp.any(w_c != 0), compute, skip, dhead_acc, x_c, t_c, w_c)
    return dhead_acc, (nll, dx_c)

  # The scan's carry: d/dhead's float32 accumulator, or () when no gradient is wanted.
  init: Any = sharding.constrain(jnp.zeros(head_DxV.shape, jnp.float32), _HEAD_AXES) if with_grads else ()
  chunks = (_to_chunks(x_BxLxD, chunk), _to_chunks(targets_BxL.astype(jnp.int32), chunk),
            _to_chunks(weights_BxL, chunk))
  dhead_DxV, (nll, dx) = jax.lax.scan(body, init, chunks)
  if not with_grads:
    return _from_chunks(nll, length), None
  return _from_chunks(nll, length), (_from_chunks(dx, length), dhead_DxV.astype(head_DxV.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _weighted_nll(x_BxLxD, head_DxV, targets_BxL, weights_BxL, chunk):
  nll_BxL, _ = _run(x_BxLxD, head_DxV, targets_BxL, weights_BxL, chunk, with_grads=False)
  return jnp.sum(weights_BxL * nll_BxL), nll_BxL


def _weighted_nll_fwd(x_BxLxD, head_DxV, targets_BxL, weights_BxL, chunk):
  nll_BxL, (dx_BxLxD, dhead_DxV) = _run(x_BxLxD, head_DxV, targets_BxL, weights_BxL, chunk, with_grads=True)
  return (jnp.sum(weights_BxL * nll_BxL), nll_BxL), (dx_BxLxD, dhead_DxV)


def _weighted_nll_bwd(chunk, residuals, cotangents):
  del chunk
  dx_BxLxD, dhead_DxV = residuals
  g_loss, _ = cotangents  # nll_BxL's cotangent is zero: weighted_token_nll stops its gradient
  # In each residual's own dtype (no float32 round trip of dx); targets are integers and weights
  # constants (gradient stopped): no cotangent for either.
  return dx_BxLxD * g_loss.astype(dx_BxLxD.dtype), dhead_DxV * g_loss.astype(dhead_DxV.dtype), None, None


_weighted_nll.defvjp(_weighted_nll_fwd, _weighted_nll_bwd)
