"""Advantage estimators on groups computed by hand, including zero-variance and excluded responses."""

import numpy as np
import pytest

from dice_jax.rl import advantages


def _run(name, rewards, valid=None):
  rewards = np.asarray(rewards, np.float32)
  valid = np.ones(rewards.shape, bool) if valid is None else np.asarray(valid, bool)
  adv, weight, metrics = advantages.compute(name, rewards, valid)
  return np.asarray(adv), np.asarray(weight), {k: float(v) for k, v in metrics.items()}


def test_grpo_by_hand():
  # Group 0: [1, 0, 0, 1] -> mean 0.5, sample std sqrt(1/3) -> +-0.866; group 1: all equal.
  adv, weight, metrics = _run("grpo", [[1, 0, 0, 1], [1, 1, 1, 1]])
  z = 0.5 / np.sqrt(1 / 3)
  np.testing.assert_allclose(adv[0], [z, -z, -z, z], rtol=1e-3)
  np.testing.assert_array_equal(adv[1], 0)
  np.testing.assert_array_equal(weight, [[1, 1, 1, 1], [0, 0, 0, 0]])
  assert metrics["adv/zero_var_groups"] == 1 and metrics["adv/zero_var_frac"] == 0.5


def test_drgrpo_and_rloo_by_hand():
  rewards = [[3.0, 1.0, 2.0]]
  adv, _, _ = _run("drgrpo", rewards)
  np.testing.assert_allclose(adv, [[1.0, -1.0, 0.0]], atol=1e-6)
  adv, _, _ = _run("rloo", rewards)
  # r_i - mean of the other two: 3 - 1.5, 1 - 2.5, 2 - 2
  np.testing.assert_allclose(adv, [[1.5, -1.5, 0.0]], atol=1e-6)


def test_excluded_responses_stay_out_of_the_statistics():
  # The 100.0 is an excluded verdict (INFRA_ERROR): it must not move the mean, and gets weight 0.
  adv, weight, _ = _run("drgrpo", [[1.0, 0.0, 100.0]], [[True, True, False]])
  np.testing.assert_allclose(adv, [[0.5, -0.5, 0.0]], atol=1e-6)
  np.testing.assert_array_equal(weight, [[1, 1, 0]])
  # One valid response left: no baseline, no signal.
  adv, weight, metrics = _run("grpo", [[1.0, 0.0]], [[True, False]])
  np.testing.assert_array_equal(weight, 0)
  assert metrics["adv/zero_var_groups"] == 1


def test_unknown_estimator():
  with pytest.raises(ValueError, match="choose one of"):
    _run("ppo", [[1, 0]])
