"""Attention of one block's queries over a preallocated KV cache, reading only the valid keys.

Decode-shaped attention: Q = block_size queries per row against up to S cached keys. Each row sees
exactly the keys in [start_B, end_B) of its cache (left padding before start, not-yet-written or
padding slots from end on), the block's own keys included: they were written into the cache
before this call. Layout [B, G, S, K] (kv heads before time) keeps every (row, kv head) a
contiguous [S, K] matrix, so neither kernel transposes the cache.

- `pallas`: JAX's Triton decode-attention kernel (jax.experimental.pallas.ops.gpu.decode_attention),
  split over the key axis and bounded by [start, end): HBM traffic is the valid keys only, and no
  scores are materialised. Compiled by Triton on GPU; on other backends it runs in Pallas's
  interpreter (slow: for tests of the GPU path).
- `xla`: einsum + mask + softmax over the whole buffer: reads all S slots every step. Any backend.

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

# The Pallas kernel splits the key axis into chunks of this many slots (its parallel grid axis);
# a cache for it holds a multiple of this. Each chunk is read in tiles of _BLOCK_K keys.
PALLAS_SPLIT = 256
_BLOCK_K = 128
_BLOCK_H = 16  # query rows per program (Triton dot needs >= 16)
_CACHE_AXES = ("batch", "act_heads", None, None)


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


def _queries_by_kv_head(q_BxQxHxK: jax.Array, num_kv_heads: int) -> jax.Array:
  b, q, h, k = q_BxQxHxK.shape
  r = h // num_kv_heads
  return q_BxQxHxK.reshape(b, q, num_kv_heads, r, k).transpose(0, 2, 3, 1, 4).reshape(b, num_kv_heads, r * q, k)


def _back_to_queries(o_BxGxNxK: jax.Array, num_queries: int) -> jax.Array:
  b, g, n, k = o_BxGxNxK.shape
  r = n // num_queries
  return o_BxGxNxK.reshape(b, g, r, num_queries, k).transpose(0, 3, 1, 2, 4).reshape(b, num_queries, g * r, k)


def _xla(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B, end_B):
  """Masked softmax attention over the whole buffer, numerics as jax.nn.dot_product_attention."""
  scale = 1.0 / math.sqrt(qg_BxGxNxK.shape[-1])
  scores = jnp.einsum("bgnk,bgsk->bgns", qg_BxGxNxK, k_BxGxSxK, preferred_element_type=jnp.float32) * scale
  slot_S = jnp.arange(k_BxGxSxK.shape[2])
  valid_BxS = (slot_S[None, :] >= start_B[:, None]) & (slot_S[None, :] < end_B[:, None])
  scores = jnp.where(valid_BxS[:, None, None, :], scores, -0.7 * jnp.finfo(jnp.float32).max)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_BxGxSxK.dtype)
  return jnp.einsum("bgns,bgsk->bgnk", probs, v_BxGxSxK)


def _pallas(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B, end_B, *, interpret: bool):
  from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode  # Triton: imported on use
  s, head_dim = k_BxGxSxK.shape[2], k_BxGxSxK.shape[3]
  if s % PALLAS_SPLIT:
    raise ValueError(f"the Pallas decode kernel needs a cache length that is a multiple of {PALLAS_SPLIT}, got {s}")
  one = functools.partial(
      pallas_decode.decode_attn_unbatched, sm_scale=1.0 / math.sqrt(head_dim), block_h=_BLOCK_H,
      block_k=_BLOCK_K, k_splits=s // PALLAS_SPLIT, num_warps=None, num_stages=2, grid=None,
      interpret=interpret, debug=False, return_residuals=False, normalize_output=True)
  per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))  # over kv heads; bounds are per row
  return jax.vmap(per_head)(qg_BxGxNxK, k_BxGxSxK, v_BxGxSxK, start_B.astype(jnp.int32), end_B.astype(jnp.int32))


def attend_cache(q_BxQxHxK: jax.Array, k_BxGxSxK: jax.Array, v_BxGxSxK: jax.Array, start_B: jax.Array,
                 end_B: jax.Array, implementation: str) -> jax.Array:
  """Attention output BxQxHxK of the queries over cache slots [start_B, end_B) of each row."""
  qg = _queries_by_kv_head(q_BxQxHxK, k_BxGxSxK.shape[1])
  if implementation == "xla":
    out = _xla(qg, k_BxGxSxK, v_BxGxSxK, start_B, end_B)
  elif implementation == "pallas":
    kernel = functools.partial(_pallas, interpret=jax.default_backend() != "gpu")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:  # a custom kernel is not partitioned by XLA: map it per shard
      spec = sharding.logical_to_spec(_CACHE_AXES, k_BxGxSxK.shape, mesh)
      row = PartitionSpec(spec[0])
      kernel = jax.shard_map(kernel, in_specs=(spec, spec, spec, row, row), out_specs=spec, check_vma=False)
    out = kernel(qg, k_BxGxSxK, v_BxGxSxK, start_B, end_B)
  else:
    raise ValueError(f"decode attention implementation {implementation!r}; choose xla or pallas")
  return _back_to_queries(out.astype(q_BxQxHxK.dtype), q_BxQxHxK.shape[1])


def init_cache(num_layers: int, batch: int, num_kv_heads: int, length: int, head_dim: int, dtype
               ) -> tuple[tuple[jax.Array, jax.Array], ...]:
  """One (k, v) pair of zeroed [B, G, S, K] buffers per layer, sharded like the attention heads."""
  def zeros():
    return sharding.constrain(jnp.zeros((batch, num_kv_heads, length, head_dim), dtype), _CACHE_AXES)
  return tuple((zeros(), zeros()) for _ in range(num_layers))


def write_cache(cache_BxGxSxK: jax.Array, new_BxQxGxK: jax.Array, at: jax.Array) -> jax.Array:
  """The cache with this call's keys (or values) stored at slots [at, at + Q)."""
  new = jnp.swapaxes(new_BxQxGxK, 1, 2).astype(cache_BxGxSxK.dtype)
  return jax.lax.dynamic_update_slice(cache_BxGxSxK, new, (0, 0, at, 0))
