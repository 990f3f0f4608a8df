"""The model's own modules, rearranged for decoding: full passes, and block passes over a KV cache.

Built inside a jitted function from (graphdef, state). Every computation reuses the model's
submodules (embedding table, Block, Attention.qkv/output, MLP, RMSNorm, lm_head) via nnx.merge,
so a checkpoint that runs in `dice_jax.model` decodes identically here.

Two ways through the layers:
- `full`: lax.scan over the stacked layers with the model's Block (cuDNN attention on GPU); for
  prompts (prefill), recompute-everything decoding and bidirectional models.
- `cached`: one block of queries per row against a preallocated cache. Layers are unrolled so each
  layer's K/V buffers are separate loop-carried arrays that are updated in place
  (dynamic_update_slice) and read directly: a stacked [layers, ...] cache indexed inside a scan
  would be sliced, i.e. copied, every layer of every step. Per-layer weights are sliced (and cast
  to the compute dtype, as the model does inside its matmuls) once, before the decode loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dice_jax import sharding
from dice_jax.model import masks
from dice_jax.model.config import ModelConfig
from dice_jax.sampler import decode_attention

KVCache = tuple[tuple[jax.Array, jax.Array], ...]  # per layer (k, v), each [B, G, S, K]
_ACT = ("batch", "length", "act_embed")
_ACT_HEADS = ("batch", "length", "act_heads", None)


def _cast_matrices(tree, dtype):
  """Weights the model casts to the compute dtype before use (matrices and biases); norms keep theirs."""
  return jax.tree.map(lambda a: a.astype(dtype) if a.ndim >= 2 else a, tree)


class Decoder:
  """Embedding, layers and head of one model, as pure functions of token arrays."""

  def __init__(self, graphdef: nnx.GraphDef, state: nnx.State):
    model = nnx.merge(graphdef, state)
    cfg: ModelConfig = model.config
    self.config = cfg
    self._layer_graphdef, self._stacked = nnx.split(model.layers)
    # As the model does: gather the fsdp-split embedding dim so the lookup partitions cleanly (rows stay
    # split over 'tensor'). Done once per rollout, not per step; cast once (the model casts after the
    # lookup, which is the same numbers).
    self._embed_VxD = sharding.constrain(model.embed[...], ("vocab", None)).astype(cfg.compute_dtype)
    self._final_norm = model.final_norm
    self._head_DxV = (model.embed[...].T if cfg.tie_word_embeddings else model.lm_head[...]).astype(cfg.compute_dtype)
    self._per_layer: list[nnx.State] | None = None

  def embed(self, tokens_BxL: jax.Array) -> jax.Array:
    x = jnp.take(self._embed_VxD, tokens_BxL, axis=0)
    return sharding.constrain(x, _ACT)

  def head(self, x_BxLxD: jax.Array) -> jax.Array:
    """Float32 logits from final hidden states (before the final norm), as Transformer.__call__."""
    x_BxLxD = self._final_norm(x_BxLxD)
    logits = jnp.einsum("bld,dv->blv", x_BxLxD, self._head_DxV, preferred_element_type=jnp.float32)
    return sharding.constrain(logits, ("batch", "length", "act_vocab"))

  def full(self, x_BxLxD: jax.Array, positions_BxL: jax.Array, mask: masks.AttentionMask,
           return_kv: bool = False):
    """All layers over the whole input (the model's Block, scanned); optionally each layer's (k, v)."""
    graphdef = self._layer_graphdef

    def body(x, params):
      x, kv = nnx.merge(graphdef, params)(x, positions_BxL, mask)
      return x, (kv if return_kv else None)

    x_BxLxD, kv = jax.lax.scan(body, x_BxLxD, self._stacked)
    return (x_BxLxD, kv) if return_kv else x_BxLxD

  def prepare_cached(self) -> None:
    """Slice (and cast) the stacked layer weights once; call before the decode loop, outside it."""
    dtype = self.config.compute_dtype
    self._per_layer = [_cast_matrices(jax.tree.map(lambda a, i=i: a[i], self._stacked), dtype)
                       for i in range(self.config.num_layers)]

  def cached(self, x_BxQxD: jax.Array, positions_BxQ: jax.Array, cache: KVCache, write_at: jax.Array,
             start_B: jax.Array, end_B: jax.Array, implementation: str) -> tuple[jax.Array, KVCache]:
    """One block of queries through every layer: store its k/v at slot `write_at`, attend [start, end)."""
    if self._per_layer is None:
      raise RuntimeError("Decoder.prepare_cached() must run before the decode loop")
    new_cache = []
    for params, (k_cache, v_cache) in zip(self._per_layer, cache):
      layer = nnx.merge(self._layer_graphdef, params)
      q, k, v = layer.attn.qkv(layer.input_norm(x_BxQxD), positions_BxQ)
      k_cache = decode_attention.write_cache(k_cache, k, write_at)
      v_cache = decode_attention.write_cache(v_cache, v, write_at)
      o = decode_attention.attend_cache(q, k_cache, v_cache, start_B, end_B, implementation)
      x_BxQxD = sharding.constrain(x_BxQxD + layer.attn.output(sharding.constrain(o, _ACT_HEADS)), _ACT)
      x_BxQxD = sharding.constrain(x_BxQxD + layer.mlp(layer.post_attn_norm(x_BxQxD)), _ACT)
      new_cache.append((k_cache, v_cache))
    return x_BxQxD, tuple(new_cache)

  def fill_cache(self, cache: KVCache, kv_stacked: tuple[jax.Array, jax.Array], at: int = 0) -> KVCache:
    """Store a full pass's per-layer (k, v) ([layers, B, L, G, K]) at slots [at, at + L)."""
    k_all, v_all = kv_stacked
    return tuple((decode_attention.write_cache(kc, k_all[i], at), decode_attention.write_cache(vc, v_all[i], at))
                 for i, (kc, vc) in enumerate(cache))
