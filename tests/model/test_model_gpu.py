"""On an NVIDIA GPU: every mask kind through cuDNN flash attention, and the block kinds through the
block-sparse Triton kernel, equal XLA attention, forward and backward, in bfloat16; and the model
picks them by itself. Skipped (with the reason) elsewhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dice_jax.model import masks
from dice_jax.model.attention import attend, choose_implementation
from dice_jax.model.config import ModelConfig
from dice_jax.model.flash_attention import flash_attention
from dice_jax.model.transformer import init_model

pytestmark = pytest.mark.gpu

KINDS = {
    "bidirectional": masks.bidirectional(),
    "padded": masks.bidirectional(jnp.array([100, 256], jnp.int32)),
    "causal": masks.causal(),
    "block_causal": masks.block_causal(4),
    "two_copy": masks.two_copy(4),
    "multi_copy": masks.multi_copy(4, copies=2, copy_length=64),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_cudnn_matches_xla(name):
  mask = KINDS[name]
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(2, 256, 8, 128)), jnp.bfloat16)
  k, v, g = (jnp.asarray(rng.normal(size=s), jnp.bfloat16) for s in ((2, 256, 4, 128), (2, 256, 4, 128),
                                                                      (2, 256, 8, 128)))

  def run(impl):
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, mask, impl), q, k, v)
    return (out, *vjp(g))

  for a, b in zip(jax.jit(lambda: run("cudnn"))(), jax.jit(lambda: run("xla"))()):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2, rtol=3e-2)


def test_explicit_mask_with_cached_prefix_on_cudnn():
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(2, 4, 8, 128)), jnp.bfloat16)
  k, v = (jnp.asarray(rng.normal(size=(2, 260, 4, 128)), jnp.bfloat16) for _ in range(2))
  mask = masks.explicit(jnp.asarray(rng.random((2, 4, 260)) < 0.7).at[:, :, -4:].set(True))
  a, b = attend(q, k, v, mask, "cudnn"), attend(q, k, v, mask, "xla")
  np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("name", ["block_causal", "two_copy", "multi_copy"])
def test_block_sparse_kernel_matches_xla(name):
  mask = KINDS[name]
  rng = np.random.default_rng(3)
  q, g = (jnp.asarray(rng.normal(size=(2, 256, 8, 128)), jnp.bfloat16) for _ in range(2))
  k, v = (jnp.asarray(rng.normal(size=(2, 256, 4, 128)), jnp.bfloat16) for _ in range(2))

  def run(fn):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(g))

  got = jax.jit(lambda: run(lambda q, k, v: flash_attention(q, k, v, mask)))()
  want = jax.jit(lambda: run(lambda q, k, v: attend(q, k, v, mask, "xla")))()
  for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2, rtol=3e-2,
                               err_msg=what)


def _cfg(attention: str) -> ModelConfig:
  return ModelConfig(architecture="sdar", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=64, qk_norm=True, attention=attention, block_size=4,
                     mask_token_id=1023, dtype="bfloat16")


@pytest.mark.parametrize("attention,kernels", [("bidirectional", ("cudnn",)),
                                               ("block_causal", ("block_sparse_attention", "xla.gpu.triton"))])
def test_model_picks_its_kernel_in_bf16(attention, kernels):
  assert choose_implementation("auto", jnp.bfloat16, 128) == "cudnn"
  assert choose_implementation("auto", jnp.bfloat16, 128, "two_copy") == "pallas"
  cfg = _cfg(attention)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 1000, (2, 128)))
  fast = init_model(cfg)
  slow = init_model(cfg.replace(attention_impl="xla"))
  hlo = jax.jit(lambda t: fast(t)).lower(tokens).compile().as_text()
  assert any(k in hlo.lower() for k in kernels), kernels
  np.testing.assert_allclose(np.asarray(fast(tokens)), np.asarray(slow(tokens)), atol=5e-2, rtol=5e-2)
