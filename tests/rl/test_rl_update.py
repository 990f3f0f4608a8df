"""The pure jitted update step: on-policy ratio 1, gradient direction, a stale rollout's ratio taken
against the params the update starts from, the learning-rate scale, and a sharded update == 1 device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dice_jax import sharding
from dice_jax.model import transformer
from dice_jax.model.config import ModelConfig
from dice_jax.rl import logprobs, update
from dice_jax.rl.batch import RLBatch
from dice_jax.rl.config import AlgoSection
from dice_jax.rl.update import make_update_step
from dice_jax.sampler.config import SamplerConfig, resolve
from dice_jax.train.optim import OptimizerConfig, make_optimizer, scale_lr
from dice_jax.train.step import compile_train_step
from dice_jax.train.train_state import abstract_state, create_train_state, state_shardings

CONFIG = ModelConfig(architecture="sdar", attention="block_causal", block_size=4, vocab_size=64, hidden_size=32,
                     intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                     max_position_embeddings=64, mask_token_id=63, eos_token_id=1, pad_token_id=0)
SPEC = resolve(SamplerConfig(gen_length=8), CONFIG)  # block 4, 4 steps per block, mask 63, pad 0, T 1
GROUP, ROWS, WIDTH = 4, 16, 7


def _batch(graphdef, params, algo: AlgoSection) -> RLBatch:
  """A rollout-shaped batch (random tokens and commit ranks), old log-probs scored under `params`."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, WIDTH + 1, ROWS).astype(np.int32)
  prompt = np.where(np.arange(WIDTH)[None] < lengths[:, None], rng.integers(2, 60, (ROWS, WIDTH)), 0)
  tokens = rng.integers(2, 60, (ROWS, SPEC.gen_length)).astype(np.int32)
  valid = np.arange(SPEC.gen_length)[None] < rng.integers(3, SPEC.gen_length + 1, ROWS)[:, None]
  batch = RLBatch(prompt=jnp.asarray(prompt, jnp.int32), prompt_lengths=jnp.asarray(lengths),
                  tokens=jnp.asarray(tokens), valid=jnp.asarray(valid),
                  commit_rank=jnp.asarray(rng.integers(0, 4, (ROWS, SPEC.gen_length)), jnp.int32),
                  old_logp=jnp.zeros((ROWS, SPEC.gen_length), jnp.float32),  # scored next
                  score_keys=jax.random.key_data(jax.random.split(jax.random.key(1), ROWS)),
                  rewards=jnp.asarray(np.tile([1.0, 0.0, 0.5, 0.0], ROWS // GROUP), jnp.float32),
                  reward_valid=jnp.ones(ROWS, bool))
  assert not algo.uses_reference  # no ref_logp here
  return batch.replace(old_logp=jax.jit(logprobs.policy_logprobs, static_argnums=(0, 2, 3))(
      graphdef, params, SPEC, algo.logprob, batch)[0])


def _update(mesh, algo: AlgoSection, minibatches: int, lr: float = 1e-3, *, behaviour_seed: int | None = None,
            decoupled: bool = False, lr_factor: float | None = None):
  """(new params, metrics, old params, batch) of one compiled update_step on `mesh`. The batch's old
  log-probs are scored under the start params, or under another model's (`behaviour_seed`: a stale
  rollout); `lr_factor` cuts the adjustable optimizer's learning-rate scale first."""
  model = transformer.init_model(CONFIG, mesh=mesh, seed=0)
  graphdef, params = nnx.split(model)
  tx, schedule = make_optimizer(OptimizerConfig(lr=lr, max_grad_norm=None), 10, adjustable=lr_factor is not None)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
  shardings = state_shardings(tx, jax.tree.map(lambda x: x.sharding, params), abstract, mesh)
  before = jax.device_get(params)
  behaviour = params if behaviour_seed is None else nnx.split(transformer.init_model(CONFIG, mesh=mesh,
                                                                                      seed=behaviour_seed))[1]
  batch = _batch(graphdef, behaviour, algo)
  row_sharding = sharding.batch_sharding(mesh, 1)
  batch = jax.device_put(batch, row_sharding)
  state = create_train_state(params, tx, 0, shardings)
  if lr_factor is not None:
    state = state.replace(opt_state=scale_lr(state.opt_state, lr_factor))
  step = make_update_step(graphdef, SPEC, algo, tx, schedule, group_size=GROUP, num_minibatches=minibatches,
                          grad_accum_steps=1, compute_dtype=jnp.float32, decoupled=decoupled)
  abstract_batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=row_sharding), batch)
  compiled = compile_train_step(step, abstract_state(tx, abstract, shardings), abstract_batch, shardings,
                                row_sharding, mesh)
  state, metrics = compiled(state, batch)
  return graphdef, jax.device_get(state.params), {k: float(v) for k, v in metrics.items()}, before, batch


