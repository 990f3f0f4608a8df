"""The chunked lm_head + cross-entropy equals the plain logits -> log_softmax path: loss and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dice_jax.diffusion import chunked_xent, losses, noising
from dice_jax.diffusion.objectives import diffusion_loss
from dice_jax.model.config import ModelConfig
from dice_jax.model.transformer import forward, init_model

TINY = dict(architecture="sdar", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=8, qk_norm=True, attention="block_causal", block_size=4, mask_token_id=96)


def _plain(x, head, targets, weights):
  logits = jnp.einsum("bld,dv->blv", x, head.astype(x.dtype), preferred_element_type=jnp.float32)
  return jnp.sum(weights * losses.token_nll(logits, targets))


def _inputs(dtype, length=13):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, length, 16)), dtype)
  head = jnp.asarray(rng.normal(size=(16, 37)) * 0.5, jnp.float32)
  targets = jnp.asarray(rng.integers(0, 37, (2, length)), jnp.int32)
  weights = jnp.asarray(rng.uniform(size=(2, length)) * (rng.uniform(size=(2, length)) < 0.6), jnp.float32)
  return x, head, targets, weights.at[:, :4].set(0.0)  # the first chunk (4 positions) is prompt only


@pytest.mark.parametrize("chunk_tokens", [8, 26, chunked_xent.DEFAULT_CHUNK_TOKENS], ids=["chunks_of_4_padded", "one_chunk", "default"])
def test_chunked_loss_and_gradients_equal_plain_float32(chunk_tokens):
  x, head, targets, weights = _inputs(jnp.float32)
  chunked = jax.jit(jax.value_and_grad(lambda x, h: chunked_xent.weighted_token_nll(
      x, h, targets, weights, chunk_tokens=chunk_tokens)[0], argnums=(0, 1)))
  plain = jax.jit(jax.value_and_grad(lambda x, h: _plain(x, h, targets, weights), argnums=(0, 1)))
  (loss, grads), (ref_loss, ref_grads) = chunked(x, head), plain(x, head)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for g, r in zip(grads, ref_grads):
    assert g.dtype == r.dtype and g.shape == r.shape
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
  # Not differentiated: the primal path gives the same value, and per-token NLL where weights exist.
  value, nll = jax.jit(lambda x: chunked_xent.weighted_token_nll(x, head, targets, weights,
                                                                 chunk_tokens=chunk_tokens))(x)
  np.testing.assert_allclose(value, ref_loss, rtol=1e-6)
  logits = jnp.einsum("bld,dv->blv", x, head)
  scored = np.asarray(weights) > 0
  np.testing.assert_allclose(np.asarray(nll)[scored], np.asarray(losses.token_nll(logits, targets))[scored],
                             rtol=1e-5)


def test_chunked_gradient_scales_with_the_cotangent():
  x, head, targets, weights = _inputs(jnp.float32)
  fn = lambda x: chunked_xent.weighted_token_nll(x, head, targets, weights, chunk_tokens=8)[0]  # noqa: E731
  np.testing.assert_allclose(jax.grad(lambda x: -3.0 * fn(x))(x), -3.0 * jax.grad(fn)(x), rtol=1e-6)


def test_chunked_bfloat16_matches_plain_bfloat16_path():
  """bf16 hidden states: matmuls in bf16 with f32 accumulation, dlogits rounded to bf16 (as autodiff
  of a bf16 logits matmul does), so only bf16 rounding separates the two."""
  x, head, targets, weights = _inputs(jnp.bfloat16, length=32)
  loss, (gx, gh) = jax.value_and_grad(lambda x, h: chunked_xent.weighted_token_nll(
      x, h, targets, weights, chunk_tokens=16)[0], argnums=(0, 1))(x, head)
  ref_loss, (rx, rh) = jax.value_and_grad(lambda x, h: _plain(x.astype(jnp.float32), h, targets, weights),
                                          argnums=(0, 1))(x, head)
  assert gx.dtype == jnp.bfloat16 and gh.dtype == jnp.float32
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-2)
  np.testing.assert_allclose(np.asarray(gx, np.float32), rx, rtol=0.05, atol=0.02 * np.abs(rx).max())
  np.testing.assert_allclose(gh, rh, rtol=0.05, atol=0.02 * np.abs(rh).max())


def _unchunked_loss(graphdef, state, tokens, response, rng, objective):
  """diffusion_loss written with full logits: the model's forward + the logits loss (the old path)."""
  cfg = nnx.merge(graphdef, state).config
  rate_rng, mask_rng = jax.random.split(rng)
  t = noising.sample_mask_rate(rate_rng, tokens.shape[0])
  noisy, masked = noising.mask_tokens(mask_rng, tokens, response, t, cfg.mask_token_id)
  if objective == "masked":
    logits = forward(graphdef, state, noisy, "bidirectional")
    return losses.masked_diffusion_loss(logits, tokens, masked, t, response)
  logits = forward(graphdef, state, noising.two_copy_tokens(noisy, tokens), "two_copy")
  return losses.masked_diffusion_loss(logits[:, :tokens.shape[1]], tokens, masked, t, response)  # the noisy copy


@pytest.mark.parametrize("objective", ["masked", "two_copy"])
def test_diffusion_loss_equals_the_full_logits_path(objective):
  graphdef, state = nnx.split(init_model(ModelConfig(**TINY), seed=0))
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, 96, (2, 12)), jnp.int32)
  response = jnp.broadcast_to(jnp.arange(12) >= 5, (2, 12))
  attention = "bidirectional" if objective == "masked" else None

  def chunked(s):
    return diffusion_loss(graphdef, s, tokens, response, jax.random.key(2), objective=objective,
                          attention=attention, chunk_tokens=8)

  (loss, metrics), grads = jax.jit(jax.value_and_grad(chunked, has_aux=True))(state)
  (ref_loss, ref_metrics), ref_grads = jax.jit(jax.value_and_grad(
      lambda s: _unchunked_loss(graphdef, s, tokens, response, jax.random.key(2), objective), has_aux=True))(state)
  assert float(metrics["masked_tokens"]) > 0
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for key in ref_metrics:
    np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-6, err_msg=key)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(r).max())))


def test_hidden_states_and_logits_compose_to_forward():
  for overrides in ({}, dict(architecture="dream", attention="bidirectional", logits_shift=True, qk_norm=False,
                             qkv_bias=True, block_size=0)):
    model = init_model(ModelConfig(**{**TINY, **overrides}), seed=0)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 96, (2, 8)), jnp.int32)
    x = model.hidden_states(tokens)
    assert x.shape == (2, 8, 32)
    np.testing.assert_allclose(model.logits(model.align_to_tokens(x)), model(tokens), rtol=1e-6, atol=1e-6)
    head = model.head_weights()
    assert head.shape == (32, 97)
