"""Block diffusion (SDAR) sampling: KV cache exactness, commit rules, trace replay, EOS, seeds, sharding."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from sampler_testlib import MASK_ID, PROMPTS, logprob_atol, peaked, sdar_model  # noqa: F401  (a fixture)
from flax import nnx
from sampler_replay import replay

from dice_jax import sharding
from dice_jax.model import transformer
from dice_jax.sampler import SamplerConfig, generate, sample
from dice_jax.sampler.config import resolve
from dice_jax.sampler.policy import NEVER

GEN = 12
GREEDY = SamplerConfig(gen_length=GEN, top_k=1, eos_ids=())
SAMPLED = SamplerConfig(gen_length=GEN, temperature=0.8, eos_ids=())


@pytest.fixture(scope="module")
def greedy_rollout(sdar_model):
  return sample(sdar_model, PROMPTS, jax.random.key(0), GREEDY)


def test_cache_equals_recomputing_everything(sdar_model, greedy_rollout):
  """The cached path (prefill, each block's k/v stored by the next block's first step) gives the no-cache
  reference's tokens, trace and log-probs."""
  ref = sample(sdar_model, PROMPTS, jax.random.key(0), GREEDY.replace(kv_cache=False))
  np.testing.assert_array_equal(greedy_rollout.tokens, ref.tokens)
  np.testing.assert_array_equal(greedy_rollout.commit_step, ref.commit_step)
  np.testing.assert_allclose(greedy_rollout.logprobs, ref.logprobs, atol=logprob_atol(sdar_model, PROMPTS, ref))
  # One token per step: as many steps per block as the most masked row has masks there (tails 3, 2, 2, 0 ->
  # first block 4 (row 3), two full blocks, last block 3 (row 0's 15th slot)).
  assert int(greedy_rollout.num_steps) == int(ref.num_steps) == 4 + 4 + 4 + 3
  assert np.asarray(greedy_rollout.valid).all() and not np.asarray(greedy_rollout.finished).any()


def test_cache_with_prompts_shorter_than_a_block(sdar_model):
  """The cached layout then starts with a whole padding block (the first step's "finished block")."""
  prompts = [[5, 6], [7], [8, 9, 10]]
  cached = sample(sdar_model, prompts, jax.random.key(2), SAMPLED)
  ref = sample(sdar_model, prompts, jax.random.key(2), SAMPLED.replace(kv_cache=False))
  np.testing.assert_array_equal(cached.tokens, ref.tokens)
  np.testing.assert_array_equal(cached.commit_step, ref.commit_step)
  np.testing.assert_allclose(cached.logprobs, ref.logprobs, atol=logprob_atol(sdar_model, prompts, ref, 0.8))


def test_cache_with_qkv_bias_and_without_qk_norm(sdar_model):
  """The decoder's merged q/k/v projection (and its merged bias) for the other attention variants."""
  config = sdar_model.config.replace(qkv_bias=True, qk_norm=False)
  graphdef, state = nnx.split(peaked(transformer.init_model(config, seed=4)))
  keys = iter(jax.random.split(jax.random.key(9), 3))
  state = jax.tree_util.tree_map_with_path(  # the biases start at zero: make them matter
      lambda path, a: jax.random.normal(next(keys), a.shape, a.dtype) if "bias" in str(path[-2:]) else a, state)
  model = nnx.merge(graphdef, state)
  cached = sample(model, PROMPTS, jax.random.key(0), GREEDY)
  ref = sample(model, PROMPTS, jax.random.key(0), GREEDY.replace(kv_cache=False))
  np.testing.assert_array_equal(cached.tokens, ref.tokens)
  np.testing.assert_allclose(cached.logprobs, ref.logprobs, atol=logprob_atol(model, PROMPTS, ref))


def test_trace_replays_through_the_model(sdar_model, greedy_rollout):
  """Each step's state rebuilt from the trace alone reproduces the committed tokens, order and log-probs."""
  checked = replay(sdar_model, greedy_rollout, PROMPTS, MASK_ID, temperature=1.0, greedy=True)
  assert checked == len(PROMPTS) * GEN
  steps = np.asarray(greedy_rollout.commit_step)
  final = np.where(steps < int(greedy_rollout.num_steps), greedy_rollout.tokens, MASK_ID)
  np.testing.assert_array_equal(final, greedy_rollout.tokens)  # the last state is the output


