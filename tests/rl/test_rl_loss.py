"""The clipped policy loss: ratio exactly 1 on-policy, gradient sign follows the advantage, the dual
clip, the KL estimators (k2's bounded gradient, k3), the decoupled ratio of a stale rollout with
its truncated importance weight, constant-length normalisation, padding after EOS masked out."""

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
  loss, _ = _loss(logp, logp, jnp.zeros(1), jnp.ones((1, 2), bool), kl_beta=0.5, kl_ref_BxG=ref, norm_length=10,
                  kl_estimator="k3")
  assert float(loss) == pytest.approx(0.5 * (np.exp(d) - d - 1) / 10, rel=1e-5)
  loss, _ = _loss(logp, logp, jnp.zeros(1), jnp.ones((1, 2), bool), kl_beta=0.5, kl_ref_BxG=ref, norm_length=10)
  assert float(loss) == pytest.approx(0.5 * (d * d / 2) / 10, rel=1e-5)  # the default, k2: d^2 / 2
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
  _, metrics = _loss(logp, old, jnp.array([1.0, -1.0]), mask, kl_estimator="k3")
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


def test_dual_clip_bounds_the_loss_of_a_large_ratio_under_a_negative_advantage():
  """Ratio 50 with A = -1: the plain clipped surrogate is 50 per token and keeps pushing; the dual
  clip (default c = 3) caps it at c |A| with no gradient, and counts the token."""
  old = jnp.log(jnp.full((1, 2), 0.01))
  logp = old + jnp.log(jnp.array([[50.0, 1.0]]))
  mask, adv = jnp.ones((1, 2), bool), jnp.array([-1.0])
  loss, metrics = _loss(logp, old, adv, mask, norm_length=1)
  assert float(loss) == pytest.approx(3.0 + 1.0, rel=1e-5)  # 3 |A| for the first token, r |A| = 1 for the second
  assert float(metrics["dual_clip_frac"]) == pytest.approx(0.5) and float(metrics["clip_frac"]) == pytest.approx(0.5)
  grad = jax.grad(lambda lp: _loss(lp, old, adv, mask, norm_length=1)[0])(logp)
  assert float(grad[0, 0]) == 0.0 and float(grad[0, 1]) > 0.0
  unbounded, _ = _loss(logp, old, adv, mask, norm_length=1, dual_clip=None)
  assert float(unbounded) == pytest.approx(51.0, rel=1e-5)
  # A positive advantage is unaffected (the ordinary clip already bounds it).
  assert float(_loss(logp, old, -adv, mask, norm_length=1)[0]) == pytest.approx(
      float(_loss(logp, old, -adv, mask, norm_length=1, dual_clip=None)[0]))


def test_default_kl_gradient_is_bounded_at_and_beyond_the_clamp():
  """k2 (the default): per-token gradient clip(logp - ref, -C, C) * beta / (rows * norm_length), so a
  token at the clamp or far past it pulls back with force C; k3's reaches e^C there."""
  clamp = loss_lib.KL_LOG_RATIO_CLAMP
  ref = jnp.log(jnp.full((1, 4), 0.5))
  logp = ref + jnp.array([[-9.99, -30.0, 25.0, 0.5]])
  mask, beta = jnp.ones((1, 4), bool), 1.0

  def kl_grad(estimator):
    return np.asarray(jax.grad(lambda lp: _loss(lp, lp, jnp.zeros(1), mask, norm_length=1, kl_beta=beta,
                                                kl_ref_BxG=ref, kl_estimator=estimator)[0])(logp))

  grad = kl_grad("k2")
  np.testing.assert_allclose(grad, [[-9.99, -clamp, clamp, 0.5]], rtol=1e-4)
  assert np.all(np.abs(grad) <= clamp * beta + 1e-4)
  _, metrics = _loss(logp, logp, jnp.zeros(1), mask, norm_length=1, kl_beta=beta, kl_ref_BxG=ref)
  assert float(metrics["kl_clamp_frac"]) == pytest.approx(0.5)  # -30 and 25 are past it, -9.99 is not
  assert abs(kl_grad("k3")[0, 0]) > 2e4  # d = 9.99: 1 - e^9.99, what collapsed tokens fed the update


def test_stale_rollout_ratio_is_to_the_proximal_policy_with_a_truncated_weight():
  """A rollout sampled by older params (behaviour `old`) and re-scored under the update's starting
  params (`prox`): the ratio is exp(logp - prox), 1 at the start of the update however stale the
  rollout, and each token's surrogate is weighted by min(prox / old, is_cap)."""
  old = jnp.log(jnp.array([[0.1, 0.4, 0.5]]))
  prox = jnp.log(jnp.array([[0.3, 0.2, 0.5]]))  # prox / old: 3 (truncated to 2), 0.5, 1
  mask, adv = jnp.ones((1, 3), bool), jnp.array([1.0])
  _, metrics = _loss(prox, old, adv, mask, prox_logp_BxG=prox, is_cap=2.0, norm_length=1)
  assert float(metrics["ratio_mean"]) == pytest.approx(1.0) and float(metrics["ratio_max"]) == pytest.approx(1.0)
  assert float(metrics["is_weight_mean"]) == pytest.approx((2.0 + 0.5 + 1.0) / 3, rel=1e-5)
  assert float(metrics["is_trunc_frac"]) == pytest.approx(1 / 3)
  grad = jax.grad(lambda lp: _loss(lp, old, adv, mask, prox_logp_BxG=prox, is_cap=2.0, norm_length=1)[0])(prox)
  np.testing.assert_allclose(np.asarray(grad), [[-2.0, -0.5, -1.0]], rtol=1e-5)
  # Against the behaviour policy (no correction) the same tokens start off-policy: ratios 3, 0.5, 1.
  _, behaviour = _loss(prox, old, adv, mask, norm_length=1)
  assert float(behaviour["ratio_max"]) == pytest.approx(3.0, rel=1e-5)
