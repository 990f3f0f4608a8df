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


def test_off_policy_ratio_and_kl_match_hand_computed_values():
  """Ratios exp(logp - old) and k3 KL per token against numbers worked out by hand, so a swapped
  sign or a wrong reduction cannot pass (on-policy, both are trivially 1 and 0)."""
  logp = jnp.log(jnp.array([[0.25, 0.6, 0.9], [0.5, 0.5, 0.1]]))
  old = jnp.log(jnp.array([[0.5, 0.5, 0.3], [0.25, 0.5, 0.1]]))
  mask = jnp.array([[True, True, False], [True, True, True]])
  _, metrics = _loss(logp, old, jnp.array([1.0, -1.0]), mask)
  ratios = np.array([0.5, 1.2, 2.0, 1.0, 1.0])  # the valid tokens: 0.25/0.5, 0.6/0.5, 0.5/0.25, 1, 1
  assert float(metrics["ratio_mean"]) == pytest.approx(ratios.mean(), rel=1e-6)
  assert float(metrics["ratio_max"]) == pytest.approx(2.0, rel=1e-6)  # row 0's 3.0 is masked out
  assert float(metrics["ratio_min"]) == pytest.approx(0.5, rel=1e-6)
  d = -np.log(ratios)  # k3 to the old policy: d = old - logp
  assert float(metrics["kl"]) == pytest.approx(np.mean(np.exp(d) - d - 1), rel=1e-5)
  # Clipping is active where it stops the gradient: A > 0 above 1 + eps (row 0: 1.2 is not above
  # 1.2), A < 0 below 1 - eps (row 1: none). Row 0's 0.5 is below 1 - eps but A > 0: not clipped.
  assert float(metrics["clip_frac"]) == 0.0
  _, tight = _loss(logp, old, jnp.array([1.0, -1.0]), mask, eps_high=0.1)
  assert float(tight["clip_frac"]) == pytest.approx(1 / 5)  # now 1.2 > 1.1 with A > 0


def test_kl_log_ratio_is_clamped_and_masked_extremes_stay_finite():
  """DICE clamps the k3 log-ratio to +-10; a masked position with an extreme log-prob (the sampler
  records 0 there) must not make the loss or its gradient NaN (exp(100) * 0 would)."""
  logp = jnp.array([[-2.0, -150.0]])
  old = jnp.array([[-30.0, 0.0]])  # valid token far from the reference; masked one recorded as 0
  mask = jnp.array([[True, False]])
  d = np.clip(-30.0 - -2.0, -10, 10)
  np.testing.assert_allclose(np.asarray(loss_lib.k3(logp[:, :1], old[:, :1])), [[np.exp(d) - d - 1]], rtol=1e-6)

  def f(lp):
    return _loss(lp, old, jnp.array([1.0]), mask, kl_beta=0.5)[0]

  loss, grad = jax.value_and_grad(f)(logp)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
  assert float(grad[0, 1]) == 0.0
