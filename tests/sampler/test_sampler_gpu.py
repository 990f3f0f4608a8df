"""On a GPU: the Triton decode kernel (compiled, not interpreted), alone in bf16 and inside the cached path.

Run on the device machine: python -m pytest tests/sampler/test_sampler_gpu.py -q
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampler_testlib import peaked
from flax import nnx

from dice_jax.model import transformer
from dice_jax.model.config import ModelConfig
from dice_jax.sampler import SamplerConfig, decode_attention, sample
from dice_jax.sampler.block import BlockSampler
from dice_jax.sampler.config import resolve

pytestmark = pytest.mark.gpu


def _relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_triton_kernel_matches_xla_attention():
  assert decode_attention.choose("auto") == "pallas"
  rng = np.random.default_rng(0)
  b, q, h, g, d = 16, 4, 32, 8, 128  # SDAR-4B heads: 16 query rows per kv head
  s = decode_attention.cache_length(1540, "pallas")
  qs = jnp.asarray(rng.normal(size=(b, q, h, d)), jnp.bfloat16)
  ks, vs = (jnp.asarray(rng.normal(size=(b, g, s, d)), jnp.bfloat16) for _ in range(2))
  start = jnp.asarray(rng.integers(0, 4, b) * 4, jnp.int32)
  end = jnp.asarray(rng.integers(8, 1540, b), jnp.int32)
  attend = jax.jit(decode_attention.attend_cache, static_argnums=5)
  want = attend(qs.astype(jnp.float32), ks.astype(jnp.float32), vs.astype(jnp.float32), start, end, "xla")
  assert _relative_error(attend(qs, ks, vs, start, end, "pallas"), want) < 1e-2


@functools.partial(jax.jit, static_argnums=(0, 4))
def _first_step_logits(graphdef, state, prompt, lengths, config):
  """Logits of the first generated block: through the cache (prefill + Triton) and by full recompute."""
  sampler = BlockSampler(graphdef, state, config, resolve(config, nnx.merge(graphdef, state).config))
  layout, st = sampler.init(prompt, lengths)
  start = st.block * layout.block_size
  cached, _ = sampler._hidden_cached(layout, st, start)  # noqa: SLF001
  full = sampler._hidden_full(layout, st.canvas_BxS, start)  # noqa: SLF001
  return sampler.decoder.head(cached), sampler.decoder.head(full)


def test_cached_block_logits_match_full_recompute():
  """float32 compute, so that only the kernel's own rounding (Triton may use tf32) separates the paths."""
  mc = ModelConfig(architecture="sdar", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2,
                   num_heads=8, num_kv_heads=2, head_dim=128, block_size=4, mask_token_id=511, eos_token_id=1,
                   max_position_embeddings=1024, attention="block_causal")
  model = peaked(transformer.init_model(mc), 3.0)
  graphdef, state = nnx.split(model)
  lengths = jnp.array([300, 257, 64, 5], jnp.int32)
  prompt = jax.random.randint(jax.random.key(0), (4, 300), 2, 500)
  cached, full = _first_step_logits(graphdef, state, prompt, lengths, SamplerConfig(gen_length=64))
  assert _relative_error(cached, full) < 1e-2
  rollout = sample(model, [list(np.asarray(prompt[i, :n])) for i, n in enumerate(lengths)], jax.random.key(1),
                   SamplerConfig(gen_length=64, eos_ids=()))
  assert np.asarray(rollout.valid).all() and np.isfinite(np.asarray(rollout.logprobs)).all()
  assert int(rollout.num_steps) == 16 * 4 + 1  # prompt tails 0, 1, 0, 1: 16 blocks of 4 steps, a 17th of 1
