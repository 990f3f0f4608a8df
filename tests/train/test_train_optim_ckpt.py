"""Optimizer, train state, generic step and checkpoints, on a toy regression (no model needed)."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dice_jax.checkpoints import CheckpointError, Checkpointer
from dice_jax.config import ConfigError, load_config
from dice_jax.train.optim import (OptimizerConfig, cast_floating, decay_mask, make_optimizer,
                                  make_schedule)
from dice_jax.train.step import compile_train_step, format_memory_analysis, make_train_step
from dice_jax.train.train_state import TrainState, abstract_state, create_train_state, state_shardings

D, K, B = 16, 8, 16


def _loss_fn(params, batch, rng, context):
  del context
  pred = batch["x"] @ params["w"] + params["b"]
  noise = 1e-3 * jax.random.normal(rng, pred.shape, pred.dtype)
  err = (pred + noise).astype(jnp.float32) - batch["y"]
  return jnp.mean(err ** 2), {"abs_err": jnp.mean(jnp.abs(err))}


OPT = OptimizerConfig(lr=0.2, warmup_steps=2, schedule="cosine", weight_decay=0.1)


def _setup(mesh, opt_cfg=OPT, accum=1, dtype=jnp.float32):
  w_sharding = NamedSharding(mesh, P("fsdp", "tensor"))
  b_sharding = NamedSharding(mesh, P("tensor"))
  params = {"w": jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (D, K)), w_sharding),
            "b": jax.device_put(jnp.zeros((K,)), b_sharding)}
  tx, schedule = make_optimizer(opt_cfg, total_steps=20)
  shardings = state_shardings(tx, {"w": w_sharding, "b": b_sharding}, params, mesh)
  placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
  abstract = abstract_state(tx, placed, shardings)
  state = create_train_state(params, tx, seed=1, shardings=shardings)
  batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))
  step = make_train_step(_loss_fn, tx, schedule, compute_dtype=dtype, grad_accum_steps=accum)
  abstract_batch = {"x": jax.ShapeDtypeStruct((B, D), jnp.float32, sharding=batch_sharding),
                    "y": jax.ShapeDtypeStruct((B, K), jnp.float32, sharding=batch_sharding)}
  compiled = compile_train_step(step, abstract, abstract_batch, shardings, batch_sharding, mesh)
  return state, compiled, batch_sharding, abstract


def _batches(n):
  rng = np.random.default_rng(0)
  true_w = rng.normal(size=(D, K)).astype(np.float32)
  for _ in range(n):
    x = rng.normal(size=(B, D)).astype(np.float32)
    yield {"x": x, "y": x @ true_w}


def _mesh(shape):
  devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
  return Mesh(devices, ("data", "fsdp", "tensor"))


def _run(mesh, n=6, **kw):
  state, compiled, batch_sharding, _ = _setup(mesh, **kw)
  losses = []
  for batch in _batches(n):
    state, metrics = compiled(state, jax.device_put(batch, batch_sharding))
    losses.append(float(metrics["loss"]))
  return state, losses


def test_schedules():
  cfg = OptimizerConfig(lr=1.0, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
  sched = make_schedule(cfg, total_steps=14)
  assert float(sched(0)) == 0.0 and float(sched(2)) == pytest.approx(0.5)
  assert float(sched(4)) == pytest.approx(1.0) and float(sched(14)) == pytest.approx(0.1)
  assert float(sched(9)) == pytest.approx(0.55)  # half way down the cosine
  lin = make_schedule(OptimizerConfig(lr=1.0, schedule="linear"), total_steps=10)
  assert float(lin(5)) == pytest.approx(0.5)
  const = make_schedule(OptimizerConfig(lr=3e-4), total_steps=10)
  assert float(const(0)) == float(const(9)) == pytest.approx(3e-4)
  with pytest.raises(ConfigError, match="optimizer.lr: must be > 0"):
    load_config(_OptTop, None, ["optimizer.lr=-1"])
  with pytest.raises(ConfigError, match="optimizer.b2: must be in"):
    load_config(_OptTop, None, ["optimizer.b2=1.0"])


import dataclasses  # noqa: E402


@dataclasses.dataclass(frozen=True)
class _OptTop:
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)


def test_clipping_decay_mask_and_bf16_cast():
  tx, _ = make_optimizer(OptimizerConfig(lr=1.0, max_grad_norm=1.0, weight_decay=0.0), 10)
  params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
  grads = {"w": jnp.full((2, 2), 100.0), "scale": jnp.zeros((2,))}
  clipped, _ = optax.clip_by_global_norm(1.0).update(grads, None)
  assert float(optax.tree.norm(clipped)) == pytest.approx(1.0)
  # Weight decay touches matrices only: with zero grads, only `w` shrinks.
  tx_wd, _ = make_optimizer(OptimizerConfig(lr=0.5, weight_decay=0.1), 10)
  updates, _ = tx_wd.update(jax.tree.map(jnp.zeros_like, params), tx_wd.init(params), params)
  assert float(updates["w"][0, 0]) == pytest.approx(-0.05) and float(updates["scale"][0]) == 0.0
  # Norm scales and biases stacked over layers are 2-D, and still not decayed.
  stacked = {"layers": {"input_norm": {"weight": jnp.ones((2, 4))}, "q_bias": jnp.ones((2, 4)),
                        "q_proj": jnp.ones((2, 4, 4))}}
  assert decay_mask(stacked) == {"layers": {"input_norm": {"weight": False}, "q_bias": False,
                                            "q_proj": True}}
  cast = cast_floating({"w": jnp.ones(2), "i": jnp.ones(2, jnp.int32)}, jnp.bfloat16)
  assert cast["w"].dtype == jnp.bfloat16 and cast["i"].dtype == jnp.int32
  del tx


def test_train_step_learns_and_keeps_f32_master_weights():
  state, losses = _run(_mesh((1, 1, 1)), n=8, dtype=jnp.bfloat16)
  assert losses[-1] < losses[0] * 0.5
  assert state.params["w"].dtype == jnp.float32 and int(state.step) == 8
  assert jax.tree.leaves(state.opt_state)[1].dtype == jnp.float32


def test_sharded_step_matches_one_device():
  _, one = _run(_mesh((1, 1, 1)))
  for shape in [(8, 1, 1), (2, 2, 2)]:
    state, many = _run(_mesh(shape))
    np.testing.assert_allclose(many, one, rtol=1e-5)
    assert state.params["w"].sharding.spec == P("fsdp", "tensor")
    # AdamW moments take their parameter's sharding; scalars are replicated.
    mu = state.opt_state[1][0].mu
    assert mu["w"].sharding.spec == P("fsdp", "tensor") and state.step.sharding.spec == P()


def test_grad_accumulation_matches_full_batch():
  # Mean of equal micro-batch means == full-batch mean for this loss; only the 1e-3 output noise
  # differs (other RNG keys per micro-batch): observed relative differences ~1e-4.
  _, full = _run(_mesh((2, 1, 1)))
  _, accum = _run(_mesh((2, 1, 1)), accum=2)
  np.testing.assert_allclose(accum, full, rtol=1e-3)


def test_memory_analysis_is_logged():
  _, compiled, _, _ = _setup(_mesh((1, 1, 1)))
  assert "temp=" in format_memory_analysis(compiled)


def test_checkpoint_round_trip_sharded_with_keep_policy(tmp_path):
  mesh = _mesh((2, 2, 2))
  state, compiled, batch_sharding, abstract = _setup(mesh)
  batches = _batches(10)
  for _ in range(3):
    state, _ = compiled(state, jax.device_put(next(batches), batch_sharding))
  saved = jax.tree.map(np.asarray, state)  # host copy: `state` is donated by the next step
  with Checkpointer(str(tmp_path), every_steps=1, keep=2) as ckpt:
    assert ckpt.save(3, state, meta={"phase": 1})
    for step in (4, 5):
      state, _ = compiled(state, jax.device_put(next(batches), batch_sharding))
      ckpt.save(step, state)
    ckpt.wait()
    assert ckpt.all_steps() == [4, 5]  # keep=2 removed step 3
    with pytest.raises(CheckpointError, match="no checkpoint for step 3"):
      ckpt.restore(abstract, step=3)
    assert not ckpt.save(5, state)  # already saved: no second write
  with Checkpointer(str(tmp_path / "other"), every_steps=1) as ckpt:
    ckpt.save(3, jax.tree.map(jnp.asarray, saved), meta={"phase": 1})
  with Checkpointer(str(tmp_path / "other")) as ckpt:  # a fresh manager, as after a restart
    restored = ckpt.restore(abstract)
  assert restored.step == 3 and restored.meta == {"phase": 1}
  for got, want, target in zip(jax.tree.leaves(restored.state), jax.tree.leaves(saved),
                               jax.tree.leaves(abstract)):
    np.testing.assert_array_equal(np.asarray(got), want)
    assert got.sharding == target.sharding  # restored straight onto the run's shardings


def test_checkpoint_restores_iterator_position(tmp_path):
  ds = grain.MapDataset.range(50).shuffle(seed=0).repeat().batch(3)
  it = iter(ds.to_iter_dataset())
  for _ in range(5):
    next(it)
  state = {"x": jnp.arange(4.0)}
  with Checkpointer(str(tmp_path), every_steps=1) as ckpt:
    ckpt.save(5, state, data_iterator=it)
    expected = [next(it) for _ in range(3)]
  fresh = iter(ds.to_iter_dataset())
  with Checkpointer(str(tmp_path)) as ckpt:
    restored = ckpt.restore(jax.eval_shape(lambda: state), data_iterator=fresh)
    with pytest.raises(CheckpointError, match="does not match this run"):
      ckpt.restore({"y": jax.ShapeDtypeStruct((4,), jnp.float32)})
  np.testing.assert_array_equal(restored.state["x"], np.arange(4.0))
  for want in expected:
    np.testing.assert_array_equal(next(fresh), want)
  with pytest.raises(CheckpointError, match="no checkpoint in"):
    Checkpointer(str(tmp_path / "empty")).restore(state)


def test_context_is_passed_whole_and_gets_no_gradient():
  """A frozen input (e.g. reference params of a KL term) is not split into micro-batches."""
  def loss_fn(params, batch, rng, context):
    del rng
    err = batch["x"] @ params["w"] + params["b"] - batch["y"]
    penalty = jnp.sum((params["w"] - context["w_ref"]) ** 2)
    return jnp.mean(err ** 2) + penalty, {"penalty": penalty}

  mesh = _mesh((2, 1, 1))
  state, _, batch_sharding, abstract = _setup(mesh)
  tx, schedule = make_optimizer(OPT, total_steps=20)
  tx_state_shardings = jax.tree.map(lambda x: x.sharding, state)
  step = make_train_step(loss_fn, tx, schedule, compute_dtype=jnp.float32, grad_accum_steps=2)
  context = {"w_ref": jnp.ones((D, K))}
  batch = jax.device_put(next(_batches(1)), batch_sharding)
  replicated = NamedSharding(mesh, P())
  compiled = compile_train_step(step, abstract, jax.eval_shape(lambda: batch), tx_state_shardings,
                                batch_sharding, mesh, abstract_context=jax.eval_shape(lambda: context),
                                context_sharding={"w_ref": replicated})
  params = jax.tree.map(np.asarray, state.params)
  want = loss_fn(params, jax.tree.map(np.asarray, batch), None, context)[0]
  _, metrics = compiled(state, batch, context)
  np.testing.assert_allclose(float(metrics["loss"]), float(want), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["penalty"]), float(jnp.sum((params["w"] - 1) ** 2)),
                             rtol=1e-6)


@pytest.mark.parametrize("accum", [1, 4])
def test_max_and_min_metrics_are_true_extremes_under_gradient_accumulation(accum):
  """`*_max` / `*_min` metrics are the max / min over the whole batch, not the mean of the
  micro-batches' extremes (RL's ratio_max / ratio_min); other metrics are means."""
  def loss_fn(params, batch, rng, context):
    del rng, context
    err = batch["x"] @ params["w"] - batch["y"]
    return jnp.mean(err ** 2), {"err_max": jnp.max(err), "err_min": jnp.min(err), "err": jnp.mean(err)}

  tx, schedule = make_optimizer(OptimizerConfig(lr=0.1), total_steps=1)
  mesh = _mesh((1, 1, 1))
  params = {"w": jnp.ones((D, K))}
  shardings = state_shardings(tx, {"w": NamedSharding(mesh, P())}, params, mesh)
  step = jax.jit(make_train_step(loss_fn, tx, schedule, compute_dtype=jnp.float32, grad_accum_steps=accum))
  batch = next(_batches(1))
  _, metrics = step(create_train_state(params, tx, seed=0, shardings=shardings), batch)
  err = batch["x"] @ np.ones((D, K), np.float32) - batch["y"]
  assert float(metrics["err_max"]) == pytest.approx(err.max(), rel=1e-5)
  assert float(metrics["err_min"]) == pytest.approx(err.min(), rel=1e-5)
  assert float(metrics["err"]) == pytest.approx(err.mean(), rel=1e-4, abs=1e-5)
