"""Attention masks (DESIGN section 4) as a small pytree that the attention layer dispatches on.

Kinds (Q = number of queries, K = number of keys; True = may attend):
- `bidirectional`: every query sees every key (LLaDA, Dream). Optional `kv_lengths_B`: keys at or
  beyond a row's length are padding.
- `causal`: key <= query (Qwen3/LLaMA autoregressive). Q == K.
- `block_causal(block_size)`: a query sees its own block and all earlier blocks
  (key // b <= query // b). SDAR inference and evaluation. Q == K.
- `two_copy(block_size)`: SDAR training on `[noisy x_t | clean x_0]`, each half n = L/2 tokens.
  A noisy query sees its own noisy block and strictly earlier *clean* blocks; a clean query sees
  clean blocks up to its own (block-causal); clean never sees noisy. Positions repeat (0..n-1 twice).
- `explicit(mask_BxQxK)`: any boolean mask, with positions given by the caller. TraceRL re-scores
  many denoising states in one pass with it; a KV-cached sampler attends `[cached prefix | block]`
  with it (K = prefix + Q).

Which attention kernel each kind takes is decided in dice_jax.model.attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

KINDS = ("bidirectional", "causal", "block_causal", "two_copy", "explicit")


@struct.dataclass
class AttentionMask:
  """What may attend to what. `kind` and `block_size` are static; arrays are traced."""
  kind: str = struct.field(pytree_node=False)
  block_size: int = struct.field(pytree_node=False, default=0)
  mask_BxQxK: jax.Array | None = None  # explicit only
  kv_lengths_B: jax.Array | None = None  # bidirectional/causal/block_causal: valid keys per row

  def validate(self) -> AttentionMask:
    """Raise on inconsistent fields (not in __post_init__: jax rebuilds pytrees with placeholders)."""
    if self.kind not in KINDS:
      raise ValueError(f"attention mask kind {self.kind!r}; choose one of {KINDS}")
    if self.kind in ("block_causal", "two_copy") and self.block_size < 1:
      raise ValueError(f"{self.kind} attention needs block_size >= 1, got {self.block_size}")
    if (self.kind == "explicit") != (self.mask_BxQxK is not None):
      raise ValueError("mask_BxQxK is required for, and only for, the explicit kind")
    if self.kv_lengths_B is not None and self.kind in ("two_copy", "explicit"):
      raise ValueError(f"kv_lengths_B is not supported with {self.kind} masks; fold padding into the mask")
    return self


def bidirectional(kv_lengths_B: jax.Array | None = None) -> AttentionMask:
  return AttentionMask("bidirectional", kv_lengths_B=kv_lengths_B).validate()


def causal(kv_lengths_B: jax.Array | None = None) -> AttentionMask:
  return AttentionMask("causal", kv_lengths_B=kv_lengths_B).validate()


def block_causal(block_size: int, kv_lengths_B: jax.Array | None = None) -> AttentionMask:
  return AttentionMask("block_causal", block_size, kv_lengths_B=kv_lengths_B).validate()


def two_copy(block_size: int) -> AttentionMask:
  return AttentionMask("two_copy", block_size).validate()


def explicit(mask_BxQxK: jax.Array) -> AttentionMask:
  if mask_BxQxK.ndim != 3 or mask_BxQxK.dtype != jnp.bool_:
    raise ValueError(f"explicit mask must be boolean BxQxK, got {mask_BxQxK.dtype}{mask_BxQxK.shape}")
  return AttentionMask("explicit", mask_BxQxK=mask_BxQxK)


def as_mask(attention: str | AttentionMask, block_size: int = 0) -> AttentionMask:
  """A mask from a kind name (block kinds take the model's block_size) or an AttentionMask."""
  if isinstance(attention, AttentionMask):
    return attention.validate()
  if attention in ("block_causal", "two_copy"):
    if block_size < 1:
      raise ValueError(f"attention={attention!r} needs a model with block_size >= 1 (this one has {block_size})")
    return AttentionMask(attention, block_size).validate()
  if attention in ("bidirectional", "causal"):
    return AttentionMask(attention)
  raise ValueError(f"attention={attention!r}; choose one of {KINDS[:4]} or pass an AttentionMask")


def default_positions(mask: AttentionMask, batch: int, length: int) -> jax.Array:
  """Positions BxL: 0..L-1, or 0..n-1 twice for the two-copy layout."""
  if mask.kind == "two_copy":
    if length % 2:
      raise ValueError(f"two_copy input must have even length [noisy | clean], got {length}")
    pos = jnp.tile(jnp.arange(length // 2, dtype=jnp.int32), 2)
  else:
    pos = jnp.arange(length, dtype=jnp.int32)
  return jnp.broadcast_to(pos, (batch, length))


def _block_causal_QxK(n: int, block_size: int) -> jax.Array:
  blocks = jnp.arange(n) // block_size
  return blocks[None, :] <= blocks[:, None]


def two_copy_noisy_QxK(n: int, block_size: int) -> jax.Array:
  """Rows of the two-copy mask for the n noisy queries over all 2n keys [noisy | clean]."""
  blocks = jnp.arange(n) // block_size
  same_noisy_block = blocks[None, :] == blocks[:, None]
  earlier_clean_block = blocks[None, :] < blocks[:, None]
  return jnp.concatenate([same_noisy_block, earlier_clean_block], axis=1)


def dense(mask: AttentionMask, q_len: int, k_len: int) -> jax.Array:
  """The mask as booleans of shape [B or 1, Q, K]: the XLA path and reference implementations use it."""
  if mask.kind == "explicit":
    if mask.mask_BxQxK.shape[1:] != (q_len, k_len):
      raise ValueError(f"explicit mask has shape {mask.mask_BxQxK.shape}, queries/keys are {q_len}/{k_len}")
    return mask.mask_BxQxK
  if mask.kind != "bidirectional" and q_len != k_len:
    raise ValueError(f"{mask.kind} attention needs as many queries as keys ({q_len} != {k_len}); "
                     "use an explicit mask to attend a cached prefix")
  if mask.kind == "bidirectional":
    m = jnp.ones((q_len, k_len), jnp.bool_)
  elif mask.kind == "causal":
    m = jnp.tril(jnp.ones((q_len, k_len), jnp.bool_))
  elif mask.kind == "block_causal":
    m = _block_causal_QxK(q_len, mask.block_size)
  else:  # two_copy
    if q_len % 2:
      raise ValueError(f"two_copy attention needs an even length [noisy | clean], got {q_len}")
    n = q_len // 2
    clean = jnp.concatenate([jnp.zeros((n, n), jnp.bool_), _block_causal_QxK(n, mask.block_size)], axis=1)
    m = jnp.concatenate([two_copy_noisy_QxK(n, mask.block_size), clean], axis=0)
  m = m[None]
  if mask.kv_lengths_B is not None:
    m = m & (jnp.arange(k_len)[None, None, :] < mask.kv_lengths_B[:, None, None])
  return m
