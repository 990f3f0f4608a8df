"""Shared pieces of the sampler tests: tiny models (fixtures), ragged prompts, peaked random weights.

Not a conftest.py: a second module named `conftest` would shadow tests/conftest.py for other tests
that import from it. Test modules import the fixtures they use from here.
"""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from dice_jax.model import transformer
from dice_jax.model.config import ModelConfig

MASK_ID = 95
DIMS = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position_embeddings=64, mask_token_id=MASK_ID, eos_token_id=1, pad_token_id=0)
# Ragged prompts of width 10: tails of 3, 2, 2 and 0 tokens in their last block of 4.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23]]


def peaked(model: transformer.Transformer, scale: float = 10.0) -> transformer.Transformer:
  """The same random model with weight matrices scaled up: peaked, tie-free next-token distributions."""
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.tree.map(lambda a: a * scale if a.ndim >= 2 else a, state))


@pytest.fixture(scope="session")
def sdar_model() -> transformer.Transformer:
  config = ModelConfig(architecture="sdar", attention="block_causal", block_size=4, **DIMS)
  return peaked(transformer.init_model(config, seed=1))


@pytest.fixture(scope="session")
def llada_model() -> transformer.Transformer:
  config = ModelConfig(architecture="llada", attention="bidirectional", **DIMS)
  return peaked(transformer.init_model(config, seed=2))


@pytest.fixture(scope="session")
def dream_model() -> transformer.Transformer:
  config = ModelConfig(architecture="dream", attention="bidirectional", logits_shift=True, qkv_bias=True, **DIMS)
  return peaked(transformer.init_model(config, seed=3))
