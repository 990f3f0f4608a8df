"""The same loss and gradients on 8 fake CPU devices under every mesh shape as on one device."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import model_testlib as tl
from dice_jax import sharding
from dice_jax.diffusion.objectives import diffusion_loss
from dice_jax.model.hf_io import load_pretrained
from dice_jax.model.transformer import init_model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, shared_dir):
  sdar_config = json.loads((shared_dir / "models/sdar-4b-chat/config.json").read_text())
  return tl.make_sdar(tmp_path_factory.mktemp("mesh") / "ckpt", sdar_config)[0]


def _loss_and_grads(ckpt, mesh):
  model = load_pretrained(ckpt, mesh=mesh, remat="full")
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(0)
  tokens = jax.device_put(jnp.asarray(rng.integers(0, 500, (8, 16))), sharding.batch_sharding(mesh))
  response = jax.device_put(jnp.broadcast_to(jnp.arange(16) >= 5, (8, 16)), sharding.batch_sharding(mesh))

  def loss_fn(state, tokens, response):
    return diffusion_loss(graphdef, state, tokens, response, jax.random.key(1), objective="two_copy")[0]

  with jax.set_mesh(mesh):
    step = jax.jit(jax.value_and_grad(loss_fn), out_shardings=(None, sharding.state_shardings(state, mesh)))
    loss, grads = step(state, tokens, response)
  for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(state)):
    assert g.sharding == p.sharding  # gradients land where their parameters live
  return float(loss), [np.asarray(g) for g in jax.tree.leaves(grads)]


@pytest.fixture(scope="module")
def single_device(ckpt):
  return _loss_and_grads(ckpt, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 4, 1), (2, 2, 2)], ids=lambda s: "x".join(map(str, s)))
def test_mesh_gives_same_loss_and_gradients(ckpt, single_device, shape):
  assert len(jax.devices()) == 8
  loss, grads = _loss_and_grads(ckpt, sharding.make_mesh(*shape))
  ref_loss, ref_grads = single_device
  np.testing.assert_allclose(loss, ref_loss, rtol=2e-6)
  for g, r in zip(grads, ref_grads):  # float32 sums in another order: relative to each tensor's scale
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * np.abs(r).max())


def test_init_creates_parameters_sharded(ckpt):
  """init_model allocates every parameter directly with its mesh sharding (no host copy)."""
  mesh = sharding.make_mesh(2, 2, 2)
  config = load_pretrained(ckpt).config
  state = nnx.state(init_model(config, mesh=mesh, seed=0))
  for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(sharding.state_shardings(state, mesh))):
    assert x.sharding == s
  assert state["embed"][...].sharding.spec == P("tensor", "fsdp")
  assert 0.015 < float(jnp.std(state["layers"]["mlp"]["up_proj"][...])) < 0.025  # normal(0.02)
  single = nnx.state(init_model(config, seed=0))  # the same draw whatever the mesh
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(single)):
    np.testing.assert_array_equal(a, b)


def test_rules_table():
  mesh = sharding.make_mesh(2, 2, 2)
  assert sharding.logical_to_spec(("layers", "embed", "mlp"), (2, 64, 128), mesh) == P(None, "fsdp", "tensor")
  assert sharding.logical_to_spec(("batch", "length"), (8, 16), mesh) == P(("data", "fsdp"), None)
  # Not divisible: replicated rather than an error; a mesh axis is never used twice.
  assert sharding.logical_to_spec(("kv_heads",), (3,), mesh) == P(None)
  assert sharding.logical_to_spec(("batch", "embed"), (8, 64), mesh) == P(("data", "fsdp"), None)
  # Size-1 mesh axes are dropped.
  assert sharding.logical_to_spec(("embed", "vocab"), (64, 512), sharding.make_mesh(8, 1, 1)) == P(None, None)
  with pytest.raises(KeyError, match="not in LOGICAL_AXIS_RULES"):
    sharding.logical_to_spec(("heads",))


def test_make_mesh_sizes():
  assert dict(sharding.make_mesh(2, -1, 2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert dict(sharding.make_mesh().shape) == {"data": 1, "fsdp": 8, "tensor": 1}
  with pytest.raises(ValueError, match="needs 12 devices, have 8"):
    sharding.make_mesh(3, 2, 2)
  with pytest.raises(ValueError, match="at most one"):
    sharding.make_mesh(-1, -1, 2)
