"""Rollouts: prompts -> the jitted sampler -> a device batch for the update + completions to verify.

`RolloutEngine.start(step, params, items)` samples G responses to each of this process's prompts
with the given params (the *behaviour* policy), records everything the update needs on device
(`InFlight.batch`: the sampler's trace and log-probs, or log-probs recomputed under those same
params, see `algo.old_logprobs`), decodes this process's completions and submits them to the
verifier, returning at once with a future of their verdicts. The caller decides when to wait
(dice_jax.rl.loop overlaps that wait with the next rollout).

Row order: rows are grouped by prompt (G consecutive rows per prompt) and the sampler runs
`rollout.batch_size` rows per call (one compiled program, reused every step). With several
processes each call's rows are the processes' local rows in process order, so every group stays
inside one process, which verifies and scores its own rows.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax import distributed, sharding
from dice_jax.data.rl_data import REWARD_COLUMNS, collate
from dice_jax.model.tokenizer import Tokenizer
from dice_jax.rewards.candidates import submit_completions
from dice_jax.rl.batch import RLBatch
from dice_jax.rl.config import RLConfig
from dice_jax.rl.data import PromptBook
from dice_jax.rl.logprobs import policy_logprobs
from dice_jax.sampler.api import generate
from dice_jax.sampler.config import Resolved, SamplerConfig
from dice_jax.verifier.sync_client import VerifierClient


@dataclasses.dataclass
class InFlight:
  """A sampled rollout whose verdicts may still be coming."""
  step: int
  items: list[dict[str, Any]]  # this process's prompts, one per group
  batch: RLBatch  # global device arrays: everything the update needs but rewards
  prompts: list[str]  # this process's rows: prompt text and completion
  completions: list[str]
  verdicts: concurrent.futures.Future  # list[pb.Verdict] of this process's rows
  lengths: np.ndarray  # global rows: valid response tokens
  finished: np.ndarray  # global rows: ended with EOS
  sample_s: float
  # Mean |recomputed - sampler-recorded| old log-prob over valid tokens (algo.old_logprobs=recompute):
  # the sampler/trainer numeric mismatch (bf16 cached decoding vs the training forward).
  logprob_mismatch: float | None = None


def sampler_config(cfg: RLConfig, eos_ids: Sequence[int]) -> SamplerConfig:
  """The run's sampling settings: the `rollout` section (a SamplerConfig) without its rollout-batch
  keys, which are not the sampler's; `rollout.eos_ids: null` means `eos_ids` (see `eos_ids_for`)."""
  fields = {f.name: getattr(cfg.rollout, f.name) for f in dataclasses.fields(SamplerConfig)}
  if fields["eos_ids"] is None:
    fields["eos_ids"] = tuple(eos_ids)
  return SamplerConfig(**fields)


def eos_ids_for(model_eos: int | None, tokenizer: Tokenizer) -> tuple[int, ...]:
  """Every id that ends a response: the model's EOS, the tokenizer's, and the chat end-of-turn."""
  return tuple(sorted({i for i in (model_eos, tokenizer.eos_id, tokenizer.im_end_id) if i is not None}))


def _global_numpy(x: jax.Array) -> np.ndarray:
  return np.asarray(multihost_utils.process_allgather(x, tiled=True)) if jax.process_count() > 1 else np.asarray(x)


