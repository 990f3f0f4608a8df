"""The model's own modules, rearranged for decoding: full passes, and block passes over a KV cache.

Built inside a jitted function from (graphdef, state). Every computation reuses the model's
submodules (embedding table, Block, Attention.qkv/output, MLP, RMSNorm, lm_head) via nnx.merge,
so a checkpoint that runs in `dice_jax.model` decodes identically here.

Two ways through the layers:
- `full`: lax.scan over the stacked layers with the model's Block (cuDNN attention on GPU); for
  prompts (prefill), recompute-everything decoding and bidirectional models.
- `cached`: one pass of fresh tokens per row (a block, or a finished block and the next one)
  against a preallocated cache. Layers are unrolled so each layer's K/V buffers are separate
  loop-carried arrays that are updated in place (dynamic_update_slice) and read directly: a stacked
  [layers, ...] cache indexed inside a scan would be sliced, i.e. copied, every layer of every step.
  Its weights are prepared once, before the decode loop (`prepare_cached`): sliced per layer, cast
  to the compute dtype as the model does inside its matmuls, and merged so that a layer runs two
  wide matmuls instead of five narrow ones (q/k/v as [D, G, R + 2, K]: each kv head's R query heads
  then its k and v, so a 'tensor' split of the kv heads splits all three alike; gate/up as
  [D, 2, F]). Decode passes are small-M matmuls (batch x 4 or 8 tokens), where a wide N fills the
  GPU better and halves the kernel launches. The arithmetic is the model's (Attention.qkv, MLP).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dice_jax import sharding
from dice_jax.model import masks
from dice_jax.model.config import ModelConfig
from dice_jax.model.layers import apply_rope, rms_norm, rope_tables
from dice_jax.sampler import decode_attention

KVCache = tuple[tuple[jax.Array, jax.Array], ...]  # per layer (k, v), each [B, G, S, K]
_ACT = ("batch", "length", "act_embed")
_ACT_HEADS = ("batch", "length", "act_heads", None)


class _LayerWeights(NamedTuple):
  """One layer's decode weights (see the module docstring); norms keep their own dtype."""
  input_norm_D: jax.Array
  post_attn_norm_D: jax.Array
  qkv_DxGxCxK: jax.Array  # C = R + 2: the kv head's R query heads, then its k, then its v
  qkv_bias_GxCxK: jax.Array | None
  q_norm_K: jax.Array | None
  k_norm_K: jax.Array | None
  o_HxKxD: jax.Array
  gate_up_Dx2xF: jax.Array
  down_FxD: jax.Array


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
    self._per_layer: list[_LayerWeights] | None = None

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
    """Slice, cast and merge the stacked layer weights once; call before the decode loop, outside it."""
    cfg, dt = self.config, self.config.compute_dtype
    g, r = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads
    blocks = nnx.merge(self._layer_graphdef, self._stacked)
    attn, mlp = blocks.attn, blocks.mlp

    def merged_qkv(q, k, v):  # q [.., H, K] (head h = g * R + r), k/v [.., G, K] -> [.., G, R + 2, K]
      q = q.reshape(*q.shape[:-2], g, r, q.shape[-1])
      return jnp.concatenate([q, k[..., None, :], v[..., None, :]], axis=-2).astype(dt)

    def layer(i: int) -> _LayerWeights:
      qkv = merged_qkv(attn.q_proj[i], attn.k_proj[i], attn.v_proj[i])
      bias = merged_qkv(attn.q_bias[i], attn.k_bias[i], attn.v_bias[i]) if cfg.qkv_bias else None
      return _LayerWeights(
          input_norm_D=blocks.input_norm.weight[i], post_attn_norm_D=blocks.post_attn_norm.weight[i],
          qkv_DxGxCxK=sharding.constrain(qkv, ("embed", "kv_heads", None, "head_dim")), qkv_bias_GxCxK=bias,
          q_norm_K=attn.q_norm.weight[i] if cfg.qk_norm else None,
          k_norm_K=attn.k_norm.weight[i] if cfg.qk_norm else None,
          o_HxKxD=attn.o_proj[i].astype(dt),
          gate_up_Dx2xF=sharding.constrain(jnp.stack([mlp.gate_proj[i], mlp.up_proj[i]], axis=1).astype(dt),
                                           ("embed", None, "mlp")),
          down_FxD=mlp.down_proj[i].astype(dt))

    self._per_layer = [layer(i) for i in range(cfg.num_layers)]

  def _qkv(self, w: _LayerWeights, x_BxQxD: jax.Array, positions_BxQ: jax.Array):
    """Attention.qkv with the merged projection: q BxQxHxK, k and v BxQxGxK, normalised and rotated."""
    cfg = self.config
    b, q_len = x_BxQxD.shape[:2]
    qkv = jnp.einsum("bld,dgck->blgck", x_BxQxD, w.qkv_DxGxCxK)
    if w.qkv_bias_GxCxK is not None:
      qkv = qkv + w.qkv_bias_GxCxK
    r = qkv.shape[3] - 2
    q, k, v = qkv[:, :, :, :r].reshape(b, q_len, -1, cfg.head_dim), qkv[:, :, :, r], qkv[:, :, :, r + 1]
    if cfg.qk_norm:
      q, k = rms_norm(q, w.q_norm_K, cfg.rms_norm_eps), rms_norm(k, w.k_norm_K, cfg.rms_norm_eps)
    cos, sin = rope_tables(positions_BxQ, cfg.head_dim, cfg.rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return tuple(sharding.constrain(t, _ACT_HEADS) for t in (q, k, v))

  def _mlp(self, w: _LayerWeights, x_BxQxD: jax.Array) -> jax.Array:
    """The model's SwiGLU with gate and up in one matmul."""
    gate_up = jnp.einsum("bld,dtf->bltf", x_BxQxD, w.gate_up_Dx2xF)
    h_BxQxF = sharding.constrain(jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1], ("batch", "length", "act_mlp"))
    return jnp.einsum("blf,fd->bld", h_BxQxF, w.down_FxD)

  def cached(self, x_BxQxD: jax.Array, positions_BxQ: jax.Array, cache: KVCache, at: jax.Array,
             start_B: jax.Array, ends_BxQ: jax.Array, implementation: str) -> tuple[jax.Array, KVCache]:
    """Fresh tokens through every layer: store their k/v at slots [at, at + Q); token q of row b
    attends slots [start_B[b], ends_BxQ[b, q]) (see decode_attention.update_and_attend)."""
    if self._per_layer is None:
      raise RuntimeError("Decoder.prepare_cached() must run before the decode loop")
    eps = self.config.rms_norm_eps
    new_cache = []
    for w, (k_cache, v_cache) in zip(self._per_layer, cache):
      q, k, v = self._qkv(w, rms_norm(x_BxQxD, w.input_norm_D, eps), positions_BxQ)
      o, k_cache, v_cache = decode_attention.update_and_attend(q, k, v, k_cache, v_cache, at, start_B, ends_BxQ,
                                                               implementation)
      o = sharding.constrain(o, _ACT_HEADS)
      x_BxQxD = sharding.constrain(x_BxQxD + jnp.einsum("blhk,hkd->bld", o, w.o_HxKxD), _ACT)
      x_BxQxD = sharding.constrain(x_BxQxD + self._mlp(w, rms_norm(x_BxQxD, w.post_attn_norm_D, eps)), _ACT)
      new_cache.append((k_cache, v_cache))
    return x_BxQxD, tuple(new_cache)

  def fill_cache(self, cache: KVCache, kv_stacked: tuple[jax.Array, jax.Array], at: int = 0) -> KVCache:
    """Store a full pass's per-layer (k, v) ([layers, B, L, G, K]) at slots [at, at + L)."""
    k_all, v_all = kv_stacked
    return tuple((decode_attention.write_cache(kc, k_all[i], at), decode_attention.write_cache(vc, v_all[i], at))
                 for i, (kc, vc) in enumerate(cache))