def test_trace_fields(greedy_rollout):
  block, rank = np.asarray(greedy_rollout.block), np.asarray(greedy_rollout.commit_rank)
  lengths = np.array([len(p) for p in PROMPTS])
  expected_block = (lengths[:, None] + np.arange(GEN)) // 4 - lengths[:, None] // 4
  np.testing.assert_array_equal(block, expected_block)  # blocks aligned to real positions from 0
  for row in range(len(PROMPTS)):  # static, 1 token/step: ranks 0..n-1 within every block
    for b in np.unique(block[row]):
      assert sorted(rank[row][block[row] == b]) == list(range(np.sum(block[row] == b)))


def test_gpu_decode_kernel_in_the_loop(sdar_model, greedy_rollout):
  """The Pallas kernel the GPU runs (interpreted here), in the real loop: same decode as the XLA path."""
  pallas = sample(sdar_model, PROMPTS, jax.random.key(0), GREEDY.replace(decode_attention="pallas"))
  np.testing.assert_array_equal(pallas.tokens, greedy_rollout.tokens)
  np.testing.assert_array_equal(pallas.commit_step, greedy_rollout.commit_step)
  np.testing.assert_allclose(pallas.logprobs, greedy_rollout.logprobs,
                             atol=logprob_atol(sdar_model, PROMPTS, greedy_rollout))


def test_a_row_does_not_depend_on_its_batch(sdar_model, greedy_rollout):
  """Padding (left whole blocks, slots past the end) never enters attention."""
  alone = sample(sdar_model, [PROMPTS[1]], jax.random.key(0), GREEDY)
  np.testing.assert_array_equal(alone.tokens[0], greedy_rollout.tokens[1])
  np.testing.assert_allclose(alone.logprobs[0], greedy_rollout.logprobs[1],
                             atol=logprob_atol(sdar_model, PROMPTS, greedy_rollout))


def test_dynamic_with_unreachable_threshold_equals_static(sdar_model, greedy_rollout):
  dynamic = sample(sdar_model, PROMPTS, jax.random.key(0), GREEDY.replace(mode="dynamic", threshold=1.5))
  np.testing.assert_array_equal(dynamic.tokens, greedy_rollout.tokens)
  np.testing.assert_array_equal(dynamic.commit_step, greedy_rollout.commit_step)


def test_dynamic_commits_every_confident_token(sdar_model):
  cfg = SamplerConfig(gen_length=GEN, mode="dynamic", threshold=0.6, temperature=0.05, eos_ids=())
  rollout = sample(sdar_model, PROMPTS, jax.random.key(3), cfg)
  steps, confidence = np.asarray(rollout.commit_step), np.exp(np.asarray(rollout.logprobs))
  multi = 0
  for row in range(len(PROMPTS)):
    for s in np.unique(steps[row]):
      at = steps[row] == s
      if at.sum() > 1:  # more than the forced one: all of them passed the threshold
        multi += 1
        assert confidence[row][at].min() >= 0.6, (row, s, confidence[row][at])
  assert multi > 0 and int(rollout.num_steps) < 16  # some steps committed several tokens
  replay(sdar_model, rollout, PROMPTS, MASK_ID, temperature=0.05)


