"""Attention of one pass's fresh queries over a preallocated KV cache, reading only the valid keys.

A pass brings Q fresh tokens (one block, or the finished block and the next one) stored at cache
slots [at, at + Q). Query q of row b sees slots [start_B, ends_BxQ[b, q]): the row's cached prefix
[start, at) (left padding before start is never read) and the fresh tokens before its bound (its
own block, block-causally; slots at or past the row's end are padding). The fresh k/v are written
into the cache by `update_and_attend` before anything reads it. Layout [B, G, S, K] (kv heads
before time) keeps every (row, kv head) a contiguous [S, K] matrix, so nothing transposes the cache.

- `pallas`: JAX's Triton decode-attention kernel (jax.experimental.pallas.ops.gpu.decode_attention)
  over the cached prefix only, bounded by [start, at) and split over the key axis: HBM traffic is
  the valid keys, read once per (row, kv head) for all of its R x Q query rows (block_h covers
  them), and no scores are materialised. It returns unnormalised outputs with their softmax
  statistics, merged here with the fresh keys' part (Q keys, computed densely: each query row may
  have its own bound). Compiled by Triton on GPU; elsewhere it runs in Pallas's interpreter (slow:
  for tests of the GPU path).
- `xla`: einsum + per-query mask + softmax over the whole (updated) buffer: reads all S slots every
  pass. Any backend; the numerics the CPU tests pin.

GQA: the H = G * R query heads of the Q queries form R * Q rows per kv head; query head h uses kv
head h // R, as in jax.nn.dot_product_attention.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from dice_jax import sharding

# The Pallas kernel splits the key axis into chunks of this many slots (its parallel grid axis; the
# (row, kv head) pairs already give thousands of programs, so few, long chunks: fewer partial
# outputs to write and merge); a cache for it holds a multiple of this. Each chunk is read in tiles
# of _BLOCK_K keys.
PALLAS_SPLIT = 512
_BLOCK_K = 128
_CACHE_AXES = ("batch", "act_heads", None, None)
_MASKED = -0.7 * jnp.finfo(jnp.float32).max  # a masked score: finite, so no row is ever NaN


def choose(requested: str) -> str:
  """'pallas' on GPU for 'auto', else 'xla'."""
  if requested == "auto":
    return "pallas" if jax.default_backend() == "gpu" else "xla"
  return requested


def cache_length(canvas_length: int, implementation: str) -> int:
  """Slots to allocate per row for a canvas of this length under this kernel."""
  if implementation == "pallas":
    return -(-canvas_length // PALLAS_SPLIT) * PALLAS_SPLIT
  return canvas_length


def _block_h(rows: int) -> int:
  """Query rows per kernel program: all of a kv head's rows (so its keys are read once), a power of
  two, at least 16 (Triton's dot)."""
  return max(16, 1 << (rows - 1).bit_length())


def _queries_by_kv_head(q_BxQxHxK: jax.Array, num_kv_heads: int) -> jax.Array:
  b, q, h, k = q_BxQxHxK.shape
  r = h // num_kv_heads
  return q_BxQxHxK.reshape(b, q, num_kv_heads, r, k).transpose(0, 2, 3, 1, 4).reshape(b, num_kv_heads, r * q, k)


def _back_to_queries(o_BxGxNxK: jax.Array, num_queries: int) -> jax.Array:
  b, g, n, k = o_BxGxNxK.shape
  r = n // num_queries
  return o_BxGxNxK.reshape(b, g, r, num_queries, k).transpose(0, 3, 1, 2, 4).reshape(b, num_queries, g * r, k)


def _xla(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B, end_BxN):
  """Masked softmax attention over the whole buffer, numerics as jax.nn.dot_product_attention."""
  scale = 1.0 / math.sqrt(qg_BxGxNxK.shape[-1])
  scores = jnp.einsum("bgnk,bgsk->bgns", qg_BxGxNxK, k_BxGxSxK, preferred_element_type=jnp.float32) * scale
  slot_S = jnp.arange(k_BxGxSxK.shape[2])
  valid_BxNxS = (slot_S >= start_B[:, None, None]) & (slot_S < end_BxN[:, :, None])
  scores = jnp.where(valid_BxNxS[:, None], scores, _MASKED)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_BxGxSxK.dtype)
  return jnp.einsum("bgns,bgsk->bgnk", probs, v_BxGxSxK)


def _pallas_prefix(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B, end_B, *, interpret: bool):
  """The kernel over slots [start_B, end_B): unnormalised outputs BxGxNxK and their softmax sums
  and maxima (l, m: BxGxN, float32). A row with no such slot gets o = 0, l = 0, m = float32 min."""
  from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode  # Triton: imported on use
  s, head_dim = k_BxGxSxK.shape[2], k_BxGxSxK.shape[3]
  if s % PALLAS_SPLIT:
    raise ValueError(f"the Pallas decode kernel needs a cache length that is a multiple of {PALLAS_SPLIT}, got {s}")
  one = functools.partial(
      pallas_decode.decode_attn_unbatched, sm_scale=1.0 / math.sqrt(head_dim),
      block_h=_block_h(qg_BxGxNxK.shape[2]), block_k=_BLOCK_K, k_splits=s // PALLAS_SPLIT, num_warps=None,
      num_stages=2, grid=None, interpret=interpret, debug=False, return_residuals=True, normalize_output=False)
  per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))  # over kv heads; bounds are per row
  o, (l, m) = jax.vmap(per_head)(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B.astype(jnp.int32),
                                 end_B.astype(jnp.int32))
  return o, l, m


