"""The sampler's pieces against hand-computed values: commit rules, truncation, ranks, cache attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dice_jax import sharding
from dice_jax.sampler import SamplerConfig, decode_attention, policy
from dice_jax.sampler.api import pad_batch
from dice_jax.sampler.rollout import commit_ranks

NEVER = int(policy.NEVER)


def test_static_schedule_and_dynamic_threshold():
  conf = jnp.array([[0.1, 0.9, 0.5, 0.7], [0.95, 0.2, 0.96, 0.3], [0.4, 0.4, 0.4, 0.4]])
  masked = jnp.array([[True, True, True, True], [True, False, True, True], [False, True, True, False]])
  static = SamplerConfig(steps_per_block=2)
  # 4 masked, 2 steps left -> 2; 3 masked -> 2; 2 masked -> 1 (ties go to the lower position).
  np.testing.assert_array_equal(policy.select_commits(conf, masked, jnp.int32(0), 2, static),
                                [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 0]])
  # Last step of the block: everything still masked.
  np.testing.assert_array_equal(policy.select_commits(conf, masked, jnp.int32(1), 2, static), masked)
  dynamic = SamplerConfig(mode="dynamic", threshold=0.6)
  np.testing.assert_array_equal(policy.select_commits(conf, masked, jnp.int32(0), 4, dynamic),
                                [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 0]])  # row 2: none >= 0.6, forced one


def test_truncation_limits_draws_but_not_logprobs():
  logits = jnp.log(jnp.array([[[0.5, 0.3, 0.15, 0.05, 0.0]]]) + 1e-9)  # token 4 plays the mask token
  keys = jax.random.split(jax.random.key(0), 400)
  draw = jax.vmap(lambda k, c: policy.sample_tokens(logits, k, c, mask_id=4), in_axes=(0, None))
  for cfg, allowed in [(SamplerConfig(top_k=2), {0, 1}), (SamplerConfig(top_p=0.7), {0, 1}),
                       (SamplerConfig(top_p=0.4), {0}), (SamplerConfig(), {0, 1, 2, 3})]:
    tokens, logp, conf = draw(keys, cfg)
    assert set(np.unique(tokens).tolist()) == allowed, cfg
    full = np.log(np.array([0.5, 0.3, 0.15, 0.05, 0.0]) + 1e-9)
    np.testing.assert_allclose(logp, full[np.asarray(tokens)], rtol=1e-5)  # untruncated distribution
    np.testing.assert_allclose(conf, np.exp(logp), rtol=1e-6)
  tokens, logp, _ = policy.sample_tokens(logits * 2, keys[0], SamplerConfig(top_k=1, temperature=2.0), mask_id=0)
  assert int(tokens[0, 0]) == 1  # greedy never picks the mask token (id 0 here)
  np.testing.assert_allclose(logp[0, 0], np.log(0.3), rtol=1e-5)  # log-probs at logits / temperature


def test_commit_ranks_by_hand():
  steps = jnp.array([[[3, 1, 3, NEVER], [7, 5, 9, 5]]])
  np.testing.assert_array_equal(commit_ranks(steps), [[[1, 0, 1, -1], [1, 0, 2, 0]]])


def test_pad_batch_checks_and_pads():
  tokens, lengths = pad_batch([[3, 4, 5], [6]], what="prompt", vocab_size=10)
  np.testing.assert_array_equal(tokens, [[3, 4, 5], [6, 0, 0]])
  np.testing.assert_array_equal(lengths, [3, 1])
  tokens, lengths = pad_batch(np.array([[1, 2, 9], [3, 4, 9]]), [2, 3], what="prompt", vocab_size=10)
  np.testing.assert_array_equal(lengths, [2, 3])
  with pytest.raises(ValueError, match="do not fit"):
    pad_batch(np.array([[1, 2]]), [3], what="prompt", vocab_size=10)
  with pytest.raises(ValueError, match="2-D"):
    pad_batch(np.array([1, 2]), what="prompt", vocab_size=10)
  with pytest.raises(ValueError, match="outside"):
    pad_batch([[1, -1]], what="prompt", vocab_size=10)


def _dense(q, k, v, start, ends):
  """Softmax attention of query q of row b over slots [start[b], ends[b, q]), kv heads repeated: the definition."""
  b, n_q, h, d = q.shape
  rep = h // k.shape[1]
  k, v = np.repeat(np.asarray(k), rep, axis=1), np.repeat(np.asarray(v), rep, axis=1)  # [B, H, S, K]
  scores = np.einsum("bqhk,bhsk->bhqs", q, k) / np.sqrt(d)
  slot = np.arange(k.shape[2])
  ok = (slot >= np.asarray(start)[:, None, None]) & (slot < np.asarray(ends)[:, :, None])  # [B, Q, S]
  scores = np.where(ok[:, None], scores, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  return np.einsum("bhqs,bhsk->bqhk", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("num_queries", [4, 8])  # a block; a finished block and the next (per-query bounds)
def test_cache_attention_kernels_match_the_definition(num_queries):
  """update_and_attend: fresh k/v land at [at, at + Q) and each query sees [start, its own bound)."""
  rng = np.random.default_rng(num_queries)
  b, h, g, d, s = 4, 4, 2, 16, decode_attention.PALLAS_SPLIT * 2
  at = jnp.int32(600)
  qs = jnp.asarray(rng.normal(size=(b, num_queries, h, d)), jnp.float32)
  k_new, v_new = (jnp.asarray(rng.normal(size=(b, num_queries, g, d)), jnp.float32) for _ in range(2))
  k_cache, v_cache = (jnp.asarray(rng.normal(size=(b, g, s, d)), jnp.float32) for _ in range(2))
  start = jnp.array([0, 8, 4, 596])  # row 3: its prefix is 4 slots; row 0 reads across the kernel's splits
  block_end = 600 + 4 * (np.arange(num_queries) // 4 + 1)
  ends = jnp.asarray(np.minimum(block_end[None], np.array([[700], [700], [602], [700]])))  # row 2 ends mid-block
  k_all = np.asarray(k_cache).copy()
  v_all = np.asarray(v_cache).copy()
  k_all[:, :, 600:600 + num_queries] = np.swapaxes(np.asarray(k_new), 1, 2)
  v_all[:, :, 600:600 + num_queries] = np.swapaxes(np.asarray(v_new), 1, 2)
  want = _dense(np.asarray(qs), k_all, v_all, start, ends)

  def run(impl):
    return decode_attention.update_and_attend(qs, k_new, v_new, k_cache, v_cache, at, start, ends, impl)

  for impl in ("xla", "pallas"):  # pallas: interpreted off GPU
    got, k_out, v_out = run(impl)
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=impl)
    np.testing.assert_array_equal(k_out, k_all)
    np.testing.assert_array_equal(v_out, v_all)
  mesh = sharding.make_mesh(2, 2, 2)  # batch over data x fsdp, kv heads over tensor: the kernel runs per shard
  with jax.set_mesh(mesh):
    spec = sharding.logical_to_spec(("batch", "act_heads", None, None), k_cache.shape, mesh)
    put = lambda x, sp: jax.device_put(x, jax.sharding.NamedSharding(mesh, sp))  # noqa: E731
    row = jax.sharding.PartitionSpec(spec[0])
    sharded, _, _ = jax.jit(lambda *a: decode_attention.update_and_attend(*a, "pallas"))(
        put(qs, row), put(k_new, row), put(v_new, row), put(k_cache, spec), put(v_cache, spec), at,
        put(start, row), put(ends, row))
  np.testing.assert_allclose(sharded, want, atol=1e-5)


def test_cache_attention_rows_without_keys_stay_finite():
  """Padding queries (a finished block that is all left padding) see no key at all: garbage, never NaN."""
  qs = jnp.ones((1, 8, 2, 16))
  k_new = v_new = jnp.ones((1, 8, 1, 16))
  cache = jnp.zeros((1, 1, decode_attention.PALLAS_SPLIT, 16))
  ends = jnp.array([[4] * 4 + [8] * 4])
  for impl in ("xla", "pallas"):
    got, _, _ = decode_attention.update_and_attend(qs, k_new, v_new, cache, cache, jnp.int32(0), jnp.array([4]),
                                                   ends, impl)
    assert np.isfinite(np.asarray(got)).all(), impl
    np.testing.assert_allclose(got[0, 4:], 1.0, rtol=1e-6)  # the real queries: the mean of their values


def test_cache_write_lands_at_the_slot():
  cache = jnp.zeros((1, 2, 8, 3))
  new = jnp.arange(12, dtype=jnp.float32).reshape(1, 2, 2, 3)  # [B, Q, G, K]
  out = np.asarray(decode_attention.write_cache(cache, new, jnp.int32(5)))
  np.testing.assert_array_equal(out[0, :, 5:7], np.swapaxes(np.asarray(new)[0], 0, 1))
  assert (out[0, :, :5] == 0).all() and (out[0, :, 7:] == 0).all()
