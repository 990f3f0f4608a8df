"""Block diffusion decoding (SDAR/TraDo) with an exact KV cache: nested while_loops, static shapes.

Layout. Blocks are aligned to real positions from 0, as in training, so a prompt of length p ends
inside its block p // b (b = block_size) and the first generated block also holds the prompt's last
p % b tokens. To keep every row on the same block at the same time, row r is left-padded by whole
blocks: its real position t sits at buffer slot t + shift_r, shift_r = b * (F - p_r // b), where
F = P // b for the padded prompt width P (at least 1 with the cache). So every row's first generated block is buffer block F,
and rows advance through blocks F, F+1, ..., F+N-1 in lockstep. Padding never enters attention:
row r attends only slots [shift_r, end), and slots past its own prompt + gen_length are padding.

Loop. An outer loop over blocks, an inner loop over the denoising steps of one block; every step
runs the model on the current block of every row, samples, commits by rule
(dice_jax.sampler.policy) and records the trace. With the KV cache a pass stores its k/v in the
cache; the current block's noisy k/v are overwritten by the next pass over it. A block's exact k/v
(from its final clean tokens, as SDAR's generate.py stores them) are computed in the first step of
the *next* block: that pass runs the finished block (block-causally: the cached prefix and itself)
and the new noisy block (the prefix, the finished block and itself) together, so a block costs
its denoising steps only, with no separate cache-filling pass, and later blocks never recompute the
prefix. The prompt's complete blocks but the last are prefilled in one pass before the loop; the
last one is the "finished block" of the first step (the cached layout keeps at least one whole
block before the first generated one, padding if the prompt is shorter than a block). A row is
finished once a block it completed contains an EOS; the loop ends when every row is finished or
the last block is done. With `kv_cache=False` each step instead recomputes the whole canvas under
the block-causal mask (the reference the cached path is tested against).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from dice_jax.model import masks
from dice_jax.sampler import decode_attention, policy
from dice_jax.sampler.config import Resolved, SamplerConfig
from dice_jax.sampler.decoder import Decoder, KVCache
from dice_jax.sampler.policy import NEVER
from dice_jax.sampler.rollout import Rollout, commit_ranks, finish


@struct.dataclass
class Layout:
  """Where each row's prompt and generation sit in the [B, S] buffer (S = (F + N) * b)."""
  shift_B: jax.Array  # left padding slots (a multiple of b)
  gen_start_B: jax.Array  # slot of the first generated token (= F * b + p % b)
  gen_end_B: jax.Array  # one past the last generated slot; later slots are padding
  positions_BxS: jax.Array  # RoPE position of each slot (real position; 0 on left padding)
  gen_BxS: jax.Array  # slot belongs to the row's generated region
  block_size: int = struct.field(pytree_node=False)
  first_block: int = struct.field(pytree_node=False)  # F
  num_blocks: int = struct.field(pytree_node=False)  # F + N: blocks in the buffer

  @property
  def length(self) -> int:
    return self.num_blocks * self.block_size


