"""Per-token log-probs of generated tokens under partially masked *states*, in one forward pass.

A policy log-prob estimator (dice_jax.rl.logprobs) describes, per row, C states of the generated
region (`states_BxCxG`: tokens or the mask id) and which state scores each generated token
(`state_BxG`). This module runs the model over them and returns log_softmax(logits / T)[token]
(T = sampling temperature, the sampler's formula, dice_jax.sampler.policy) and the entropy there.
Its static facts (block size, steps per block, ids, T) are the sampler's own settings resolved
against the model (dice_jax.sampler.config.Resolved), so scorer and sampler cannot disagree.

Block-diffusion models (SDAR): one sequence per row in the multi_copy layout
    [clean: prompt + generated tokens | state 0 | ... | state C-1]
with the sampler's own slot layout (dice_jax.sampler.block.make_layout: rows left-padded by whole
blocks so generated blocks align; real RoPE positions). The clean part is block-causal; state c's
copy of block k sees block k of state c and the clean blocks before k (masks.multi_copy), which is
exactly what the sampler's cached decoder saw when it decoded block k. So the prompt and the clean
context are computed once for all states. Attention cost per head and layer:
L^2 + C n (L + n) for L = prompt + generation, n = generated blocks x block size (TraceRL: C =
steps per block; DICE's 2k + 4k tokens with C = 4: 2e8 scores, 2.4x cheaper than one dense mask).

Bidirectional models (LLaDA, Dream): nothing can be shared between states (every token sees
every other), so each state is its own canvas `[prompt | generated region]` with padding keys
removed, as the sampler's canvas: C full forward passes per row.

Only the positions that are scored reach the lm_head (`Transformer.hidden_states` are gathered
first, then `Transformer.logits`), so the head costs B x G x V, not B x (L + C n) x V.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dice_jax.model import masks
from dice_jax.sampler.block import make_layout
from dice_jax.sampler.config import Resolved


def _token_stats(model, x_BxGxD: jax.Array, tokens_BxG: jax.Array, temperature: float
                 ) -> tuple[jax.Array, jax.Array]:
  """(log-prob of each token, entropy) under softmax(logits / temperature), float32."""
  logits = model.logits(x_BxGxD) / temperature
  logz_BxG = jax.nn.logsumexp(logits, axis=-1)
  token_logit = jnp.take_along_axis(logits, tokens_BxG[..., None], axis=-1)[..., 0]
  entropy_BxG = logz_BxG - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
  return token_logit - logz_BxG, entropy_BxG


def _gather(x_BxLxD: jax.Array, index_BxG: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_BxLxD, index_BxG[..., None], axis=1)


def block_inputs(spec: Resolved, prompt_BxP: jax.Array, prompt_lengths_B: jax.Array, tokens_BxG: jax.Array,
                 states_BxCxG: jax.Array, state_BxG: jax.Array):
  """(tokens_BxQ, positions_BxQ, mask, gather index BxG) of the multi_copy layout."""
  batch, width = prompt_BxP.shape
  num_states, g = states_BxCxG.shape[1], spec.gen_length
  layout = make_layout(prompt_lengths_B, width, g, spec.block_size)
  slot_BxS = jnp.broadcast_to(jnp.arange(layout.length, dtype=jnp.int32), (batch, layout.length))
  src = slot_BxS - layout.shift_B[:, None]
  from_prompt = (src >= 0) & (src < prompt_lengths_B[:, None])
  prompt_part = jnp.take_along_axis(prompt_BxP, jnp.clip(src, 0, width - 1), axis=1)
  gen_index = jnp.clip(slot_BxS - layout.gen_start_B[:, None], 0, g - 1)
  base = jnp.where(from_prompt, prompt_part, spec.pad_id)
  clean = jnp.where(layout.gen_BxS, jnp.take_along_axis(tokens_BxG, gen_index, axis=1), base)
  tail = layout.first_block * layout.block_size  # copies mirror slots [tail, S)
  n = layout.length - tail
  gen_tail = layout.gen_BxS[:, tail:]
  idx_tail = gen_index[:, tail:]
  copies = jnp.where(gen_tail[:, None], jnp.take_along_axis(states_BxCxG, jnp.broadcast_to(
      idx_tail[:, None], (batch, num_states, n)), axis=2), base[:, None, tail:])
  tokens_BxQ = jnp.concatenate([clean, copies.reshape(batch, num_states * n)], axis=1).astype(jnp.int32)
  positions_BxQ = jnp.concatenate([layout.positions_BxS, jnp.tile(layout.positions_BxS[:, tail:], num_states)],
                                  axis=1)
  mask = masks.multi_copy(spec.block_size, num_states, n, kv_start_B=layout.shift_B, kv_lengths_B=layout.gen_end_B)
  offset_B = layout.gen_start_B - tail
  index_BxG = layout.length + state_BxG * n + offset_B[:, None] + jnp.arange(g, dtype=jnp.int32)[None, :]
  return tokens_BxQ, positions_BxQ, mask, index_BxG


def bidirectional_inputs(spec: Resolved, prompt_BxP: jax.Array, prompt_lengths_B: jax.Array,
                         states_BxCxG: jax.Array, state_BxG: jax.Array):
  """(tokens [B*C, W], positions, mask, gather index BxG into the flattened [B, C*W]) per state."""
  batch, width = prompt_BxP.shape
  num_states, g = states_BxCxG.shape[1], spec.gen_length
  length = width + g
  slot = jnp.arange(length, dtype=jnp.int32)[None, :]
  p = prompt_lengths_B[:, None]
  prompt_part = jnp.take_along_axis(prompt_BxP, jnp.broadcast_to(jnp.clip(slot, 0, width - 1), (batch, length)),
                                    axis=1)
  in_gen = (slot >= p) & (slot < p + g)
  base = jnp.where(slot < p, prompt_part, spec.pad_id)
  gen_idx = jnp.broadcast_to(jnp.clip(slot - p, 0, g - 1)[:, None], (batch, num_states, length))
  canvas = jnp.where(in_gen[:, None], jnp.take_along_axis(states_BxCxG, gen_idx, axis=2), base[:, None])
  tokens = canvas.reshape(batch * num_states, length).astype(jnp.int32)
  positions = jnp.broadcast_to(slot, (batch * num_states, length))
  mask = masks.bidirectional(jnp.repeat((prompt_lengths_B + g).astype(jnp.int32), num_states))
  source = p + jnp.arange(g, dtype=jnp.int32)[None, :] - (1 if spec.logits_shift else 0)
  return tokens, positions, mask, state_BxG * length + source


def score(graphdef: nnx.GraphDef, params: nnx.State, spec: Resolved, prompt_BxP: jax.Array,
          prompt_lengths_B: jax.Array, tokens_BxG: jax.Array, states_BxCxG: jax.Array, state_BxG: jax.Array
          ) -> tuple[jax.Array, jax.Array]:
  """(log-prob, entropy), each BxG float32, of `tokens_BxG` scored in state `state_BxG` (pure)."""
  model = nnx.merge(graphdef, params)
  state_BxG = jnp.clip(state_BxG, 0, states_BxCxG.shape[1] - 1).astype(jnp.int32)
  batch = prompt_BxP.shape[0]
  if spec.attention == "block_causal":
    if spec.logits_shift:
      raise ValueError("shifted logits (Dream) are only supported for bidirectional models")
    tokens, positions, mask, index = block_inputs(spec, prompt_BxP, prompt_lengths_B, tokens_BxG, states_BxCxG,
                                                  state_BxG)
    x = model.hidden_states(tokens, mask, positions_BxL=positions)
  else:
    tokens, positions, mask, index = bidirectional_inputs(spec, prompt_BxP, prompt_lengths_B, states_BxCxG,
                                                          state_BxG)
    x = model.hidden_states(tokens, mask, positions_BxL=positions)
    x = x.reshape(batch, -1, x.shape[-1])
  return _token_stats(model, _gather(x, index), tokens_BxG, spec.temperature)
