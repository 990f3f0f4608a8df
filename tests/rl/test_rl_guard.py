"""The KL spike guard: below the threshold nothing changes; above it `cut_lr` lowers the learning-rate
scale the compiled step applies (one WARNING line, no recompile) and `stop` ends the run with
KLSpike (exit 5 in `dice train`) naming the step, the KL and the last checkpoint."""

import logging

import jax
import jax.numpy as jnp
import optax
import pytest

from dice_jax.config import ConfigError, load_config
from dice_jax.rl.config import KLGuardSection, RLConfig
from dice_jax.rl.guard import KLGuard, KLSpike
from dice_jax.train.optim import OptimizerConfig, lr_scale, make_optimizer
from dice_jax.train.step import TrainingDiverged, make_train_step
from dice_jax.train.train_state import TrainState


def _state_and_step():
  tx, schedule = make_optimizer(OptimizerConfig(lr=0.1, max_grad_norm=None), 10, adjustable=True)
  params = {"w": jnp.array([1.0, -2.0])}

  def loss_fn(p, batch, rng, context):
    del rng, context
    return jnp.sum((p["w"] - batch) ** 2), {}

  step = jax.jit(make_train_step(loss_fn, tx, schedule, compute_dtype=jnp.float32))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                     rng=jax.random.PRNGKey(0))
  return state, step


def test_no_spike_changes_nothing():
  state, _ = _state_and_step()
  guard = KLGuard(KLGuardSection(max_kl=1.0))
  after, metrics = guard.check(1, {"kl": 0.5}, state)
  assert after is state and metrics == {"kl_guard/trips": 0.0, "kl_guard/lr_scale": 1.0}


def test_cut_lr_halves_what_the_compiled_step_applies(caplog):
  state, step = _state_and_step()
  guard = KLGuard(KLGuardSection(max_kl=1.0, action="cut_lr", lr_factor=0.5))
  with caplog.at_level(logging.WARNING, logger="dice_jax.rl.guard"):
    cut, metrics = guard.check(4, {"kl": 1420.0}, state)
  assert "KL spike at step 4: kl 1420 > kl_guard.max_kl 1; learning-rate scale 1 -> 0.5" in caplog.text
  assert metrics == {"kl_guard/trips": 1.0, "kl_guard/lr_scale": 0.5} and float(lr_scale(cut.opt_state)) == 0.5
  batch = jnp.zeros(2)
  compiled = step.lower(state, batch).compile()  # as dice_jax.rl.setup compiles the update, once
  full, m_full = compiled(state, batch)
  half, m_half = compiled(cut, batch)
  moved_full = full.params["w"] - state.params["w"]
  assert jnp.allclose(half.params["w"] - state.params["w"], moved_full / 2)
  again, metrics = guard.check(5, {"kl": 3.0}, cut)  # cuts compound
  assert float(lr_scale(again.opt_state)) == 0.25 and metrics["kl_guard/trips"] == 2.0
  assert float(m_full["lr"]) == float(m_half["lr"])  # the schedule is untouched; dice_jax.rl.update reports the product


def test_stop_raises_a_kl_spike_that_keeps_the_last_checkpoint(caplog):
  state, _ = _state_and_step()
  guard = KLGuard(KLGuardSection(max_kl=0.2, action="stop"))
  with caplog.at_level(logging.WARNING, logger="dice_jax.rl.guard"), pytest.raises(KLSpike) as e:
    guard.check(2, {"kl": 3.5}, state, last_checkpoint=1)
  assert isinstance(e.value, TrainingDiverged)  # dice train: exit 5, "training diverged: ..."
  assert str(e.value) == "KL spike at step 2: kl 3.5 > kl_guard.max_kl 0.2; the last checkpoint is step 1"
  assert "stopping" in caplog.text


def test_guard_is_on_by_default_and_its_settings_are_checked():
  cfg = RLConfig()
  assert cfg.kl_guard.max_kl == 1.0 and cfg.kl_guard.action == "cut_lr"
  assert KLGuard(KLGuardSection(max_kl=None)).check(1, {"kl": 1e9}, _state_and_step()[0])[1]["kl_guard/trips"] == 0
  with pytest.raises(ConfigError, match="kl_guard.lr_factor: must be in"):
    load_config(RLConfig, None, ["kl_guard.lr_factor=1.5"])
  with pytest.raises(ConfigError, match="kl_guard.action"):
    load_config(RLConfig, None, ["kl_guard.action=panic"])


def test_a_plain_optimizer_has_no_scale_to_cut():
  tx, _ = make_optimizer(OptimizerConfig(lr=0.1), 10)
  opt_state = tx.init({"w": jnp.ones(2)})
  assert lr_scale(opt_state) is None
  with pytest.raises(ValueError, match="adjustable=True"):
    KLGuard(KLGuardSection(max_kl=1.0)).check(1, {"kl": 2.0}, TrainState(
        step=jnp.zeros((), jnp.int32), params={"w": jnp.ones(2)}, opt_state=opt_state, rng=jax.random.PRNGKey(0)))
  assert optax.tree_utils.tree_get(opt_state, "step_size", default=None) is None
