"""Flax logits == transformers (PyTorch) logits on identical random weights and 4-D masks, float32.

SDAR is checked against transformers' Qwen3 (its layout), LLaDA against LLaMA (weights renamed to
LLaDA's own tensor names), Dream against Qwen2 (plus the one-position shift), LLaMA against itself.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import model_testlib as tl
from dice_jax.diffusion.objectives import diffusion_loss
from dice_jax.model import masks
from dice_jax.model.hf_io import load_pretrained
from dice_jax.model.transformer import forward


@functools.partial(jax.jit, static_argnames=("logits_slice", "return_kv"))
def _jit_forward(graphdef, state, tokens, attention, **kwargs):
  return forward(graphdef, state, tokens, attention, **kwargs)


def logits_of(model, tokens, attention=None, **kwargs):
  """Jitted logits; a mask kind name becomes an AttentionMask pytree (its kind is static)."""
  graphdef, state = nnx.split(model)
  mask = masks.as_mask(attention or model.config.attention, model.config.block_size)
  return _jit_forward(graphdef, state, jnp.asarray(tokens), mask, **kwargs)


@pytest.fixture(scope="module")
def sdar(tmp_path_factory, shared_dir):
  sdar_config = json.loads((shared_dir / "models/sdar-4b-chat/config.json").read_text())
  ckpt, torch_model = tl.make_sdar(tmp_path_factory.mktemp("sdar") / "ckpt", sdar_config, max_shard_size="100KB")
  return ckpt, torch_model, load_pretrained(ckpt)


@pytest.fixture(scope="module")
def tokens():
  return np.random.default_rng(0).integers(0, 500, (2, 16))


@pytest.mark.parametrize("kind", ["block_causal", "bidirectional", "causal"])
def test_sdar_matches_qwen3_reference(sdar, tokens, kind):
  _, torch_model, model = sdar
  mask = masks.dense(masks.as_mask(kind, 4), 16, 16)
  tl.assert_logits_close(logits_of(model, tokens, kind), tl.torch_logits(torch_model, tokens, mask))


def test_sdar_default_attention_is_block_causal(sdar, tokens):
  _, _, model = sdar
  np.testing.assert_array_equal(logits_of(model, tokens), logits_of(model, tokens, "block_causal"))


def test_sdar_two_copy_matches_reference(sdar, tokens):
  """The training layout [x_t | x_0]: block-diffusion mask, positions 0..n-1 twice."""
  _, torch_model, model = sdar
  noisy = np.where(np.random.default_rng(1).random(tokens.shape) < 0.5, 511, tokens)
  both = np.concatenate([noisy, tokens], axis=1)
  mask = masks.dense(masks.two_copy(4), 32, 32)
  positions = np.tile(np.arange(16), 2)[None].repeat(2, 0)
  ref = tl.torch_logits(torch_model, both, mask, positions)
  tl.assert_logits_close(logits_of(model, both, "two_copy"), ref)
  tl.assert_logits_close(logits_of(model, both, "two_copy", logits_slice=(0, 16)), ref[:, :16])


def test_sdar_explicit_mask_and_positions(sdar, tokens):
  """TraceRL-style: an arbitrary boolean mask and arbitrary positions, per batch row."""
  _, torch_model, model = sdar
  rng = np.random.default_rng(2)
  mask = rng.random((2, 16, 16)) < 0.5
  mask[:, np.arange(16), np.arange(16)] = True
  positions = rng.integers(0, 40, (2, 16))
  ours = logits_of(model, tokens, masks.explicit(jnp.asarray(mask)), positions_BxL=jnp.asarray(positions))
  tl.assert_logits_close(ours, tl.torch_logits(torch_model, tokens, mask, positions))


def test_wrong_rope_theta_is_caught(sdar, tokens):
  """The comparison is sharp enough to notice a wrong RoPE base (it can fail)."""
  ckpt, torch_model, _ = sdar
  wrong = load_pretrained(ckpt, rope_theta=1e4)
  mask = masks.dense(masks.block_causal(4), 16, 16)
  with pytest.raises(AssertionError):
    tl.assert_logits_close(logits_of(wrong, tokens, "block_causal"), tl.torch_logits(torch_model, tokens, mask))


def test_llada_matches_llama_reference(tmp_path, tokens):
  ckpt, torch_model = tl.make_llada(tmp_path / "llada")
  model = load_pretrained(ckpt)
  assert (model.config.architecture, model.config.attention) == ("llada", "bidirectional")
  ref = tl.torch_logits(torch_model, tokens, np.ones((1, 16, 16), bool))
  tl.assert_logits_close(logits_of(model, tokens), ref)


def test_dream_matches_qwen2_reference_shifted(tmp_path, tokens):
  ckpt, torch_model = tl.make_dream(tmp_path / "dream")
  model = load_pretrained(ckpt)
  ref = tl.torch_logits(torch_model, tokens, np.ones((1, 16, 16), bool))
  shifted = np.concatenate([ref[:, :1], ref[:, :-1]], axis=1)  # Dream's own generate() does this
  tl.assert_logits_close(logits_of(model, tokens), shifted)


def test_llama_causal_matches_reference(tmp_path, tokens):
  ckpt, torch_model = tl.make_llama(tmp_path / "llama")
  model = load_pretrained(ckpt)
  ref = tl.torch_logits(torch_model, tokens, np.tril(np.ones((1, 16, 16), bool)))
  tl.assert_logits_close(logits_of(model, tokens), ref)


def test_kv_prefix_reproduces_the_full_pass(sdar, tokens):
  """A cached prefix (k, v from an earlier call) + a new block == one block-causal pass."""
  _, _, model = sdar
  full = logits_of(model, tokens, "block_causal")
  _, kv = logits_of(model, tokens[:, :12], "block_causal", return_kv=True)
  assert kv[0].shape == (2, 2, 12, 2, 16)  # layers, batch, length, kv heads, head_dim
  block_mask = masks.explicit(jnp.ones((2, 4, 16), bool))
  positions = jnp.broadcast_to(jnp.arange(12, 16), (2, 4))
  cached = logits_of(model, tokens[:, 12:], block_mask, positions_BxL=positions, kv_prefix=kv)
  np.testing.assert_allclose(cached, full[:, 12:], rtol=1e-5, atol=1e-5)


def test_scan_unrolled_and_remat_agree(sdar):
  """Layer scan vs unrolled loop with remat: same loss and gradients ("full" remat under scan is
  what the mesh tests run)."""
  ckpt, _, _ = sdar
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(0, 500, (2, 16)))
  response = jnp.arange(16)[None, :] >= 4

  def loss_and_grads(model):
    graphdef, state = nnx.split(model)
    fn = jax.jit(jax.value_and_grad(lambda s: diffusion_loss(graphdef, s, tokens, response, jax.random.key(0),
                                                             objective="two_copy")[0]))
    return fn(state)

  base_loss, base_grads = loss_and_grads(load_pretrained(ckpt))
  for options in (dict(scan_layers=False, remat="minimal"),):
    loss, grads = loss_and_grads(load_pretrained(ckpt, **options))
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6, err_msg=str(options))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=str(options))
