"""The clipped policy loss: ratio exactly 1 on-policy, gradient sign follows the advantage, k3 KL,
constant-length normalisation, padding after EOS masked out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dice_jax.rl import loss as loss_lib


def _loss(logp, old, adv, mask, weights=None, name="clipped", **kw):
  weights = jnp.ones(logp.shape[0]) if weights is None else weights
  kw = dict(eps_low=0.2, eps_high=0.2, norm_length=8) | kw
  return loss_lib.policy_loss(name, logp, old, adv, weights, mask, **kw)


def test_on_policy_ratio_is_one_and_gradient_is_the_policy_gradient():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.1], [0.9, 0.3, 0.6]]))
  mask = jnp.array([[True, True, False], [True, True, True]])
  adv = jnp.array([2.0, -1.0])
  _, metrics = _loss(logp, logp, adv, mask, kl_beta=0.1)
  assert float(metrics["ratio_mean"]) == 1.0 and float(metrics["ratio_max"]) == 1.0
  assert float(metrics["kl"]) == 0.0 and float(metrics["clip_frac"]) == 0.0
  grad = jax.grad(lambda lp: _loss(lp, logp, adv, mask, kl_beta=0.1)[0])(logp)
  # d loss / d logp_t = -A_i * mask / (rows * norm_length): descent raises logp where A > 0.
  expected = -adv[:, None] * mask / (2 * 8)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(expected), rtol=1e-6)
  assert float(grad[0, 2]) == 0.0  # a token after EOS gets no gradient


@pytest.mark.parametrize("name", ["clipped", "unclipped"])
def test_gradient_sign_follows_the_advantage(name):
  logp = jnp.log(jnp.full((2, 4), 0.3))
  old = logp + 0.05  # slightly off-policy, inside the clip range
  mask = jnp.ones((2, 4), bool)
  grad = jax.grad(lambda lp: _loss(lp, old, jnp.array([1.0, -1.0]), mask, name=name)[0])(logp)
  assert np.all(np.asarray(grad[0]) < 0) and np.all(np.asarray(grad[1]) > 0)


def test_clipping_stops_the_gradient_outside_the_trust_region():
  old = jnp.log(jnp.full((1, 2), 0.2))
  logp = old + jnp.log(jnp.array([[1.5, 1.1]]))  # ratios 1.5 (clipped for A > 0) and 1.1 (not)
  grad = jax.grad(lambda lp: _loss(lp, old, jnp.array([1.0]), jnp.ones((1, 2), bool))[0])(logp)
  assert float(grad[0, 0]) == 0.0 and float(grad[0, 1]) < 0.0
  _, metrics = _loss(logp, old, jnp.array([1.0]), jnp.ones((1, 2), bool))
  assert float(metrics["clip_frac"]) == pytest.approx(0.5)


def test_k3_kl_and_constant_normalisation():
  logp, ref = jnp.log(jnp.array([[0.5, 0.5]])), jnp.log(jnp.array([[0.25, 0.5]]))
  d = np.log(0.25) - np.log(0.5)
  np.testing.assert_allclose(np.asarray(loss_lib.k3(logp, ref)), [[np.exp(d) - d - 1, 0.0]], rtol=1e-6)
  # Zero advantage: the loss is beta * sum(k3) / (rows * norm_length), however many tokens are valid.
  loss, _ = _loss(logp, logp, jnp.zeros(1), jnp.ones((1, 2), bool), kl_beta=0.5, kl_ref_BxG=ref, norm_length=10)
  assert float(loss) == pytest.approx(0.5 * (np.exp(d) - d - 1) / 10, rel=1e-5)
  # A zero-weight row (zero-variance group) contributes nothing, KL included.
  loss, _ = _loss(logp, logp, jnp.zeros(1), jnp.ones((1, 2), bool), weights=jnp.zeros(1), kl_beta=0.5,
                  kl_ref_BxG=ref)
  assert float(loss) == 0.0


def test_unknown_loss():
  with pytest.raises(ValueError, match="choose one of"):
    _loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.zeros(1), jnp.ones((1, 1), bool), name="dpo")
