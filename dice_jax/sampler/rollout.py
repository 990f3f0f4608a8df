"""Rollout: what the sampler did, in generation coordinates (position i = the i-th new token).

The trace. Denoising steps are numbered globally over the whole rollout, 0, 1, ..., num_steps-1:
one step = one model evaluation that may commit tokens (block models' cache-filling passes are not
steps). The whole batch advances in lockstep; a row may commit nothing at some step.

- `commit_step[b, i]`: the step that committed token i of row b (NEVER = int32 max if it was never
  generated: the row had already finished).
- The state step s decoded from is, over the generated region,
      masked_state(tokens, commit_step, s, mask_id) = where(commit_step < s, tokens, mask_id)
  with the prompt (and, for infilling, the suffix) clean around it, in real positions 0, 1, ...
  The sequence is exactly prompt + gen_length (+ suffix) tokens: nothing after it is attended, not
  even the rest of a block model's last block. For block models only the current block and earlier
  ones matter (block-causal attention); every earlier block is complete.
  Its logits at the positions with commit_step == s gave the tokens committed at s, and
  `logprobs` = log_softmax(logits / temperature)[token] there (dice_jax.sampler.policy).
- `block[b, i]`: the denoising block of token i, counted from the row's first generated block.
  Block models align blocks to real positions from 0 (as in training): the first generated block
  of a row with a prompt of length p also holds the prompt's last p % block_size tokens, so
  block[b, i] = (p + i) // block_size - p // block_size. Bidirectional models: i // block_size.
- `commit_rank[b, i]`: index of token i's commit event among the distinct steps at which row b
  committed tokens of that block (0 = first). Within a block, the tokens of rank < r are exactly
  the ones visible at rank r, so a trainer needs at most steps_per_block states per block.

Validity: `valid[b, i]` is True for generated tokens up to and including the row's first EOS.
Tokens after it (the rest of EOS's block, committed with it; later blocks, never generated) are
padding and must be masked out of log-probs and losses; `logprobs` is 0 there. The EOS block's
tokens after EOS stay in `tokens` because its earlier states contained them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from dice_jax.sampler.policy import NEVER


@struct.dataclass
class Rollout:
  tokens: jax.Array  # [B, G] int32: committed tokens; pad_id where never generated
  valid: jax.Array  # [B, G] bool: real response tokens (up to and including the first EOS)
  lengths: jax.Array  # [B] int32: number of valid tokens
  finished: jax.Array  # [B] bool: the row emitted EOS (False: it hit gen_length)
  logprobs: jax.Array  # [B, G] float32: log-prob under the sampling policy; 0 where not valid
  commit_step: jax.Array  # [B, G] int32: global denoising step that committed the token (trace)
  block: jax.Array  # [B, G] int32: denoising block, from the row's first generated block
  commit_rank: jax.Array  # [B, G] int32: rank of the commit event within (row, block); -1 if never
  num_steps: jax.Array  # [] int32: denoising steps taken (commit_step < num_steps)


def masked_state(tokens_BxG: jax.Array, commit_step_BxG: jax.Array, step: int | jax.Array,
                 mask_id: int) -> jax.Array:
  """The generated region as the sampler saw it at the start of denoising step `step`."""
  return jnp.where(commit_step_BxG < step, tokens_BxG, mask_id)


def commit_ranks(commit_step_BxNxQ: jax.Array) -> jax.Array:
  """Dense rank of each commit step among the distinct committed steps of its (row, block)."""
  q = commit_step_BxNxQ.shape[-1]
  cs = commit_step_BxNxQ
  committed = cs != NEVER
  idx = jnp.arange(q)
  same = cs[..., :, None] == cs[..., None, :]  # [.., i, j]
  first_of_value = ~jnp.any(same & (idx[None, :] < idx[:, None]), axis=-1)  # j is first with its value
  counted = committed & first_of_value  # [.., j]
  earlier = cs[..., None, :] < cs[..., :, None]  # value_j < value_i
  rank = jnp.sum(earlier & counted[..., None, :], axis=-1)
  return jnp.where(committed, rank, -1).astype(jnp.int32)


def finish(tokens_BxG: jax.Array, commit_step_BxG: jax.Array, logprob_BxG: jax.Array, block_BxG: jax.Array,
           commit_rank_BxG: jax.Array, num_steps: jax.Array, eos_ids: tuple[int, ...], pad_id: int) -> Rollout:
  """Validity, lengths and padding from the raw per-position record of a finished loop."""
  g = tokens_BxG.shape[1]
  committed = commit_step_BxG != NEVER
  is_eos = committed & jnp.isin(tokens_BxG, jnp.asarray(eos_ids or (-1,), jnp.int32))
  finished_B = jnp.any(is_eos, axis=1)
  first_eos_B = jnp.where(finished_B, jnp.argmax(is_eos, axis=1), g)
  valid = committed & (jnp.arange(g)[None, :] <= first_eos_B[:, None])
  return Rollout(
      tokens=jnp.where(committed, tokens_BxG, pad_id).astype(jnp.int32),
      valid=valid,
      lengths=jnp.sum(valid, axis=1).astype(jnp.int32),
      finished=finished_B,
      logprobs=jnp.where(valid, logprob_BxG, 0.0).astype(jnp.float32),
      commit_step=commit_step_BxG.astype(jnp.int32),
      block=block_BxG.astype(jnp.int32),
      commit_rank=commit_rank_BxG,
      num_steps=num_steps.astype(jnp.int32))
