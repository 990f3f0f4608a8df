"""Noising and diffusion losses against small cases computed by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from dice_jax.diffusion import losses, noising


def test_token_nll_by_hand():
  logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
  nll = losses.token_nll(logits, jnp.array([[0, 2]]))
  np.testing.assert_allclose(nll, [[math.log(math.e**2 + 2) - 2, math.log(3)]], rtol=1e-6)


def test_masked_diffusion_loss_by_hand():
  # Batch of 2, length 4, vocab 4, uniform logits except one confident position.
  logits = np.zeros((2, 4, 4), np.float32)
  logits[0, 1] = [0.0, 3.0, 0.0, 0.0]
  targets = jnp.array([[0, 1, 2, 3], [3, 2, 1, 0]])
  masked = jnp.array([[0, 1, 1, 0], [0, 0, 0, 1]], bool)
  response = jnp.array([[0, 1, 1, 1], [0, 0, 1, 1]], bool)  # position 0 is the prompt
  t = jnp.array([0.5, 0.25])
  nll_confident = math.log(math.e**3 + 3) - 3
  row0 = (nll_confident + math.log(4)) / 0.5
  row1 = math.log(4) / 0.25
  loss_fn = jax.jit(losses.masked_diffusion_loss, static_argnames="normalize")
  loss, metrics = loss_fn(jnp.asarray(logits), targets, masked, t, response)
  np.testing.assert_allclose(loss, (row0 + row1) / 5, rtol=1e-6)  # 5 response tokens in the batch
  seq_loss, _ = loss_fn(jnp.asarray(logits), targets, masked, t, response, normalize="sequence")
  np.testing.assert_allclose(seq_loss, (row0 / 3 + row1 / 2) / 2, rtol=1e-6)
  assert float(metrics["masked_tokens"]) == 3 and float(metrics["response_tokens"]) == 5
  np.testing.assert_allclose(metrics["masked_nll"], (nll_confident + 2 * math.log(4)) / 3, rtol=1e-6)


def test_noising_never_masks_the_prompt_and_follows_t():
  tokens = jnp.arange(4000).reshape(2, 2000) % 100
  maskable = jnp.arange(2000)[None, :] >= 500  # first 500 tokens: prompt
  t = jnp.array([0.3, 0.9])
  noisy, masked = noising.mask_tokens(jax.random.key(0), tokens, jnp.broadcast_to(maskable, (2, 2000)), t, 999)
  assert not bool(jnp.any(masked[:, :500]))
  np.testing.assert_array_equal(jnp.where(masked, 999, tokens), noisy)
  np.testing.assert_allclose(jnp.mean(masked[:, 500:], axis=1), t, atol=0.03)
  rates = noising.sample_mask_rate(jax.random.key(1), 10000, eps=0.1)
  assert float(rates.min()) >= 0.1 and float(rates.max()) <= 1.0
  np.testing.assert_allclose(float(rates.mean()), 0.55, atol=0.01)
  np.testing.assert_array_equal(noising.two_copy_tokens(noisy, tokens)[:, 2000:], tokens)
