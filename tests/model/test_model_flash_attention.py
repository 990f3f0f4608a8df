"""Block-sparse flash attention (dice_jax.model.flash_attention) in Pallas's interpreter against XLA's
dense reference attention: the layouts, the tile lists, values and all three gradients, and a lowered
two-copy training step with no L x L array in it."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dice_jax.diffusion.objectives import diffusion_loss
from dice_jax.model import masks
from dice_jax.model.attention import attend, choose_implementation
from dice_jax.model.block_layout import BlockLayout
from dice_jax.model.config import ModelConfig
from dice_jax.model.flash_attention import Tuning, flash_attention, self_check
from dice_jax.model.transformer import init_model

SMALL = Tuning(fwd_q=16, fwd_k=16, bwd_q=16, bwd_k=32)  # tiles small enough that these lengths span many

LAYOUT_CASES = [(masks.block_causal(4), 36), (masks.block_causal(2), 64), (masks.two_copy(4), 40),
                (masks.two_copy(4), 64), (masks.multi_copy(4, 2, 8), 40), (masks.multi_copy(4, 3, 4), 28),
                (masks.multi_copy(2, 2, 6), 30)]


@pytest.mark.parametrize("mask,length", LAYOUT_CASES)
def test_layout_is_the_dense_mask(mask, length):
  np.testing.assert_array_equal(BlockLayout.from_mask(mask, length).dense(),
                                np.asarray(masks.dense(mask, length, length)[0]))


@pytest.mark.parametrize("mask,length", LAYOUT_CASES)
@pytest.mark.parametrize("tiles", [(4, 4), (8, 16), (16, 8)])
def test_tile_lists_cover_every_allowed_pair_and_full_tiles_need_no_mask(mask, length, tiles):
  tq, tk = tiles
  layout = BlockLayout.from_mask(mask, length)
  padded = -(-length // 16) * 16
  dense = np.zeros((padded, padded), bool)
  dense[:length, :length] = layout.dense()
  lists = layout.tiles(tq, tk, padded)
  for i in range(padded // tq):
    listed = list(lists.cols[i, :lists.total[i]])
    assert len(set(listed)) == len(listed)
    real_rows = np.arange(i * tq, (i + 1) * tq) < length
    for j in range(padded // tk):
      tile = dense[i * tq:(i + 1) * tq, j * tk:(j + 1) * tk]
      assert (j in listed) == bool(tile.any()), (i, j)
      if j in listed[:lists.full[i]]:  # visited without mask arithmetic: every real row sees every key
        assert tile[real_rows].all() and (j + 1) * tk <= length, (i, j)


def test_two_copy_visits_about_a_third_of_what_dense_bias_attention_computes():
  n = 2048
  lists = BlockLayout.from_mask(masks.two_copy(4), 2 * n).tiles(128, 64, 2 * n)
  dense_bias_pairs = 3 * n * n  # two cuDNN calls: n x 2n and n x n
  visited_pairs = lists.visited * 128 * 64
  assert visited_pairs < 0.4 * dense_bias_pairs
  assert lists.full.sum() > 0.9 * (lists.total - lists.full).sum()  # mostly mask-free tiles


def _operands(batch, length, heads, kv_heads, head_dim, dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), dtype)
  k, v = (jnp.asarray(rng.normal(size=(batch, length, kv_heads, head_dim)), dtype) for _ in range(2))
  g = jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), dtype)
  return q, k, v, g


KERNEL_CASES = {
    "block_causal": (masks.block_causal(4), 64),
    "block_causal_padded_keys": (masks.block_causal(4, kv_lengths_B=jnp.array([50, 64])), 64),
    "two_copy_unaligned": (masks.two_copy(4), 40),  # n = 20: tiles straddle noisy/clean, padding appended
    "multi_copy_left_right_padding": (masks.multi_copy(4, 2, 8, kv_start_B=jnp.array([4, 0]),
                                                       kv_lengths_B=jnp.array([20, 24])), 40),
}


# The forward's query tiles span two of the backward's: a backward tile of real rows and appended
# padding can be mask-free while the forward met those padding rows only in masked tiles.
COARSE_FORWARD = Tuning(fwd_q=32, fwd_k=16, bwd_q=16, bwd_k=16)


@pytest.mark.parametrize("name", [*KERNEL_CASES, "padding_rows_under_a_coarser_forward_tiling"])
def test_kernel_matches_reference_attention_and_its_gradients(name):
  mask, length = KERNEL_CASES.get(name, (masks.block_causal(4), 24))
  tuning = COARSE_FORWARD if name not in KERNEL_CASES else SMALL
  q, k, v, g = _operands(2, length, 4, 2, 16)

  def run(fn):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(g))

  got = jax.jit(lambda: run(lambda q, k, v: flash_attention(q, k, v, mask, tuning=tuning)))()
  want = jax.jit(lambda: run(lambda q, k, v: attend(q, k, v, mask, "xla")))()
  for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5, err_msg=what)


def test_bad_operands_are_refused():
  q, k, v, _ = _operands(1, 32, 4, 2, 16)
  with pytest.raises(ValueError, match="no block layout"):
    flash_attention(q, k, v, masks.causal())
  with pytest.raises(ValueError, match="power of two"):
    flash_attention(q[..., :12], k[..., :12], v[..., :12], masks.block_causal(4))
  with pytest.raises(ValueError, match="as many queries as keys"):
    flash_attention(q[:, :16], k, v, masks.block_causal(4))
  with pytest.raises(ValueError, match="attention_impl='pallas' is impossible"):
    choose_implementation("pallas", jnp.bfloat16, 12, "two_copy")


def test_self_check_runs_even_while_tracing():
  # What "auto" asks on a GPU before relying on the kernel; here it runs in the interpreter.
  assert jax.jit(lambda x: x + len(self_check()))(1.0) == 1.0


def test_implementation_choice_off_gpu():
  assert choose_implementation("auto", jnp.bfloat16, 128, "two_copy") == "xla"  # never the slow interpreter
  assert choose_implementation("pallas", jnp.float32, 128, "two_copy") == "pallas"
  assert choose_implementation("pallas", jnp.float32, 128, "bidirectional") == "xla"


def _tiny(**kw) -> ModelConfig:
  return ModelConfig(architecture="sdar", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, attention="block_causal", block_size=4,
                     mask_token_id=127, **kw)


def _largest_square(text: str, at_least: int) -> list[str]:
  """Shapes in a lowered program with two dimensions of at least `at_least`."""
  shapes = re.findall(r"tensor<((?:\d+x)+)[a-z]", text)
  return sorted({s for s in shapes if sum(int(d) >= at_least for d in s.rstrip("x").split("x")) >= 2})


def test_two_copy_training_step_has_no_length_squared_array():
  n = 256
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 120, (2, n)), jnp.int32)
  response = jnp.arange(n)[None, :] >= n // 4

  def lowered(impl):
    model = init_model(_tiny(attention_impl=impl))
    graphdef, state = nnx.split(model)
    grad = jax.grad(lambda s: diffusion_loss(graphdef, s, tokens, response, jax.random.key(0),
                                             objective="two_copy")[0])
    return jax.jit(grad).lower(state).as_text()

  assert _largest_square(lowered("xla"), n), "the check must see the dense path's L x L scores"
  assert _largest_square(lowered("pallas"), n) == []


def test_model_forward_and_gradient_through_the_kernel_equal_xla():
  cfg = _tiny()
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 120, (2, 32)), jnp.int32)
  response = jnp.arange(32)[None, :] >= 8
  fast, slow = init_model(cfg.replace(attention_impl="pallas")), init_model(cfg.replace(attention_impl="xla"))
  np.testing.assert_allclose(np.asarray(fast(tokens)), np.asarray(slow(tokens)), atol=2e-5, rtol=2e-5)

  def loss_grad(model):
    graphdef, state = nnx.split(model)
    return jax.jit(jax.value_and_grad(lambda s: diffusion_loss(graphdef, s, tokens, response, jax.random.key(3),
                                                               objective="two_copy")[0]))(state)

  (la, ga), (lb, gb) = loss_grad(fast), loss_grad(slow)
  np.testing.assert_allclose(float(la), float(lb), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
