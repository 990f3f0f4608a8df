"""The SFT step (real model, real diffusion losses, AdamW) on 8 fake CPU devices vs one device."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dice_jax import sharding
from dice_jax.model import transformer
from dice_jax.train import model_setup
from dice_jax.train.model_setup import ModelSection
from dice_jax.train.optim import OptimizerConfig, make_optimizer
from dice_jax.train.sft_step import SFTTrainConfig, make_sft_step, resolve_objective
from dice_jax.train.step import compile_train_step
from dice_jax.train.train_state import abstract_state, create_train_state, state_shardings

TINY = dict(model_type="sdar", vocab_size=64, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            block_size=4, mask_token_id=63, rope_theta=10000.0)
B, L = 8, 32


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 60, size=(B, L)).astype(np.int32)
  response = np.arange(L)[None, :] >= rng.integers(4, 16, size=(B, 1))  # prompts of 4..15 tokens
  return {"tokens": tokens, "response_mask": response}


SECTION = ModelSection(init=TINY, tokenizer="builtin:bytes", dtype="float32")


@pytest.fixture(scope="module")
def host_params():
  """Random weights in numpy (no init program to compile), placed anew on every mesh."""
  config = model_setup.model_config(SECTION)
  _, abstract = transformer.abstract_model(config)
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: (0.1 * rng.standard_normal(s.shape)).astype(s.dtype), abstract)


def _losses(host_params, mesh_shape, objective, steps=2):
  config = model_setup.model_config(SECTION)
  mesh = sharding.make_mesh(*mesh_shape, devices=jax.devices()[:int(np.prod(mesh_shape))])
  tx, schedule = make_optimizer(OptimizerConfig(lr=1e-2), total_steps=10)
  graphdef, abstract_params, params_sharding = model_setup.abstract_params(config, mesh)
  shardings = state_shardings(tx, params_sharding, abstract_params, mesh)
  target = abstract_state(tx, abstract_params, shardings)
  state = create_train_state(jax.device_put(host_params, params_sharding), tx, 0, shardings)
  step_fn, _ = make_sft_step(graphdef, config, SFTTrainConfig(objective=objective), tx, schedule)
  batch_sharding = sharding.batch_sharding(mesh, 2)
  batch = jax.device_put(_batch(), batch_sharding)
  compiled = compile_train_step(step_fn, target, jax.eval_shape(lambda: batch), shardings,
                                batch_sharding, mesh)
  out = []
  for _ in range(steps):
    state, metrics = compiled(state, batch)
    out.append((float(metrics["loss"]), float(metrics["grad_norm"])))
  return np.array(out), state


@pytest.mark.parametrize("objective, mesh_shape", [("two_copy", (2, 2, 2)),
                                                   ("masked", (8, 1, 1))])
def test_sharded_sft_step_matches_one_device(host_params, objective, mesh_shape):
  one, _ = _losses(host_params, (1, 1, 1), objective)
  many, state = _losses(host_params, mesh_shape, objective)
  # Same math, different reduction order across shards: float32 tolerance, not bitwise.
  np.testing.assert_allclose(many, one, rtol=2e-5)
  assert one[1, 0] != one[0, 0]  # the second step sees updated params
  # Params stay on the mesh, sharded by the rules table (embed: vocab over tensor, embed over fsdp).
  embed = state.params["embed"][...]
  assert embed.sharding.mesh.shape == dict(zip(("data", "fsdp", "tensor"), mesh_shape))
  assert embed.sharding.spec == sharding.logical_to_spec(("vocab", "embed"), embed.shape,
                                                         embed.sharding.mesh)


def test_objective_follows_the_model():
  sdar = model_setup.model_config(SECTION)
  assert resolve_objective(sdar, "auto") == "two_copy"
  assert resolve_objective(sdar.replace(attention="bidirectional"), "auto") == "masked"
  with pytest.raises(ValueError, match="two_copy needs a block model"):
    resolve_objective(sdar.replace(attention="bidirectional", block_size=0), "two_copy")