class RolloutEngine:
  """Samples, scores and submits one step's rollout; compiled programs are reused every step."""

  def __init__(self, cfg: RLConfig, graphdef: nnx.GraphDef, spec: Resolved, sampling: SamplerConfig,
               mesh: jax.sharding.Mesh, tokenizer: Tokenizer, book: PromptBook, client: VerifierClient,
               options: pb.VerifyOptions, ref_params: Any = None):
    self.cfg, self.graphdef, self.spec, self.sampling = cfg, graphdef, spec, sampling
    self.mesh, self.tokenizer, self.book, self.client, self.options = mesh, tokenizer, book, client, options
    self.ref_params = ref_params
    self.group_size = cfg.rollout.group_size
    self.rows = cfg.rollout.prompts_per_step * self.group_size
    self.chunk = cfg.rollout.batch_size or self.rows
    self.local_chunk = self.chunk // jax.process_count()
    self._row_sharding = sharding.batch_sharding(mesh, 1)
    self._score = jax.jit(functools.partial(policy_logprobs, graphdef), static_argnums=(1, 2, 4))

  def _put(self, local: np.ndarray) -> jax.Array:
    return distributed.host_to_global(local, self._row_sharding)

  def _local_rows(self, chunk: int) -> slice:
    start = chunk * self.chunk + jax.process_index() * self.local_chunk
    return slice(start, start + self.local_chunk)

  def prompt_arrays(self, items: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """This process's rows' prompt ids, padded to `data.max_prompt_length`, and their lengths."""
    prompts = [self.book.prompt(item["phase"], item["problem_id"]) for item in items for _ in range(self.group_size)]
    ids = np.full((len(prompts), self.cfg.data.max_prompt_length), self.spec.pad_id, np.int32)
    for row, prompt in enumerate(prompts):
      ids[row, :len(prompt.ids)] = prompt.ids
    return ids, np.array([len(p.ids) for p in prompts], np.int32)

  def start(self, step: int, params: Any, items: list[dict[str, Any]], refill: int = 0) -> InFlight:
    """Samples this step's rollout with `params` and submits its completions (returns at once).
    `refill` > 0: the step's refill-th extra rollout (dice_jax.rl.dynamic), with its own random key."""
    t0 = time.perf_counter()
    ids, lengths = self.prompt_arrays(items)
    key = jax.random.fold_in(jax.random.key(self.cfg.rollout.seed), step)
    if refill:
      key = jax.random.fold_in(key, (1 << 30) + refill)
    chunks, finished, mismatch = [], [], []
    algo = self.cfg.algo
    with jax.set_mesh(self.mesh):
      for c in range(self.rows // self.chunk):
        local = slice(c * self.local_chunk, (c + 1) * self.local_chunk)
        prompt, plen = self._put(ids[local]), self._put(lengths[local])
        rollout = generate(self.graphdef, params, prompt, plen, jax.random.fold_in(key, c), self.sampling)
        keys = np.asarray(jax.random.key_data(jax.random.split(jax.random.fold_in(key, 1 << 20 | c), self.chunk)))
        mine = slice(jax.process_index() * self.local_chunk, (jax.process_index() + 1) * self.local_chunk)
        part = RLBatch(prompt=prompt, prompt_lengths=plen, tokens=rollout.tokens, valid=rollout.valid,
                       commit_rank=rollout.commit_rank, old_logp=rollout.logprobs, score_keys=self._put(keys[mine]))
        if algo.old_logprobs == "recompute":
          part = dataclasses.replace(
              part, old_logp=self._score(params, self.spec, algo.logprob, part, algo.prompt_mask_prob)[0])
          mismatch.append(jnp.sum(jnp.abs(part.old_logp - rollout.logprobs) * rollout.valid))
        if self.ref_params is not None:
          part = dataclasses.replace(part, ref_logp=self._score(self.ref_params, self.spec, algo.logprob, part,
                                                                algo.prompt_mask_prob)[0])
        chunks.append(part)
        finished.append(rollout.finished)
    batch = jax.tree.map(lambda *parts: jnp.concatenate(parts), *chunks)
    logprob_mismatch = None
    if mismatch:
      logprob_mismatch = float(sum(jnp.sum(m) for m in mismatch)) / max(float(jnp.sum(batch.valid)), 1.0)
    return self.submit(step, items, batch, jnp.concatenate(finished), sample_s=time.perf_counter() - t0,
                       logprob_mismatch=logprob_mismatch)

  def submit(self, step: int, items: list[dict[str, Any]], batch: RLBatch, finished: jax.Array, *,
             sample_s: float = 0.0, logprob_mismatch: float | None = None) -> InFlight:
    """Decodes this process's completions from a rollout's device arrays (`batch`, and which rows
    ended with EOS) and submits them to the verifier."""
    tokens_np = _global_numpy(batch.tokens)
    lengths_np = _global_numpy(jnp.sum(batch.valid, axis=1, dtype=jnp.int32))  # = Rollout.lengths
    chunks = self.rows // self.chunk
    local_rows = np.concatenate([np.arange(self.rows)[self._local_rows(c)] for c in range(chunks)])
    completions = [self.tokenizer.decode(tokens_np[r, :lengths_np[r]], skip_special_tokens=True) for r in local_rows]
    g = self.group_size
    prompts = [self.book.prompt(item["phase"], item["problem_id"]).text for item in items for _ in range(g)]
    future = submit_completions(self.client, completions, options=self.options, **collate(items, g, REWARD_COLUMNS))
    return InFlight(step=step, items=list(items), batch=batch, prompts=prompts, completions=completions,
                    verdicts=future, lengths=lengths_np, finished=_global_numpy(finished), sample_s=sample_s,
                    logprob_mismatch=logprob_mismatch)

  def reward_array(self, local_values: np.ndarray, dtype) -> jax.Array:
    """A global [rows] array in the batch's row order from this process's per-row values."""
    parts = [self._put(np.asarray(local_values[c * self.local_chunk:(c + 1) * self.local_chunk], dtype))
             for c in range(self.rows // self.chunk)]
    return jnp.concatenate(parts) if len(parts) > 1 else parts[0]
