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


@pytest.mark.parametrize("num_queries", [4, 8])  # a denoising step; the first step of a block (two blocks)
def test_triton_kernel_matches_xla_attention(num_queries):
  assert decode_attention.choose("auto") == "pallas"
  rng = np.random.default_rng(0)
  b, h, g, d = 16, 32, 8, 128  # SDAR-4B heads: 16 (or 32) query rows per kv head
  s = decode_attention.cache_length(1600, "pallas")  # room for slots [1532, 1540)
  qs = jnp.asarray(rng.normal(size=(b, num_queries, h, d)), jnp.bfloat16)
  k_new, v_new = (jnp.asarray(rng.normal(size=(b, num_queries, g, d)), jnp.bfloat16) for _ in range(2))
  ks, vs = (jnp.asarray(rng.normal(size=(b, g, s, d)), jnp.bfloat16) for _ in range(2))
  at = jnp.int32(1532)
  start = jnp.asarray(rng.integers(0, 4, b) * 4, jnp.int32)
  block_end = 1532 + 4 * (np.arange(num_queries) // 4 + 1)
  ends = jnp.asarray(np.minimum(block_end[None], rng.integers(1533, 1541, b)[:, None]), jnp.int32)
  attend = jax.jit(decode_attention.update_and_attend, static_argnums=8)
  f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
  want, k_want, _ = attend(f32(qs), f32(k_new), f32(v_new), f32(ks), f32(vs), at, start, ends, "xla")
  got, k_got, _ = attend(qs, k_new, v_new, ks, vs, at, start, ends, "pallas")
  assert _relative_error(got, want) < 1e-2
  np.testing.assert_array_equal(np.asarray(f32(k_got)), np.asarray(k_want))


@functools.partial(jax.jit, static_argnums=(0, 4))
def _first_step_logits(graphdef, state, prompt, lengths, config):
  """Logits of the first generated block: through the cache (prefill, then the first step's pass over the
  prompt's last complete block and the first generated one, Triton) and by full recompute."""
  sampler = BlockSampler(graphdef, state, config, resolve(config, nnx.merge(graphdef, state).config))
  layout, st = sampler.init(prompt, lengths)
  start = st.block * layout.block_size
  cached, _ = sampler._hidden_cached(layout, st, start, with_previous=True)  # noqa: SLF001
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