def _fresh(qg_BxGxNxK, k_BxGxQxK, v_BxGxQxK, valid_BxNxQ):
  """The fresh keys' part, densely (Q keys, a bound per query row), as (o, l, m) in float32."""
  scale = 1.0 / math.sqrt(qg_BxGxNxK.shape[-1])
  scores = jnp.einsum("bgnk,bgqk->bgnq", qg_BxGxNxK, k_BxGxQxK, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(valid_BxNxQ[:, None], scores, _MASKED)
  m = jnp.max(scores, axis=-1)
  p = jnp.exp(scores - m[..., None])
  o = jnp.einsum("bgnq,bgqk->bgnk", p, v_BxGxQxK.astype(jnp.float32))
  return o, jnp.sum(p, axis=-1), m


def _merge(o1, l1, m1, o2, l2, m2):
  """Softmax over the union of two disjoint key sets from each part's (unnormalised o, sum, max)."""
  m = jnp.maximum(m1, m2)
  a1, a2 = jnp.exp(m1 - m), jnp.exp(m2 - m)
  o = o1.astype(jnp.float32) * a1[..., None] + o2 * a2[..., None]
  return o / (l1 * a1 + l2 * a2 + jnp.finfo(jnp.float32).eps)[..., None]


def _pallas(qg_BxGxNxK, k_new_BxGxQxK, v_new_BxGxQxK, k_BxGxSxK, v_BxGxSxK, at, start_B, end_BxN):
  """Kernel over the cached prefix [start, at) (one bound per row: min(at, its lowest query bound)),
  merged with the fresh keys at [at, at + Q) under each query row's own bound."""
  kernel = functools.partial(_pallas_prefix, interpret=jax.default_backend() != "gpu")
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.size > 1:  # a custom kernel is not partitioned by XLA: map it per shard
    spec = sharding.logical_to_spec(_CACHE_AXES, k_BxGxSxK.shape, mesh)
    row, stats = PartitionSpec(spec[0]), PartitionSpec(spec[0], spec[1], None)
    kernel = jax.shard_map(kernel, in_specs=(spec, spec, spec, row, row), out_specs=(spec, stats, stats),
                           check_vma=False)
  prefix_end_B = jnp.minimum(at, jnp.min(end_BxN, axis=1))
  o_c, l_c, m_c = kernel(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B, prefix_end_B)
  slot_Q = at + jnp.arange(k_new_BxGxQxK.shape[2])
  valid_BxNxQ = (slot_Q >= start_B[:, None, None]) & (slot_Q < end_BxN[:, :, None])
  o_f, l_f, m_f = _fresh(qg_BxGxNxK, k_new_BxGxQxK, v_new_BxGxQxK, valid_BxNxQ)
  return _merge(o_c, l_c, m_c, o_f, l_f, m_f)


def update_and_attend(q_BxQxHxK: jax.Array, k_BxQxGxK: jax.Array, v_BxQxGxK: jax.Array, k_cache_BxGxSxK: jax.Array,
                      v_cache_BxGxSxK: jax.Array, at: jax.Array, start_B: jax.Array, ends_BxQ: jax.Array,
                      implementation: str) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Store the fresh k/v at slots [at, at + Q), then attend: query q of row b over [start_B[b], ends_BxQ[b, q]).

  Returns (output BxQxHxK, k cache, v cache). Bounds past at + Q are not allowed (those slots hold
  stale keys).
  """
  k_cache_BxGxSxK = write_cache(k_cache_BxGxSxK, k_BxQxGxK, at)
  v_cache_BxGxSxK = write_cache(v_cache_BxGxSxK, v_BxQxGxK, at)
  num_queries = q_BxQxHxK.shape[1]
  qg = _queries_by_kv_head(q_BxQxHxK, k_cache_BxGxSxK.shape[1])
  end_BxN = jnp.tile(ends_BxQ, (1, qg.shape[2] // num_queries))  # row n = r * Q + q has query q's bound
  if implementation == "xla":
    out = _xla(qg, k_cache_BxGxSxK, v_cache_BxGxSxK, start_B, end_BxN)
  elif implementation == "pallas":
    k_new, v_new = (jnp.swapaxes(t, 1, 2).astype(k_cache_BxGxSxK.dtype) for t in (k_BxQxGxK, v_BxQxGxK))
    out = _pallas(qg, k_new, v_new, k_cache_BxGxSxK, v_cache_BxGxSxK, at, start_B, end_BxN)
  else:
    raise ValueError(f"decode attention implementation {implementation!r}; choose xla or pallas")
  return _back_to_queries(out.astype(q_BxQxHxK.dtype), num_queries), k_cache_BxGxSxK, v_cache_BxGxSxK


def init_cache(num_layers: int, batch: int, num_kv_heads: int, length: int, head_dim: int, dtype
               ) -> tuple[tuple[jax.Array, jax.Array], ...]:
  """One (k, v) pair of zeroed [B, G, S, K] buffers per layer, sharded like the attention heads."""
  def zeros():
    return sharding.constrain(jnp.zeros((batch, num_kv_heads, length, head_dim), dtype), _CACHE_AXES)
  return tuple((zeros(), zeros()) for _ in range(num_layers))


def write_cache(cache_BxGxSxK: jax.Array, new_BxQxGxK: jax.Array, at: int | jax.Array) -> jax.Array:
  """The cache with this call's keys (or values) stored at slots [at, at + Q)."""
  new = jnp.swapaxes(new_BxQxGxK, 1, 2).astype(cache_BxGxSxK.dtype)
  return jax.lax.dynamic_update_slice(cache_BxGxSxK, new, (0, 0, at, 0))
