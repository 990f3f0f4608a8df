"""Bidirectional models (LLaDA, Dream): semi-autoregressive blocks, infilling with clamped context."""

from __future__ import annotations

import functools

import jax
import numpy as np
from sampler_testlib import MASK_ID, PROMPTS, dream_model, llada_model  # noqa: F401  (fixtures)
from flax import nnx
from sampler_replay import replay

from dice_jax.sampler import SamplerConfig, sample
from dice_jax.sampler.api import pad_batch
from dice_jax.sampler.bidirectional import generate_bidirectional
from dice_jax.sampler.config import resolve

GEN = 10  # not a multiple of the block: the last block is partial
INFILL = SamplerConfig(gen_length=GEN, block_size=4, top_k=1, eos_ids=())
SUFFIXES = [[30, 31, 32], [33], [], [34, 35, 36, 37, 38]]


@functools.partial(jax.jit, static_argnums=(0, 7))
def _infill(graphdef, state, prompt, prompt_len, suffix, suffix_len, rng, config):
  settings = resolve(config, nnx.merge(graphdef, state).config)
  return generate_bidirectional(graphdef, state, prompt, prompt_len, suffix, suffix_len, rng, config, settings)


def _run(model, suffixes):
  prompt, prompt_len = pad_batch(PROMPTS, what="prompt", vocab_size=96)
  suffix, suffix_len = pad_batch(suffixes, what="suffix", vocab_size=96, allow_empty=True)
  graphdef, state = nnx.split(model)
  return _infill(graphdef, state, prompt, prompt_len, suffix, suffix_len, jax.random.key(0), INFILL)


def test_infilling_clamps_context_and_attends_to_the_suffix(llada_model):
  rollout, canvas = _run(llada_model, SUFFIXES)
  canvas = np.asarray(canvas)
  for row, (prompt, suffix) in enumerate(zip(PROMPTS, SUFFIXES)):
    p = len(prompt)
    np.testing.assert_array_equal(canvas[row, :p], prompt)
    np.testing.assert_array_equal(canvas[row, p:p + GEN], rollout.tokens[row])
    np.testing.assert_array_equal(canvas[row, p + GEN:p + GEN + len(suffix)], suffix)
    assert (canvas[row, p + GEN + len(suffix):] == 0).all()  # padding slots were never written
  assert (np.asarray(rollout.commit_step) < int(rollout.num_steps)).all()
  assert replay(llada_model, rollout, PROMPTS, MASK_ID, 1.0, suffixes=SUFFIXES, greedy=True) == 4 * GEN
  other, _ = _run(llada_model, [[s + 40 for s in suffix] for suffix in SUFFIXES])
  changed = [row for row, s in enumerate(SUFFIXES) if s]
  assert not np.array_equal(np.asarray(other.tokens)[changed], np.asarray(rollout.tokens)[changed])
  np.testing.assert_array_equal(other.tokens[2], rollout.tokens[2])  # row 2 has no suffix: nothing changed


def test_dream_shifted_logits_replay(dream_model):
  """Dream predicts slot i from hidden state i-1; the trace still replays through the model's forward."""
  cfg = SamplerConfig(gen_length=GEN, block_size=4, steps_per_block=2, temperature=0.9, eos_ids=())
  rollout = sample(dream_model, PROMPTS, jax.random.key(1), cfg)
  steps, block = np.asarray(rollout.commit_step), np.asarray(rollout.block)
  np.testing.assert_array_equal(block, np.broadcast_to(np.arange(GEN) // 4, (4, GEN)))
  assert int(rollout.num_steps) == 2 + 2 + 2  # two steps per block: 2 tokens each (last block: 1 each)
  assert all(np.sum(steps[row] == s) in (1, 2) for row in range(4) for s in range(6))
  assert replay(dream_model, rollout, PROMPTS, MASK_ID, 0.9) == 4 * GEN
