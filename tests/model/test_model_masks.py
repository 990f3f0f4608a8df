"""Attention masks against hand-written matrices, and the kernels' split paths against dense attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dice_jax.model import masks
from dice_jax.model.attention import attend, choose_implementation


def _m(rows: str) -> np.ndarray:
  return np.array([[c == "1" for c in r] for r in rows.split()], bool)


def test_block_causal_by_hand():
  expected = _m("""110000
                   110000
                   111100
                   111100
                   111111
                   111111""")
  np.testing.assert_array_equal(masks.dense(masks.block_causal(2), 6, 6)[0], expected)


def test_two_copy_by_hand():
  # n = 4 tokens, block 2: rows/cols are [noisy 0..3 | clean 0..3].
  expected = _m("""11000000
                   11000000
                   00111100
                   00111100
                   00001100
                   00001100
                   00001111
                   00001111""")
  np.testing.assert_array_equal(masks.dense(masks.two_copy(2), 8, 8)[0], expected)
  np.testing.assert_array_equal(masks.default_positions(masks.two_copy(2), 1, 8)[0], [0, 1, 2, 3, 0, 1, 2, 3])


def test_causal_and_padding():
  m = masks.dense(masks.causal(jnp.array([3, 1])), 4, 4)
  np.testing.assert_array_equal(m[0], _m("1000 1100 1110 1110"))
  np.testing.assert_array_equal(m[1], _m("1000 1000 1000 1000"))
  b = masks.dense(masks.bidirectional(jnp.array([2])), 3, 3)
  np.testing.assert_array_equal(b[0], _m("110 110 110"))


def test_bad_masks_are_refused():
  with pytest.raises(ValueError, match="block_size"):
    masks.as_mask("block_causal", 0)
  with pytest.raises(ValueError, match="boolean BxQxK"):
    masks.explicit(jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="choose one of"):
    masks.as_mask("sliding", 4)
  with pytest.raises(ValueError, match="kv_lengths_B is not supported"):
    masks.AttentionMask("two_copy", 4, kv_lengths_B=jnp.ones(2, jnp.int32)).validate()
  with pytest.raises(ValueError, match="even length"):
    masks.dense(masks.two_copy(2), 5, 5)
  with pytest.raises(ValueError, match="explicit mask"):
    masks.dense(masks.AttentionMask("block_causal", 2), 4, 6)


def _dense_reference(q, k, v, mask_BxQxK):
  """Plain softmax attention with GQA by repetition: the definition the kernels must match."""
  group = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
  scores = jnp.where(mask_BxQxK[:, None], scores, -jnp.inf)
  return jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("mask", [masks.bidirectional(), masks.causal(), masks.block_causal(4), masks.two_copy(4),
                                  masks.bidirectional(jnp.array([5, 12], jnp.int32)),
                                  masks.block_causal(4, jnp.array([7, 12], jnp.int32))],
                         ids=["bidirectional", "causal", "block_causal", "two_copy", "padded", "block_padded"])
def test_attend_matches_dense_definition(mask):
  """Each kind's kernel path (incl. two_copy's two-call split) equals masked softmax attention."""
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(2, 12, 4, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(2, 12, 2, 8)), jnp.float32) for _ in range(2))
  out = attend(q, k, v, mask, "xla")
  dense = jnp.broadcast_to(masks.dense(mask, 12, 12), (2, 12, 12))
  np.testing.assert_allclose(out, _dense_reference(q, k, v, dense), rtol=1e-5, atol=1e-6)


def test_explicit_mask_with_prefix_keys():
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(1, 3, 2, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(1, 7, 2, 8)), jnp.float32) for _ in range(2))
  m = jnp.asarray(rng.random((1, 3, 7)) < 0.6).at[:, :, 0].set(True)
  np.testing.assert_allclose(attend(q, k, v, masks.explicit(m), "xla"), _dense_reference(q, k, v, m),
                             rtol=1e-5, atol=1e-6)


def test_implementation_choice_on_cpu():
  assert choose_implementation("auto", jnp.bfloat16, 128) == "xla"
  assert choose_implementation("xla", jnp.float32, 128) == "xla"
  with pytest.raises(ValueError, match="cudnn.*impossible.*backend is cpu"):
    choose_implementation("cudnn", jnp.bfloat16, 128)
