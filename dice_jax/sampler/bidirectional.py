"""Fully bidirectional models (LLaDA, Dream): semi-autoregressive blocks over a fixed canvas.

Canvas of row r: [prompt (p_r) | gen_length masks | suffix (s_r) | padding], right-padded, with
positions 0..L-1 and padding removed from attention by the kernel's own key-length mask (cuDNN's
padding mask on GPU). The masked middle is decoded in blocks of `block_size`, left to right; each
denoising step recomputes the whole canvas (every token sees every other, so no cache is exact),
samples the current block and commits by rule (low-confidence remasking: the least confident
tokens stay masked). Tokens outside the middle are clamped: the loop only ever writes middle slots.
With a suffix this is true infilling: the middle attends to the text after it.
Dream-style models (logits_shift) predict slot i from the hidden state at i - 1.
A row is finished once a block it completed contains an EOS; the rest of its middle stays unwritten.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from dice_jax.model import masks
from dice_jax.sampler import policy
from dice_jax.sampler.config import Resolved, SamplerConfig
from dice_jax.sampler.decoder import Decoder
from dice_jax.sampler.policy import NEVER
from dice_jax.sampler.rollout import Rollout, commit_ranks, finish


@struct.dataclass
class CanvasState:
  canvas_BxL: jax.Array
  commit_step_BxL: jax.Array
  logprob_BxL: jax.Array
  done_B: jax.Array
  block: jax.Array  # block of the middle being decoded
  block_step: jax.Array
  step: jax.Array


def make_canvas(prompt_BxP, prompt_lengths_B, suffix_BxS, suffix_lengths_B, gen_length: int, mask_id: int,
                pad_id: int, extra: int) -> tuple[jax.Array, jax.Array]:
  """(canvas BxL, valid length B): [prompt | masks | suffix | padding], L = P + G + S + extra."""
  width, sfx_width = prompt_BxP.shape[1], suffix_BxS.shape[1]
  length = width + gen_length + sfx_width + extra
  slot = jnp.arange(length)[None, :]
  p, s = prompt_lengths_B[:, None], suffix_lengths_B[:, None]
  in_prompt, in_gen = slot < p, (slot >= p) & (slot < p + gen_length)
  in_suffix = (slot >= p + gen_length) & (slot < p + gen_length + s)
  batch_shape = (prompt_BxP.shape[0], length)
  prompt_part = jnp.take_along_axis(prompt_BxP, jnp.broadcast_to(jnp.clip(slot, 0, width - 1), batch_shape), axis=1)
  sfx_idx = jnp.clip(slot - p - gen_length, 0, max(sfx_width - 1, 0))
  suffix_part = jnp.take_along_axis(suffix_BxS, sfx_idx, axis=1) if sfx_width else jnp.zeros_like(slot)
  canvas = jnp.where(in_prompt, prompt_part, jnp.where(in_suffix, suffix_part, pad_id))
  canvas = jnp.where(in_gen, mask_id, canvas).astype(jnp.int32)
  return canvas, (prompt_lengths_B + gen_length + suffix_lengths_B).astype(jnp.int32)


def generate_bidirectional(graphdef: nnx.GraphDef, state: nnx.State, prompt_BxP: jax.Array,
                           prompt_lengths_B: jax.Array, suffix_BxS: jax.Array, suffix_lengths_B: jax.Array,
                           rng: jax.Array, config: SamplerConfig, settings: Resolved
                           ) -> tuple[Rollout, jax.Array]:
  """(rollout, final canvas BxL) of one semi-autoregressive (optionally infilling) decode."""
  decoder, s, cfg = Decoder(graphdef, state), settings, config
  b, g = s.block_size, cfg.gen_length
  num_blocks = -(-g // b)
  batch = prompt_BxP.shape[0]
  canvas, kv_lengths_B = make_canvas(prompt_BxP, prompt_lengths_B, suffix_BxS, suffix_lengths_B, g, s.mask_id,
                                     s.pad_id, extra=b)
  length = canvas.shape[1]
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), canvas.shape)
  mask = masks.bidirectional(kv_lengths_B)
  rows_Bx1 = jnp.arange(batch)[:, None]
  eos = jnp.asarray(s.eos_ids or (-1,))

  def block_slots(block):
    offset_b = block * b + jnp.arange(b)
    return prompt_lengths_B[:, None] + offset_b[None, :], jnp.broadcast_to(offset_b < g, (batch, b))

  def body(st: CanvasState) -> CanvasState:
    idx_Bxb, in_gen_Bxb = block_slots(st.block)
    steps_Bxb = st.commit_step_BxL[rows_Bx1, idx_Bxb]
    masked_Bxb = in_gen_Bxb & (steps_Bxb == NEVER) & ~st.done_B[:, None]
    x_BxLxD = decoder.full(decoder.embed(st.canvas_BxL), positions_BxL, mask)
    src_Bxb = jnp.maximum(idx_Bxb - 1, 0) if decoder.config.logits_shift else idx_Bxb
    h_BxbxD = jnp.take_along_axis(x_BxLxD, src_Bxb[..., None], axis=1)
    tokens_Bxb, logp_Bxb, conf_Bxb = policy.sample_tokens(decoder.head(h_BxbxD), jax.random.fold_in(rng, st.step),
                                                          cfg, s.mask_id)
    commit = policy.select_commits(conf_Bxb, masked_Bxb, st.block_step, s.steps_per_block, cfg)
    blk = jnp.where(commit, tokens_Bxb, st.canvas_BxL[rows_Bx1, idx_Bxb])
    logps = jnp.where(commit, logp_Bxb, st.logprob_BxL[rows_Bx1, idx_Bxb])
    still = masked_Bxb & ~commit
    eos_here = jnp.any(in_gen_Bxb & jnp.isin(blk, eos), axis=1)
    advance = ~jnp.any(still)
    return CanvasState(
        canvas_BxL=st.canvas_BxL.at[rows_Bx1, idx_Bxb].set(blk),
        commit_step_BxL=st.commit_step_BxL.at[rows_Bx1, idx_Bxb].set(jnp.where(commit, st.step, steps_Bxb)),
        logprob_BxL=st.logprob_BxL.at[rows_Bx1, idx_Bxb].set(logps),
        done_B=st.done_B | (~jnp.any(still, axis=1) & eos_here),
        block=st.block + advance, block_step=jnp.where(advance, 0, st.block_step + 1), step=st.step + 1)

  zero = jnp.zeros((), jnp.int32)
  st = CanvasState(canvas_BxL=canvas, commit_step_BxL=jnp.full(canvas.shape, NEVER, jnp.int32),
                   logprob_BxL=jnp.zeros(canvas.shape, jnp.float32), done_B=jnp.zeros((batch,), jnp.bool_),
                   block=zero, block_step=zero, step=zero)
  st = jax.lax.while_loop(lambda st: (st.block < num_blocks) & ~jnp.all(st.done_B), body, st)

  idx_BxG = prompt_lengths_B[:, None] + jnp.arange(g)[None, :]
  take = lambda x: jnp.take_along_axis(x, idx_BxG, axis=1)  # noqa: E731
  steps_BxG = take(st.commit_step_BxL)
  padded = jnp.pad(steps_BxG, ((0, 0), (0, num_blocks * b - g)), constant_values=NEVER)
  ranks_BxG = commit_ranks(padded.reshape(batch, num_blocks, b)).reshape(batch, -1)[:, :g]
  rollout = finish(take(st.canvas_BxL), steps_BxG, take(st.logprob_BxL),
                   jnp.broadcast_to(jnp.arange(g) // b, (batch, g)), ranks_BxG, st.step, s.eos_ids, s.pad_id)
  return rollout, st.canvas_BxL
