"""The public surface (ARCHITECTURE.md, "Public surface"): the names users call stay importable and
keep their shape."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dice_jax as dj


def test_import_is_light():
  """`import dice_jax` must not initialise JAX or pull in torch (the CLI's --help stays fast)."""
  code = "import sys, dice_jax; print('jax' in sys.modules, 'torch' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("name", dj.__all__)
def test_public_names_resolve(name):
  assert getattr(dj, name) is not None


def test_unknown_name_is_a_clear_error():
  with pytest.raises(AttributeError, match="no attribute 'load_pretraind'"):
    dj.load_pretraind  # noqa: B018


def test_tiny_model_round_trip_through_the_public_surface(tmp_path):
  import jax
  import numpy as np

  from dice_jax.model import transformer

  config = dj.ModelConfig.from_hf_dict(dict(
      model_type="sdar", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, block_size=4, mask_token_id=63,
      eos_token_id=62, rope_theta=10000.0, max_position_embeddings=64), dtype="float32")
  model = transformer.init_model(config, seed=3)
  tokens_BxL = np.arange(16, dtype=np.int32).reshape(2, 8)
  logits_BxLxV = model(tokens_BxL, attention="block_causal")
  assert logits_BxLxV.shape == (2, 8, 64)
  dj.save_pretrained(model, tmp_path / "ckpt")
  reloaded = dj.load_pretrained(tmp_path / "ckpt", dtype="float32")
  np.testing.assert_array_equal(np.asarray(reloaded(tokens_BxL, attention="block_causal")),
                                np.asarray(logits_BxLxV))
  rollout = dj.sample(reloaded, [[1, 2, 3, 4], [5, 6, 7, 8]], jax.random.key(0),
                      dj.SamplerConfig(gen_length=8, top_k=1))
  assert np.asarray(rollout.tokens).shape == (2, 8)
  assert np.asarray(rollout.commit_step).shape == (2, 8)
