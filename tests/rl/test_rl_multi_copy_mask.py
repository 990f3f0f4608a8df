"""The multi_copy attention kind (TraceRL's one-pass layout): by hand, and its split kernel path
against dense attention with the same mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dice_jax.model import masks
from dice_jax.model.attention import attend


def _m(rows: str) -> np.ndarray:
  return np.array([[c == "1" for c in r] for r in rows.split()], bool)


def test_multi_copy_by_hand():
  # Clean L = 4 (blocks of 2: [0 1][2 3]); 2 copies of the last n = 2 slots (block 1).
  # Columns: clean 0..3 | copy0 (slots 2,3) | copy1 (slots 2,3).
  expected = _m("""11000000
                   11000000
                   11110000
                   11110000
                   11001100
                   11001100
                   11000011
                   11000011""")
  mask = masks.multi_copy(2, copies=2, copy_length=2)
  np.testing.assert_array_equal(masks.dense(mask, 8, 8)[0], expected)
  np.testing.assert_array_equal(masks.default_positions(mask, 1, 8)[0], [0, 1, 2, 3, 2, 3, 2, 3])


def test_multi_copy_key_range_and_self():
  # One row whose valid clean keys are slots [1, 3): slot 0 is left padding, slot 3 right padding.
  mask = masks.multi_copy(2, copies=1, copy_length=2, kv_start_B=jnp.array([1]), kv_lengths_B=jnp.array([3]))
  # Padding queries (slots 0 and 3) still see the valid keys of their blocks, and themselves.
  expected = _m("""110000
                   010000
                   011000
                   011100
                   010010
                   010011""")
  np.testing.assert_array_equal(masks.dense(mask, 6, 6)[0], expected)


def test_bad_multi_copy_masks_are_refused():
  with pytest.raises(ValueError, match="multiple of block_size"):
    masks.multi_copy(4, copies=2, copy_length=6)
  with pytest.raises(ValueError, match="only meaningful for multi_copy"):
    masks.AttentionMask("block_causal", 4, copies=2).validate()
  with pytest.raises(ValueError, match="block boundary"):
    masks.dense(masks.multi_copy(4, copies=1, copy_length=4), 10, 10)


@pytest.mark.parametrize("with_range", [False, True])
def test_split_kernel_path_equals_dense(with_range):
  batch, clean, n, copies, heads, groups, dim = 2, 12, 8, 3, 4, 2, 8
  length = clean + copies * n
  kq, kk, kv = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(kq, (batch, length, heads, dim))
  k = jax.random.normal(kk, (batch, length, groups, dim))
  v = jax.random.normal(kv, (batch, length, groups, dim))
  extra = dict(kv_start_B=jnp.array([0, 4]), kv_lengths_B=jnp.array([12, 10])) if with_range else {}
  mask = masks.multi_copy(4, copies=copies, copy_length=n, **extra)
  got = attend(q, k, v, mask, "xla")
  want = attend(q, k, v, masks.explicit(jnp.broadcast_to(masks.dense(mask, length, length),
                                                         (batch, length, length))), "xla")
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
