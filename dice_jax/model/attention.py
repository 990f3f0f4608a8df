"""Grouped-query self-attention, split so that a KV cache plugs in without rewriting it.

    q, k, v = attn.qkv(x_BxLxD, positions_BxL)     # projections, q/k RMSNorm, RoPE at given positions
    o = attend(q, k_all, v_all, mask, impl)         # scores + softmax only; keys may include a cache
    y_BxLxD = attn.output(o)

`Attention.__call__` runs the three with an optional `kv_prefix` (keys/values computed earlier,
already rotated) concatenated in front of this call's keys, and returns this call's (k, v) so a
sampler can append them to its cache. The mask then spans [prefix | new] keys (an explicit mask).

Kernels (`attend`), per mask kind and `implementation`:
- bidirectional: cuDNN flash with no mask (or cuDNN's native padding mask for kv_lengths).
- causal: cuDNN flash with its native (padding-)causal mask (skips the upper triangle).
- block_causal, two_copy, multi_copy, implementation "pallas" (what "auto" picks on a GPU in
  bf16/f16): block-sparse flash attention (dice_jax.model.flash_attention), the mask given by block
  indices: only tiles holding an allowed pair are computed, no L x L array exists forward or
  backward. Two-copy: ~n^2 query-key pairs of the 2n x 2n square instead of 3n^2.
- block_causal, implementation "cudnn": cuDNN flash with the mask as a dense [1,1,L,L] bias (fused,
  but no block skipping and an extra bias read: cuDNN has no block-causal mask type).
- two_copy, "cudnn": two cuDNN calls: clean queries over clean keys (block-causal bias, n x n) and
  noisy queries over [noisy | clean] keys (bias n x 2n), i.e. 3/4 of the dense 2-copy cost.
- explicit: cuDNN flash with the boolean mask as a [B,1,Q,K] bias.
- multi_copy ([clean L | C copies of n]), "cudnn": clean queries over clean keys (block-causal,
  L x L), then all copies at once with the copies folded into the batch: each copy's n queries over
  [clean | own copy] keys (n x (L + n)); clean keys/values are repeated per copy. Scores per head:
  L^2 + C n (L + n) instead of the dense (L + C n)^2, masks [B,1,L,L] and [B,1,n,L+n].
On CPU and TPU "auto" takes XLA's dot_product_attention for every kind (scores materialised; fine
for tests and small shapes; no Pallas splash kernel yet); "pallas" there runs the block-sparse
kernel in Pallas's interpreter (slow: for tests). On GPU, XLA attention measured ~2x slower than
cuDNN (../shared/device/README.md), so "auto" never takes it silently: it logs a warning saying
why (e.g. float32 compute); "cudnn" and "pallas" raise instead when they cannot run.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from dice_jax.model import flash_attention, masks
from dice_jax.model.config import ModelConfig
from dice_jax.model.layers import DENSE_INIT, RMSNorm, apply_rope, make_param, rope_tables
from dice_jax.sharding import constrain

_ACT_HEADS = ("batch", "length", "act_heads", None)


@functools.cache
def _log_once(level: int, message: str) -> None:
  logging.log(level, message)


def choose_implementation(requested: str, dtype: jnp.dtype, head_dim: int, mask_kind: str | None = None) -> str:
  """'pallas', 'cudnn' or 'xla' for this backend/dtype/mask kind; never a silent downgrade on GPU."""
  backend = jax.default_backend()
  if requested == "xla":
    if backend == "gpu":
      _log_once(logging.WARNING, "attention_impl='xla' on GPU: scores are materialised, ~2x slower than cuDNN")
    return "xla"
  if mask_kind in flash_attention.BLOCK_KINDS and requested in ("auto", "pallas"):
    problems = flash_attention.unsupported_settings(dtype, head_dim, strict=requested == "pallas")
    if backend != "gpu" and requested == "auto":
      problems.append(f"backend is {backend}")
    elif backend == "gpu" and not problems and flash_attention.self_check():
      problems.append(flash_attention.self_check())
    if not problems:
      if backend != "gpu":
        _log_once(logging.WARNING, f"attention_impl='pallas' on {backend}: the block-sparse kernel runs in Pallas's "
                  "interpreter (slow; meant for tests)")
      return "pallas"
    if requested == "pallas":
      raise ValueError(f"attention_impl='pallas' is impossible here: {'; '.join(problems)}")
    if backend == "gpu":
      _log_once(logging.WARNING, f"block-sparse attention unavailable for {mask_kind} ({'; '.join(problems)}): "
                "using cuDNN with a dense bias")
  problems = []
  if backend != "gpu":
    problems.append(f"backend is {backend}")
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    problems.append(f"compute dtype is {jnp.dtype(dtype).name} (cuDNN flash needs bfloat16 or float16)")
  if head_dim % 8 or head_dim > 256:
    problems.append(f"head_dim {head_dim} (cuDNN needs a multiple of 8, at most 256)")
  if not problems:
    return "cudnn"
  if requested == "cudnn":
    raise ValueError(f"attention_impl='cudnn' is impossible here: {'; '.join(problems)}")
  if backend == "gpu":
    _log_once(logging.WARNING, f"cuDNN attention unavailable ({'; '.join(problems)}): using XLA attention, "
              "which materialises scores and is ~2x slower")
  return "xla"


def attend(q_BxQxHxK: jax.Array, k_BxSxGxK: jax.Array, v_BxSxGxK: jax.Array, mask: masks.AttentionMask,
           implementation: str) -> jax.Array:
  """Softmax(q k^T / sqrt(K) + mask) v for grouped-query heads (H a multiple of G)."""
  q_len, k_len = q_BxQxHxK.shape[1], k_BxSxGxK.shape[1]
  _log_once(logging.INFO, f"attention mask={mask.kind} -> {implementation}")
  if implementation == "pallas":
    if mask.kind in flash_attention.BLOCK_KINDS:
      return flash_attention.flash_attention(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, mask)
    implementation = "cudnn" if jax.default_backend() == "gpu" else "xla"  # kinds cuDNN masks natively
  dpa = functools.partial(jax.nn.dot_product_attention, implementation=implementation)
  lengths = None if mask.kv_lengths_B is None else mask.kv_lengths_B.astype(jnp.int32)
  if mask.kind == "bidirectional":
    return dpa(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, key_value_seq_lengths=lengths)
  if mask.kind == "causal":
    if q_len != k_len:
      raise ValueError(f"causal attention needs as many queries as keys ({q_len} != {k_len})")
    return dpa(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, is_causal=True, key_value_seq_lengths=lengths)
  if mask.kind == "two_copy":
    n = q_len // 2
    if q_len != k_len or q_len % 2:
      raise ValueError(f"two_copy attention needs equal, even query/key lengths, got {q_len}/{k_len}")
    noisy_mask = masks.two_copy_noisy_QxK(n, mask.block_size)[None, None]
    clean_mask = masks.dense(masks.block_causal(mask.block_size), n, n)[:, None]
    out_noisy = dpa(q_BxQxHxK[:, :n], k_BxSxGxK, v_BxSxGxK, mask=noisy_mask)
    out_clean = dpa(q_BxQxHxK[:, n:], k_BxSxGxK[:, n:], v_BxSxGxK[:, n:], mask=clean_mask)
    return jnp.concatenate([out_noisy, out_clean], axis=1)
  if mask.kind == "multi_copy":
    return _attend_multi_copy(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, mask, dpa)
  return dpa(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, mask=masks.dense(mask, q_len, k_len)[:, None])


def _attend_multi_copy(q_BxQxHxK, k_BxSxGxK, v_BxSxGxK, mask: masks.AttentionMask, dpa) -> jax.Array:
  """The multi_copy kind without materialising its (C+1)L x (C+1)L mask (see the module docstring)."""
  batch, q_len, heads, dim = q_BxQxHxK.shape
  c, n = mask.copies, mask.copy_length
  clean_len = q_len - c * n
  if q_len != k_BxSxGxK.shape[1] or clean_len < n:
    raise ValueError(f"multi_copy attention needs equal query/key lengths holding a clean part of at least "
                     f"{n} plus {c} x {n} copies, got {q_len}/{k_BxSxGxK.shape[1]}")
  clean_mask, copy_mask = masks.multi_copy_parts(mask, clean_len)
  out_clean = dpa(q_BxQxHxK[:, :clean_len], k_BxSxGxK[:, :clean_len], v_BxSxGxK[:, :clean_len],
                  mask=clean_mask[:, None])

  def per_copy(x):  # [B, C*n, ...] -> [B*C, n, ...]: row b, copy j -> b*C + j
    return x[:, clean_len:].reshape(batch * c, n, *x.shape[2:])

  def with_context(x):  # [B*C, L + n, ...]: the row's clean keys before each copy's own
    return jnp.concatenate([jnp.repeat(x[:, :clean_len], c, axis=0), per_copy(x)], axis=1)

  copy_mask = jnp.repeat(copy_mask, c, axis=0) if copy_mask.shape[0] > 1 else copy_mask
  out_copies = dpa(per_copy(q_BxQxHxK), with_context(k_BxSxGxK), with_context(v_BxSxGxK), mask=copy_mask[:, None])
  return jnp.concatenate([out_clean, out_copies.reshape(batch, c * n, heads, dim)], axis=1)


class Attention(nnx.Module):
  """q/k/v/o projections stored per head ([D, H, K], [H, K, D]) so heads shard over 'tensor'."""

  def __init__(self, config: ModelConfig, *, layers: int | None = None, rngs: nnx.Rngs):
    d, h, g, k = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    pdt = config.weight_dtype
    self.config = config
    self.q_proj = make_param(rngs, DENSE_INIT, (d, h, k), ("embed", "q_heads", "head_dim"), pdt, layers)
    self.k_proj = make_param(rngs, DENSE_INIT, (d, g, k), ("embed", "kv_heads", "head_dim"), pdt, layers)
    self.v_proj = make_param(rngs, DENSE_INIT, (d, g, k), ("embed", "kv_heads", "head_dim"), pdt, layers)
    self.o_proj = make_param(rngs, DENSE_INIT, (h, k, d), ("q_heads", "head_dim", "embed"), pdt, layers)
    if config.qkv_bias:
      zeros = nnx.initializers.zeros
      self.q_bias = make_param(rngs, zeros, (h, k), ("q_heads", "head_dim"), pdt, layers)
      self.k_bias = make_param(rngs, zeros, (g, k), ("kv_heads", "head_dim"), pdt, layers)
      self.v_bias = make_param(rngs, zeros, (g, k), ("kv_heads", "head_dim"), pdt, layers)
    if config.qk_norm:
      self.q_norm = RMSNorm(k, config.rms_norm_eps, param_dtype=pdt, layers=layers, rngs=rngs)
      self.k_norm = RMSNorm(k, config.rms_norm_eps, param_dtype=pdt, layers=layers, rngs=rngs)

  def qkv(self, x_BxLxD: jax.Array, positions_BxL: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Projected, normalised and rotated q (BxLxHxK) and k, v (BxLxGxK) at the given positions."""
    cfg, dt = self.config, self.config.compute_dtype
    q = jnp.einsum("bld,dhk->blhk", x_BxLxD, self.q_proj[...].astype(dt))
    k = jnp.einsum("bld,dgk->blgk", x_BxLxD, self.k_proj[...].astype(dt))
    v = jnp.einsum("bld,dgk->blgk", x_BxLxD, self.v_proj[...].astype(dt))
    if cfg.qkv_bias:
      q, k, v = q + self.q_bias[...].astype(dt), k + self.k_bias[...].astype(dt), v + self.v_bias[...].astype(dt)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = rope_tables(positions_BxL, cfg.head_dim, cfg.rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (constrain(t, _ACT_HEADS) for t in (q, k, v))
    return checkpoint_name(q, "query"), checkpoint_name(k, "key"), checkpoint_name(v, "value")

  def output(self, o_BxLxHxK: jax.Array) -> jax.Array:
    y = jnp.einsum("blhk,hkd->bld", o_BxLxHxK, self.o_proj[...].astype(self.config.compute_dtype))
    return checkpoint_name(y, "attn_proj")

  def __call__(self, x_BxLxD: jax.Array, positions_BxL: jax.Array, mask: masks.AttentionMask,
               kv_prefix: tuple[jax.Array, jax.Array] | None = None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Self-attention over [kv_prefix | this call's tokens]; returns (y_BxLxD, (k, v) of this call)."""
    q, k, v = self.qkv(x_BxLxD, positions_BxL)
    k_all, v_all = k, v
    if kv_prefix is not None:
      k_all = jnp.concatenate([kv_prefix[0].astype(k.dtype), k], axis=1)
      v_all = jnp.concatenate([kv_prefix[1].astype(v.dtype), v], axis=1)
    impl = choose_implementation(self.config.attention_impl, q.dtype, self.config.head_dim, mask.kind)
    o = checkpoint_name(constrain(attend(q, k_all, v_all, mask, impl), _ACT_HEADS), "attn_out")
    return self.output(o), (k, v)
