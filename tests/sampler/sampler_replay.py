"""Replays a rollout's trace through the model's own forward pass (dice_jax.model), no sampler code.

For each row and each step at which it committed tokens, the state is rebuilt from the trace alone
(prompt + masked_state(...) [+ suffix]) in real positions with no padding inside the sequence, and
the model's logits there must reproduce what the sampler recorded.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dice_jax.model import masks, transformer
from dice_jax.sampler import Rollout, masked_state


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens_NxL, mask):
  return transformer.forward(graphdef, state, tokens_NxL, mask)


def replay(model, rollout: Rollout, prompts, mask_id: int, temperature: float, suffixes=None, greedy: bool = False
           ) -> int:
  """Assert every committed token's log-prob (and, when greedy, the token and commit order); count them."""
  graphdef, state = nnx.split(model)
  cfg = model.config
  tokens, steps = np.asarray(rollout.tokens), np.asarray(rollout.commit_step)
  logprobs, valid = np.asarray(rollout.logprobs), np.asarray(rollout.valid)
  gen = tokens.shape[1]
  suffixes = suffixes or [[] for _ in prompts]
  width = max(len(p) for p in prompts) + gen + max(len(s) for s in suffixes)
  checked = 0
  for row, (prompt, suffix) in enumerate(zip(prompts, suffixes)):
    p, length = len(prompt), len(prompt) + gen + len(suffix)
    row_steps = np.unique(steps[row][steps[row] != np.iinfo(np.int32).max])
    states = np.zeros((gen, width), np.int32)  # a row commits at <= gen distinct steps; fixed shape, one compile
    for k, s in enumerate(row_steps):
      middle = np.asarray(masked_state(tokens[row], steps[row], int(s), mask_id))
      states[k, :length] = np.concatenate([prompt, middle, suffix])
    n = gen
    if cfg.attention == "block_causal":  # block-causal from real position 0; nothing after the sequence
      slot = np.arange(width)
      m = (slot[None, :] // cfg.block_size <= slot[:, None] // cfg.block_size) & (slot[None, :] < length)
      mask = masks.explicit(jnp.asarray((m | np.eye(width, dtype=bool))[None].repeat(n, 0)))
    else:
      mask = masks.bidirectional(jnp.full((n,), length, jnp.int32))
    logits = np.asarray(_logits(graphdef, state, jnp.asarray(states), mask), np.float64)[:, p:p + gen]
    logp = jax.nn.log_softmax(jnp.asarray(logits) / temperature, axis=-1)
    for k, s in enumerate(row_steps):
      now = np.flatnonzero(steps[row] == s)
      expect = np.asarray(logp[k, now, tokens[row, now]])
      got = np.where(valid[row, now], logprobs[row, now], expect)  # invalid (post-EOS) entries are zeroed
      np.testing.assert_allclose(got, expect, atol=2e-4, err_msg=f"row {row} step {s}")
      if greedy:
        candidates = logits[k].copy()
        candidates[:, mask_id] = -np.inf
        np.testing.assert_array_equal(tokens[row, now], candidates[now].argmax(-1), err_msg=f"row {row} step {s}")
        # Low-confidence remasking: no still-masked token of the same block was more confident.
        block = np.asarray(rollout.block)[row]
        open_now = np.flatnonzero((steps[row] >= s) & (block == block[now[0]]))
        best = candidates[open_now].argmax(-1)
        confidence = np.exp(np.asarray(logp[k, open_now, best]))
        assert confidence[np.isin(open_now, now)].min() >= confidence.max() - 1e-5, (row, s)
      checked += len(now)
  return checked
