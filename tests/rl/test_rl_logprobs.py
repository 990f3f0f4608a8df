"""Policy log-prob estimators against the sampler and the model's own forward pass.

The key property: with unchanged params, TraceRL's one-pass scoring of a rollout's trace equals the
log-probs the sampler recorded while decoding it (block-diffusion and bidirectional models alike),
so the update's ratio is 1 on-policy.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dice_jax.model import masks, transformer
from dice_jax.model.config import ModelConfig
from dice_jax.rl import logprobs, scoring
from dice_jax.rl.batch import RLBatch
from dice_jax.sampler import SamplerConfig, sample
from dice_jax.sampler.api import pad_batch
from dice_jax.sampler.config import resolve

DIMS = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=8, max_position_embeddings=96, mask_token_id=63, eos_token_id=1, pad_token_id=0)
# Ragged prompts: their tails fill 3, 2 and 0 slots of a block of 4.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [3, 4, 5, 6, 7, 8, 9, 10]]
ARCHS = {"sdar": dict(attention="block_causal", block_size=4),
         "llada": dict(attention="bidirectional"),
         "dream": dict(attention="bidirectional", logits_shift=True, qkv_bias=True)}


def _peaked(model, scale=3.0):
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.tree.map(lambda a: a * scale if a.ndim >= 2 else a, state))


@functools.cache
def _rollout(arch: str):
  config = ModelConfig(architecture=arch, **ARCHS[arch], **DIMS)
  model = _peaked(transformer.init_model(config, seed=1))
  bidirectional = arch != "sdar"
  sampler = SamplerConfig(gen_length=14, mode="dynamic", threshold=0.6, temperature=0.8,
                          block_size=8 if bidirectional else None, steps_per_block=4 if bidirectional else None)
  prompts, lengths = pad_batch(PROMPTS, None, what="prompt", vocab_size=DIMS["vocab_size"])
  rollout = sample(model, prompts, jax.random.key(3), sampler, prompt_lengths=lengths)
  batch = RLBatch(prompt=jnp.asarray(prompts), prompt_lengths=jnp.asarray(lengths), tokens=rollout.tokens,
                  valid=rollout.valid, commit_rank=rollout.commit_rank, old_logp=rollout.logprobs,
                  score_keys=jax.random.split(jax.random.PRNGKey(0), len(PROMPTS)))
  return model, resolve(sampler, config), rollout, batch


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _score(graphdef, params, spec, estimator, batch):
  return logprobs.policy_logprobs(graphdef, params, spec, estimator, batch)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_trace_scoring_reproduces_the_sampler_logprobs(arch):
  model, spec, rollout, batch = _rollout(arch)
  graphdef, params = nnx.split(model)
  logp, entropy = _score(graphdef, params, spec, "trace", batch)
  valid = np.asarray(rollout.valid)
  assert valid.sum() > 20 and np.asarray(rollout.commit_rank).max() >= 1  # several commit events per block
  np.testing.assert_allclose(np.where(valid, np.asarray(logp), 0.0), np.asarray(rollout.logprobs), atol=2e-5)
  assert np.all(np.asarray(entropy)[valid] > 0)


def test_block_scoring_equals_the_model_forward_with_a_dense_mask():
  model, spec, rollout, batch = _rollout("sdar")
  graphdef, params = nnx.split(model)
  prompt, states, index = logprobs.ESTIMATORS["trace"](spec, batch, 0.0)
  index = jnp.clip(index, 0, states.shape[1] - 1)
  tokens, positions, mask, gather = scoring.block_inputs(spec, prompt, batch.prompt_lengths, batch.tokens,
                                                         states, index)
  length = tokens.shape[1]
  dense = masks.explicit(jnp.broadcast_to(masks.dense(mask, length, length), (tokens.shape[0], length, length)))
  logits = transformer.forward(graphdef, params, tokens, dense, positions_BxL=positions)
  logits = jnp.take_along_axis(logits, gather[..., None], axis=1) / spec.temperature
  want = jnp.take_along_axis(jax.nn.log_softmax(logits), batch.tokens[..., None], axis=-1)[..., 0]
  got, _ = _score(graphdef, params, spec, "trace", batch)
  valid = np.asarray(rollout.valid)
  np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=2e-5)


@pytest.mark.parametrize("arch", ["sdar", "llada"])
def test_one_step_and_coupled_estimators(arch):
  model, spec, rollout, batch = _rollout(arch)
  graphdef, params = nnx.split(model)
  prompt, states, index = logprobs.ESTIMATORS["coupled"](spec, batch, 0.0)
  tokens, committed = np.asarray(batch.tokens), np.asarray(batch.commit_rank) >= 0
  states, index = np.asarray(states), np.asarray(index)
  # Each committed token is masked in exactly the state that scores it and visible in the other.
  rows, cols = np.nonzero(committed)
  assert np.all(states[rows, index[rows, cols], cols] == spec.mask_id)
  assert np.all(states[rows, 1 - index[rows, cols], cols] == tokens[rows, cols])
  prompt, states, _ = logprobs.ESTIMATORS["one_step"](spec, batch, 0.5)
  assert np.all(np.asarray(states) == spec.mask_id)
  lengths = np.asarray(batch.prompt_lengths)
  masked = (np.asarray(prompt) == spec.mask_id) & (np.arange(prompt.shape[1])[None] < lengths[:, None])
  assert 0 < masked.sum() < lengths.sum()
  for estimator in ("one_step", "coupled"):
    logp, _ = _score(graphdef, params, spec, estimator, batch)
    assert np.all(np.isfinite(np.asarray(logp))) and np.all(np.asarray(logp)[committed] < 0)
    # Against the model's own forward over each state, built here independently of scoring.py.
    want = _state_by_state(model, spec, *ESTIMATORS_OF(spec, batch, estimator), batch)
    np.testing.assert_allclose(np.asarray(logp)[committed], want[committed], atol=2e-5, err_msg=estimator)


def ESTIMATORS_OF(spec, batch, estimator):  # noqa: N802  (reads like the registry it calls)
  prompt, states, index = logprobs.ESTIMATORS[estimator](spec, batch, 0.15)  # policy_logprobs' default
  return np.asarray(prompt), np.asarray(states), np.asarray(index)


@nnx.jit
def _forward(model, tokens):
  return model(tokens, attention=model.config.attention)


def _state_by_state(model, spec, prompt_BxP, states_BxCxG, index_BxG, batch) -> np.ndarray:
  """log_softmax(logits / T)[token] of every generated token from the state that scores it, by
  plain forward passes of the model (`model(tokens, attention=...)`):
  - bidirectional: the canvas [prompt | state], everything sees everything;
  - block-causal: for the block (absolute position // block_size) holding token j, the sequence
    [prompt | clean tokens of earlier blocks | the state's tokens from that block on]; block-causal
    attention keeps later blocks out of its logits, so one batched call covers every block."""
  tokens, lengths = np.asarray(batch.tokens), np.asarray(batch.prompt_lengths)
  rows, gen = tokens.shape
  out = np.zeros((rows, gen), np.float32)
  block = spec.attention == "block_causal"
  for r in range(rows):
    p = lengths[r]
    positions = p + np.arange(gen)
    starts = sorted(set(positions // spec.block_size * spec.block_size)) if block else [None]
    for c in range(states_BxCxG.shape[1]):
      seqs = [np.concatenate([prompt_BxP[r, :p], states_BxCxG[r, c] if start is None
                              else np.where(positions < start, tokens[r], states_BxCxG[r, c])]) for start in starts]
      logits = np.asarray(_forward(model, jnp.asarray(np.stack(seqs), jnp.int32)))
      for j in np.flatnonzero(index_BxG[r] == c):
        k = starts.index(positions[j] // spec.block_size * spec.block_size) if block else 0
        out[r, j] = jax.nn.log_softmax(logits[k, p + j] / spec.temperature)[tokens[r, j]]
  return out
