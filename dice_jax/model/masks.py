"""Attention masks as a small pytree that the attention layer dispatches on.

Kinds (Q = number of queries, K = number of keys; True = may attend):
- `bidirectional`: every query sees every key (LLaDA, Dream). Optional `kv_lengths_B`: keys at or
  beyond a row's length are padding.
- `causal`: key <= query (Qwen3/LLaMA autoregressive). Q == K.
- `block_causal(block_size)`: a query sees its own block and all earlier blocks
  (key // b <= query // b). SDAR inference and evaluation. Q == K.
- `two_copy(block_size)`: SDAR training on `[noisy x_t | clean x_0]`, each half n = L/2 tokens.
  A noisy query sees its own noisy block and strictly earlier *clean* blocks; a clean query sees
  clean blocks up to its own (block-causal); clean never sees noisy. Positions repeat (0..n-1 twice).
- `explicit(mask_BxQxK)`: any boolean mask, with positions given by the caller. A KV-cached sampler
  attends `[cached prefix | block]` with it (K = prefix + Q).
- `multi_copy(block_size, copies, copy_length)`: the two-copy layout generalised to C noisy copies,
  `[clean (L) | copy 0 (n) | ... | copy C-1 (n)]`, each copy mirroring the clean part's last n slots
  (block-aligned). Clean queries are block-causal over clean keys; a query of copy j in block k sees
  the clean blocks before k and block k of copy j only. TraceRL scores every denoising state of a
  block-diffusion rollout in one pass with it (dice_jax.rl.scoring). Optional per-row key range
  `[kv_start_B, kv_lengths_B)` over the clean slots (left/right padding; copies inherit it).

Which attention kernel each kind takes is decided in dice_jax.model.attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

KINDS = ("bidirectional", "causal", "block_causal", "two_copy", "explicit", "multi_copy")


@struct.dataclass
class AttentionMask:
  """What may attend to what. `kind` and `block_size` are static; arrays are traced."""
  kind: str = struct.field(pytree_node=False)
  block_size: int = struct.field(pytree_node=False, default=0)
  mask_BxQxK: jax.Array | None = None  # explicit only
  kv_lengths_B: jax.Array | None = None  # bidirectional/causal/block_causal: valid keys per row
  # multi_copy only: number of noisy copies C and their length n (static), first valid clean key.
  copies: int = struct.field(pytree_node=False, default=0)
  copy_length: int = struct.field(pytree_node=False, default=0)
  kv_start_B: jax.Array | None = None

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
    if self.kind == "multi_copy":
      if self.block_size < 1 or self.copies < 1 or self.copy_length < 1 or self.copy_length % self.block_size:
        raise ValueError(f"multi_copy needs block_size >= 1, copies >= 1 and a copy_length that is a positive "
                         f"multiple of block_size; got {self.block_size}, {self.copies}, {self.copy_length}")
    elif self.copies or self.copy_length or self.kv_start_B is not None:
      raise ValueError("copies, copy_length and kv_start_B are only meaningful for multi_copy masks")
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


def multi_copy(block_size: int, copies: int, copy_length: int, kv_start_B: jax.Array | None = None,
               kv_lengths_B: jax.Array | None = None) -> AttentionMask:
  return AttentionMask("multi_copy", block_size, kv_lengths_B=kv_lengths_B, copies=copies,
                       copy_length=copy_length, kv_start_B=kv_start_B).validate()


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
  """Positions BxL: 0..L-1, or 0..n-1 twice for the two-copy layout (multi_copy: copies mirror the tail)."""
  if mask.kind == "multi_copy":
    clean = length - mask.copies * mask.copy_length
    pos = jnp.arange(clean, dtype=jnp.int32)
    pos = jnp.concatenate([pos, jnp.tile(pos[clean - mask.copy_length:], mask.copies)])
  elif mask.kind == "two_copy":
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


def multi_copy_parts(mask: AttentionMask, clean_len: int) -> tuple[jax.Array, jax.Array]:
  """The two distinct blocks of a multi_copy mask, as booleans with a leading [B or 1] axis:
  clean queries over clean keys [., L, L], and one copy's queries over [clean | that copy] keys
  [., n, L + n] (the same for every copy). Every query also sees itself, so padding rows keep a key.
  """
  n, bs = mask.copy_length, mask.block_size
  if clean_len < n or (clean_len - n) % bs:
    raise ValueError(f"multi_copy: the copies mirror the last {n} of {clean_len} clean slots, which must "
                     f"start on a block boundary (block_size {bs})")
  slot = jnp.arange(clean_len)
  blocks = slot // bs
  key_ok_BxL = jnp.ones((1, clean_len), jnp.bool_)
  if mask.kv_start_B is not None:
    key_ok_BxL = key_ok_BxL & (slot[None, :] >= mask.kv_start_B[:, None])
  if mask.kv_lengths_B is not None:
    key_ok_BxL = key_ok_BxL & (slot[None, :] < mask.kv_lengths_B[:, None])
  clean = (blocks[None, :] <= blocks[:, None])[None] & key_ok_BxL[:, None, :]
  clean = clean | jnp.eye(clean_len, dtype=jnp.bool_)[None]
  copy_blocks = blocks[clean_len - n:]
  context = (blocks[None, :] < copy_blocks[:, None])[None] & key_ok_BxL[:, None, :]
  own = (copy_blocks[None, :] == copy_blocks[:, None])[None] & key_ok_BxL[:, None, clean_len - n:]
  own = own | jnp.eye(n, dtype=jnp.bool_)[None]
  return clean, jnp.concatenate([context, own], axis=2)


def _dense_multi_copy(mask: AttentionMask, length: int) -> jax.Array:
  c, n = mask.copies, mask.copy_length
  clean_len = length - c * n
  clean, copy = multi_copy_parts(mask, clean_len)
  rows = max(clean.shape[0], copy.shape[0])
  clean = jnp.broadcast_to(clean, (rows, clean_len, clean_len))
  copy = jnp.broadcast_to(copy, (rows, n, clean_len + n))
  out = [jnp.concatenate([clean, jnp.zeros((rows, clean_len, c * n), jnp.bool_)], axis=2)]
  for j in range(c):
    out.append(jnp.concatenate([copy[:, :, :clean_len], jnp.zeros((rows, n, j * n), jnp.bool_),
                                copy[:, :, clean_len:], jnp.zeros((rows, n, (c - 1 - j) * n), jnp.bool_)],
                               axis=2))
  return jnp.concatenate(out, axis=1)


def dense(mask: AttentionMask, q_len: int, k_len: int) -> jax.Array:
  """The mask as booleans of shape [B or 1, Q, K]: the XLA path and reference implementations use it."""
  if mask.kind == "explicit":
    if mask.mask_BxQxK.shape[1:] != (q_len, k_len):
      raise ValueError(f"explicit mask has shape {mask.mask_BxQxK.shape}, queries/keys are {q_len}/{k_len}")
    return mask.mask_BxQxK
  if mask.kind == "multi_copy":
    if q_len != k_len or q_len <= mask.copies * mask.copy_length:
      raise ValueError(f"multi_copy attention needs equal query/key lengths longer than its "
                       f"{mask.copies} x {mask.copy_length} copies, got {q_len}/{k_len}")
    return _dense_multi_copy(mask, q_len)
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