def test_seeds_and_sampled_logprobs(sdar_model):
  a = sample(sdar_model, PROMPTS, jax.random.key(7), SAMPLED)
  b = sample(sdar_model, PROMPTS, jax.random.key(7), SAMPLED)
  c = sample(sdar_model, PROMPTS, jax.random.key(8), SAMPLED)
  for field in ("tokens", "commit_step", "logprobs"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
  assert not np.array_equal(a.tokens, c.tokens)
  assert replay(sdar_model, a, PROMPTS, MASK_ID, temperature=0.8) == len(PROMPTS) * GEN


def test_eos_stops_rows_and_masks_the_rest(sdar_model, greedy_rollout):
  tokens = np.asarray(greedy_rollout.tokens)
  eos = int(tokens[0, 5])  # a token the model emits mid-sequence in row 0
  rollout = sample(sdar_model, PROMPTS, jax.random.key(0), GREEDY.replace(eos_ids=(eos,)))
  out, steps, valid = np.asarray(rollout.tokens), np.asarray(rollout.commit_step), np.asarray(rollout.valid)
  block = np.asarray(rollout.block)
  for row in range(len(PROMPTS)):
    hits = np.flatnonzero(tokens[row] == eos)
    if hits.size == 0:
      np.testing.assert_array_equal(out[row], tokens[row])
      assert valid[row].all() and not rollout.finished[row]
      continue
    first = hits[0]
    assert rollout.finished[row] and int(rollout.lengths[row]) == first + 1
    np.testing.assert_array_equal(valid[row], np.arange(GEN) <= first)
    np.testing.assert_array_equal(out[row, :first + 1], tokens[row, :first + 1])  # same decode up to EOS
    assert (np.asarray(rollout.logprobs)[row, first + 1:] == 0).all()
    later = block[row] > block[row, first]  # blocks after EOS's block are never generated
    assert (steps[row][later] == NEVER).all() and (out[row][later] == 0).all()  # pad_id
    assert (steps[row][~later] != NEVER).all()  # EOS's own block was completed
  if np.asarray(rollout.finished).all():
    assert int(rollout.num_steps) < int(greedy_rollout.num_steps)


def test_sharded_equals_single_device(sdar_model):
  graphdef, state = nnx.split(sdar_model)
  mesh = sharding.make_mesh(2, 2, 2)
  sharded = nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))
  assert len(jax.tree.leaves(nnx.state(sharded))[0].sharding.device_set) == 8
  a = sample(sdar_model, PROMPTS, jax.random.key(5), SAMPLED)
  b = sample(sharded, PROMPTS, jax.random.key(5), SAMPLED)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.commit_step, b.commit_step)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=logprob_atol(sdar_model, PROMPTS, a, 0.8))  # tensor-parallel sums
  assert b.tokens.sharding.spec[0] == ("data", "fsdp")


def test_bad_inputs_get_clear_errors(sdar_model):
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="exceeds max_length 64"):
    sample(sdar_model, [list(range(2, 60))], key, GREEDY)  # 58 + 12 > max_position_embeddings
  with pytest.raises(ValueError, match="exceeds max_length 20"):
    sample(sdar_model, PROMPTS, key, GREEDY.replace(max_length=20))
  with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
    sample(sdar_model, PROMPTS, key, GREEDY.replace(max_length=100))
  graphdef, state = nnx.split(sdar_model)
  with pytest.raises(ValueError, match="prompt width 60 . gen_length 12 = 72 tokens exceeds max_length 64"):
    generate(graphdef, state, np.zeros((2, 60), np.int32), np.array([3, 4]), key, GREEDY)
  with pytest.raises(ValueError, match="outside"):
    sample(sdar_model, [[1, 2, 96]], key, GREEDY)
  with pytest.raises(ValueError, match="empty"):
    sample(sdar_model, [[1, 2], []], key, GREEDY)
  with pytest.raises(ValueError, match="block_size=8 differs"):
    sample(sdar_model, PROMPTS, key, GREEDY.replace(block_size=8))
  with pytest.raises(ValueError, match="needs a bidirectional model"):
    sample(sdar_model, PROMPTS, key, GREEDY, suffix_ids=[[3]] * 4)
  with pytest.raises(ValueError, match="autoregressive"):
    resolve(GREEDY, sdar_model.config.replace(architecture="qwen3", attention="causal"))
  with pytest.raises(ValueError, match="no mask_token_id"):
    resolve(GREEDY, sdar_model.config.replace(mask_token_id=None))
  with pytest.raises(ValueError, match="temperature must be > 0"):
    SamplerConfig(temperature=0.0)
  with pytest.raises(ValueError, match="mode="):
    SamplerConfig(mode="fast")