def test_on_policy_update_has_ratio_one_and_moves_logprobs_with_the_advantage():
  mesh = transformer.single_device_mesh()
  algo = AlgoSection(advantage="drgrpo", kl_beta=0.0)
  graphdef, after, metrics, before, batch = _update(mesh, algo, minibatches=1, lr=3e-3)
  assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
  assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-6) and metrics["clip_frac"] == 0.0
  assert metrics["kl"] == pytest.approx(0.0, abs=1e-7) and metrics["grad_norm"] > 0
  score = jax.jit(logprobs.policy_logprobs, static_argnums=(0, 2, 3))
  old = np.asarray(score(graphdef, before, SPEC, "trace", batch)[0])
  new = np.asarray(score(graphdef, after, SPEC, "trace", batch)[0])
  valid = np.asarray(batch.valid)
  change = ((new - old) * valid).sum(axis=1)
  adv = np.tile([0.625, -0.375, 0.125, -0.375], ROWS // GROUP)  # rewards minus the group mean 0.375
  assert np.all(change[adv > 0.5] > 0) and np.all(change[adv < 0] < 0)


def test_stale_rollout_is_scored_under_the_params_the_update_starts_from():
  """A rollout sampled by other params (overlap: sampled before the previous update): with the
  decoupled correction the single minibatch's ratio is exactly 1 (it is taken against the update's
  own starting params, scored inside the update) and the behaviour policy enters only through the
  truncated weight; without it the ratio is to the behaviour policy and far from 1."""
  mesh = transformer.single_device_mesh()
  algo = AlgoSection(advantage="drgrpo", kl_beta=0.0)
  _, _, fixed, _, _ = _update(mesh, algo, minibatches=1, behaviour_seed=7, decoupled=True)
  assert fixed["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and fixed["ratio_max"] == pytest.approx(1.0, abs=1e-5)
  assert fixed["is_weight_mean"] != pytest.approx(1.0, abs=1e-3) and fixed["is_weight_mean"] <= algo.is_cap
  _, _, stale, _, _ = _update(mesh, algo, minibatches=1, behaviour_seed=7)
  assert abs(stale["ratio_mean"] - 1.0) > 1e-2 and stale["is_weight_mean"] == 1.0
  # A fresh rollout under the correction: weight 1, ratio 1, the plain on-policy update.
  _, _, fresh, _, _ = _update(mesh, algo, minibatches=1, decoupled=True)
  assert fresh["is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and fresh["ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def test_proximal_scoring_in_micro_batches_keeps_the_row_order():
  mesh = transformer.single_device_mesh()
  graphdef, params = nnx.split(transformer.init_model(CONFIG, mesh=mesh, seed=0))
  algo = AlgoSection()
  batch = _batch(graphdef, params, algo)
  whole = np.asarray(logprobs.policy_logprobs(graphdef, params, SPEC, "trace", batch)[0])
  parts = jax.jit(update._proximal_logp, static_argnums=(0, 1, 2, 5, 6))(graphdef, SPEC, algo, params, batch, 4,
                                                                         jnp.float32)
  np.testing.assert_allclose(np.asarray(parts), whole, rtol=1e-5, atol=1e-5)


def test_learning_rate_scale_reaches_the_compiled_update():
  """The KL guard's cut (optimizer state, no recompile): the update moves the params half as far and
  reports half the learning rate."""
  mesh = transformer.single_device_mesh()
  algo = AlgoSection(advantage="drgrpo", kl_beta=0.0)
  _, full, m_full, before, _ = _update(mesh, algo, minibatches=1, lr_factor=1.0)
  _, half, m_half, _, _ = _update(mesh, algo, minibatches=1, lr_factor=0.5)
  assert m_half["lr"] == pytest.approx(m_full["lr"] / 2)
  for b, f, h in zip(jax.tree.leaves(before), jax.tree.leaves(full), jax.tree.leaves(half)):
    np.testing.assert_allclose(np.asarray(h) - np.asarray(b), (np.asarray(f) - np.asarray(b)) / 2, atol=1e-7)


def test_sharded_update_equals_one_device():
  """FSDP over every device (CI: the 8 CPU devices tests/conftest.py fakes; a 2-GPU machine: both
  GPUs, benchmarks/gpu_two.sh rl) against the first device alone."""
  if jax.device_count() < 2:
    pytest.skip("needs 2 or more devices")
  algo = AlgoSection()
  _, one, m1, _, _ = _update(transformer.single_device_mesh(), algo, minibatches=2)
  _, many, mn, _, _ = _update(sharding.make_mesh(1, jax.device_count(), 1), algo, minibatches=2)
  for key in ("loss", "kl", "ratio_mean", "grad_norm", "entropy", "adv/abs_mean"):
    assert mn[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
  assert m1["kl"] > 0  # the second minibatch is off-policy
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-4)