def make_layout(prompt_lengths_B: jax.Array, prompt_width: int, gen_length: int, block_size: int,
                min_first_block: int = 0) -> Layout:
  """The layout above; `min_first_block` puts at least that many (padding) blocks before F."""
  b = block_size
  first = max(prompt_width // b, min_first_block)
  gen_blocks = -(-(gen_length + b - 1) // b)  # enough for any prompt tail p % b <= b - 1
  length = (first + gen_blocks) * b
  lengths = prompt_lengths_B.astype(jnp.int32)
  shift = b * (first - lengths // b)
  gen_start = first * b + lengths % b
  slot = jnp.arange(length, dtype=jnp.int32)[None, :]
  return Layout(shift_B=shift, gen_start_B=gen_start, gen_end_B=gen_start + gen_length,
                positions_BxS=jnp.maximum(slot - shift[:, None], 0),
                gen_BxS=(slot >= gen_start[:, None]) & (slot < (gen_start + gen_length)[:, None]),
                block_size=b, first_block=first, num_blocks=first + gen_blocks)


def block_causal_mask(layout: Layout, length: int) -> masks.AttentionMask:
  """Explicit [B, L, L] mask over the first `length` slots: block-causal, padding keys removed.

  Each slot also sees itself, so padding queries (whose outputs are never used) have a key.
  """
  slot = jnp.arange(length)
  blocks = slot // layout.block_size
  causal = blocks[None, :] <= blocks[:, None]
  key_ok_BxL = (slot[None, :] >= layout.shift_B[:, None]) & (slot[None, :] < layout.gen_end_B[:, None])
  return masks.explicit((causal[None] & key_ok_BxL[:, None, :]) | jnp.eye(length, dtype=jnp.bool_)[None])


@struct.dataclass
class LoopState:
  canvas_BxS: jax.Array  # int32 tokens; mask_id where not yet committed
  commit_step_BxS: jax.Array  # int32; NEVER outside the generated region and before commit
  logprob_BxS: jax.Array  # float32
  done_B: jax.Array  # bool: finished (EOS in a completed block)
  block: jax.Array  # int32 buffer block being decoded
  block_step: jax.Array  # int32 denoising steps already taken in this block
  step: jax.Array  # int32 global denoising step counter
  cache: KVCache | None = None


def _slice_block(x_BxS: jax.Array, start: jax.Array, b: int) -> jax.Array:
  return jax.lax.dynamic_slice_in_dim(x_BxS, start, b, axis=1)


def _put_block(x_BxS: jax.Array, blk_Bxb: jax.Array, start: jax.Array) -> jax.Array:
  return jax.lax.dynamic_update_slice_in_dim(x_BxS, blk_Bxb.astype(x_BxS.dtype), start, axis=1)


class BlockSampler:
  """The pieces of one block-diffusion rollout (init, steps, the block loop, finish), all traceable."""

  def __init__(self, graphdef: nnx.GraphDef, state: nnx.State, config: SamplerConfig, settings: Resolved):
    self.decoder = Decoder(graphdef, state)
    self.config, self.settings = config, settings
    self.implementation = decode_attention.choose(config.decode_attention)

  def init(self, prompt_BxP: jax.Array, prompt_lengths_B: jax.Array) -> tuple[Layout, LoopState]:
    """Canvas, cache (with the prompt's complete blocks but the last prefilled) and counters."""
    s, cfg = self.settings, self.config
    batch, width = prompt_BxP.shape
    layout = make_layout(prompt_lengths_B, width, cfg.gen_length, s.block_size, min_first_block=int(cfg.kv_cache))
    src_BxS = jnp.arange(layout.length)[None, :] - layout.shift_B[:, None]
    from_prompt = (src_BxS >= 0) & (src_BxS < prompt_lengths_B[:, None])
    prompt_tokens = jnp.take_along_axis(prompt_BxP, jnp.clip(src_BxS, 0, width - 1), axis=1)
    canvas = jnp.where(from_prompt, prompt_tokens, s.pad_id)
    canvas = jnp.where(layout.gen_BxS, s.mask_id, canvas).astype(jnp.int32)
    cache = None
    if cfg.kv_cache:
      mc = self.decoder.config
      cache = decode_attention.init_cache(
          mc.num_layers, batch, mc.num_kv_heads, decode_attention.cache_length(layout.length, self.implementation),
          mc.head_dim, mc.compute_dtype)
      prefix = (layout.first_block - 1) * layout.block_size  # the first step stores block F - 1
      if prefix:
        x = self.decoder.embed(canvas[:, :prefix])
        _, kv = self.decoder.full(x, layout.positions_BxS[:, :prefix], block_causal_mask(layout, prefix),
                                  return_kv=True)
        cache = self.decoder.fill_cache(cache, kv)
      self.decoder.prepare_cached()
    zero = jnp.zeros((), jnp.int32)
    state = LoopState(canvas_BxS=canvas, commit_step_BxS=jnp.full(canvas.shape, NEVER, jnp.int32),
                      logprob_BxS=jnp.zeros(canvas.shape, jnp.float32), done_B=jnp.zeros((batch,), jnp.bool_),
                      block=zero + layout.first_block, block_step=zero, step=zero, cache=cache)
    return layout, state

  def _masked(self, layout: Layout, st: LoopState, start: jax.Array) -> jax.Array:
    b = layout.block_size
    open_Bxb = _slice_block(layout.gen_BxS, start, b) & (_slice_block(st.commit_step_BxS, start, b) == NEVER)
    return open_Bxb & ~st.done_B[:, None]

  def cond(self, layout: Layout, st: LoopState) -> jax.Array:
    """The current block has a masked token in an unfinished row (so a denoising step is due)."""
    return (st.block < layout.num_blocks) & jnp.any(self._masked(layout, st, st.block * layout.block_size))

  def _hidden_full(self, layout: Layout, canvas_BxS: jax.Array, start: jax.Array) -> jax.Array:
    x = self.decoder.full(self.decoder.embed(canvas_BxS), layout.positions_BxS,
                          block_causal_mask(layout, layout.length))
    return jax.lax.dynamic_slice_in_dim(x, start, layout.block_size, axis=1)

  def _hidden_cached(self, layout: Layout, st: LoopState, start: jax.Array, with_previous: bool
                     ) -> tuple[jax.Array, KVCache]:
    """The current block's hidden states through the cache; `with_previous`: the pass also runs the
    finished block before it (clean), storing its exact k/v."""
    b = layout.block_size
    first = start - b if with_previous else start
    num = 2 * b if with_previous else b
    x = self.decoder.embed(jax.lax.dynamic_slice_in_dim(st.canvas_BxS, first, num, axis=1))
    block_end_Q = first + b * (jnp.arange(num) // b + 1)  # each token sees up to the end of its own block
    ends_BxQ = jnp.minimum(block_end_Q[None, :], layout.gen_end_B[:, None])
    hidden, cache = self.decoder.cached(x, jax.lax.dynamic_slice_in_dim(layout.positions_BxS, first, num, axis=1),
                                        st.cache, first, layout.shift_B, ends_BxQ, self.implementation)
    return hidden[:, num - b:], cache

  def step(self, layout: Layout, rng: jax.Array, st: LoopState, with_previous: bool = False) -> LoopState:
    """One denoising step on the current block (which must have a masked token)."""
    b, s, cfg = layout.block_size, self.settings, self.config
    start = st.block * b
    masked_Bxb = self._masked(layout, st, start)
    if cfg.kv_cache:
      h, cache = self._hidden_cached(layout, st, start, with_previous)
    else:
      h, cache = self._hidden_full(layout, st.canvas_BxS, start), None
    tokens_Bxb, logp_Bxb, conf_Bxb = policy.sample_tokens(
        self.decoder.head(h), jax.random.fold_in(rng, st.step), cfg, s.mask_id)
    commit = policy.select_commits(conf_Bxb, masked_Bxb, st.block_step, s.steps_per_block, cfg)
    blk = jnp.where(commit, tokens_Bxb, _slice_block(st.canvas_BxS, start, b))
    steps = jnp.where(commit, st.step, _slice_block(st.commit_step_BxS, start, b))
    logps = jnp.where(commit, logp_Bxb, _slice_block(st.logprob_BxS, start, b))
    row_complete = ~jnp.any(masked_Bxb & ~commit, axis=1)
    eos_here = jnp.any(_slice_block(layout.gen_BxS, start, b) & jnp.isin(blk, jnp.asarray(s.eos_ids or (-1,))),
                       axis=1)
    return dataclasses.replace(
        st, canvas_BxS=_put_block(st.canvas_BxS, blk, start),
        commit_step_BxS=_put_block(st.commit_step_BxS, steps, start),
        logprob_BxS=_put_block(st.logprob_BxS, logps, start),
        done_B=st.done_B | (row_complete & eos_here),
        block_step=st.block_step + 1, step=st.step + 1, cache=cache)

  def block(self, layout: Layout, rng: jax.Array, st: LoopState) -> LoopState:
    """All denoising steps of the current block (the first one also stores the previous block's
    k/v), then on to the next block."""
    st = self.step(layout, rng, st, with_previous=self.config.kv_cache)
    st = jax.lax.while_loop(lambda st: self.cond(layout, st), lambda st: self.step(layout, rng, st), st)
    return dataclasses.replace(st, block=st.block + 1, block_step=jnp.zeros_like(st.block_step))

  def finish(self, layout: Layout, st: LoopState) -> Rollout:
    b, s = layout.block_size, self.settings
    idx_BxG = layout.gen_start_B[:, None] + jnp.arange(self.config.gen_length)[None, :]
    batch = st.canvas_BxS.shape[0]
    ranks_BxS = commit_ranks(st.commit_step_BxS.reshape(batch, -1, b)).reshape(batch, -1)
    take = lambda x: jnp.take_along_axis(x, idx_BxG, axis=1)  # noqa: E731
    return finish(take(st.canvas_BxS), take(st.commit_step_BxS), take(st.logprob_BxS),
                  idx_BxG // b - layout.first_block, take(ranks_BxS), st.step, s.eos_ids, s.pad_id)


def generate_block(graphdef: nnx.GraphDef, state: nnx.State, prompt_BxP: jax.Array, prompt_lengths_B: jax.Array,
                   rng: jax.Array, config: SamplerConfig, settings: Resolved) -> Rollout:
  """A whole block-diffusion rollout (traceable; dice_jax.sampler.api jits it)."""
  sampler = BlockSampler(graphdef, state, config, settings)
  layout, st = sampler.init(prompt_BxP, prompt_lengths_B)
  st = jax.lax.while_loop(lambda st: sampler.cond(layout, st), lambda st: sampler.block(layout, rng, st), st)
  return sampler.finish(layout, st)
