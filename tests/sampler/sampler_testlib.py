"""Shared pieces of the sampler tests: tiny models (fixtures), ragged prompts, peaked random weights.

Not a conftest.py: a second module named `conftest` would shadow tests/conftest.py for other tests
that import from it. Test modules import the fixtures they use from here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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


# Float32 tolerance for log-probs that two decode paths compute with sums in different orders
# (cached vs recomputed attention, the Pallas kernel vs XLA, tensor-parallel partial sums). A
# reordered sum changes a float32 logit by a few units in the last place (ulp) of its magnitude;
# every layer can pass such an error on and amplify it, and log-softmax passes an error in the
# logits through at most 2x. The size of the error depends on the CPU's kernels and thread count
# (CI saw 1.45e-5 where this machine sees 1.2e-6), so the tolerance is a budget of ulps of the
# largest scaled logit per layer, not a constant. A real decoding error (a missing or misplaced
# cache entry, a wrong mask) moves log-probs by 1e-2 or more, far beyond it.
ULPS_PER_LAYER = 64


def logprob_atol(model: transformer.Transformer, prompts, rollout, temperature: float = 1.0) -> float:
  """The float32 log-prob tolerance for `rollout` of `model` (see ULPS_PER_LAYER)."""
  tokens = np.asarray(rollout.tokens)
  largest = 0.0
  for row, prompt in enumerate(prompts):
    seq = jnp.asarray([list(prompt) + tokens[row].tolist()], jnp.int32)
    largest = max(largest, float(jnp.max(jnp.abs(model(seq, attention=model.config.attention)))))
  scale = max(1.0, largest / temperature)
  return ULPS_PER_LAYER * model.config.num_layers * float(np.finfo(np.float32).eps) * scale
