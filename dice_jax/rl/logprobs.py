"""Policy log-prob estimators for diffusion LMs, chosen by name (`algo.logprob`).

A diffusion LM has no exact sequence likelihood; each estimator picks the partially masked states
from which every generated token is scored (dice_jax.rl.scoring runs them in one pass):

  trace     TraceRL (Wang et al. 2025): each token from the state the sampler decoded it in.
            Block models: state c of a block holds the tokens committed at its first c commit
            events (`Rollout.commit_rank`), so C = steps_per_block states cover every block.
            Bidirectional models: one state per (block, commit event), C = blocks x steps.
            With unchanged params this reproduces the sampler's recorded log-probs, so the
            ratio is 1 on-policy (up to float rounding between the cached decoder and this pass).
  one_step  d1's diffu-GRPO (Zhao et al. 2025): one state with the whole generation masked, the
            prompt's tokens each masked with probability `prompt_mask_prob`. Block models: each
            block fully masked, after the clean blocks before it (the two-copy view).
  coupled   DiffuCoder's coupled sampling (Gong et al. 2025): a random mask m at rate t ~ U(0, 1)
            and its complement; every token is scored once, from the state where it is masked.

Each reads the batch's trace (dice_jax.rl.batch.RLBatch: prompt, prompt_lengths, tokens,
commit_rank, score_keys). one_step and coupled draw their masks from per-row keys
(`score_keys`) stored with the rollout, so the "old" log-probs (computed at rollout time) and the
new ones use the same masks.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dice_jax.rl.batch import RLBatch
from dice_jax.rl.scoring import score
from dice_jax.sampler.config import Resolved

States = tuple[jax.Array, jax.Array, jax.Array]  # (prompt_BxP, states_BxCxG, state_BxG)


def _trace(spec: Resolved, batch: RLBatch) -> States:
  tokens, rank = batch.tokens, batch.commit_rank
  committed = rank >= 0
  t = spec.steps_per_block
  if spec.attention == "block_causal":
    step_C = jnp.arange(t)[None, :, None]
    visible = committed[:, None] & (rank[:, None] < step_C)
    return batch.prompt, jnp.where(visible, tokens[:, None], spec.mask_id), rank
  num_blocks = -(-spec.gen_length // spec.block_size)
  block_G = jnp.arange(spec.gen_length) // spec.block_size
  k_C = (jnp.arange(num_blocks * t) // t)[None, :, None]
  r_C = (jnp.arange(num_blocks * t) % t)[None, :, None]
  visible = committed[:, None] & ((block_G[None, None] < k_C) | ((block_G[None, None] == k_C) & (rank[:, None] < r_C)))
  return batch.prompt, jnp.where(visible, tokens[:, None], spec.mask_id), block_G[None] * t + rank


def _row_uniform(keys_Bx2: jax.Array, n: int, salt: int) -> jax.Array:
  return jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, salt), (n,)))(keys_Bx2)


def _one_step(spec: Resolved, batch: RLBatch, prompt_mask_prob: float) -> States:
  prompt, lengths = batch.prompt, batch.prompt_lengths
  u = _row_uniform(batch.score_keys, prompt.shape[1], 0)
  in_prompt = jnp.arange(prompt.shape[1])[None, :] < lengths[:, None]
  prompt = jnp.where(in_prompt & (u < prompt_mask_prob), spec.mask_id, prompt)
  states = jnp.full((batch.tokens.shape[0], 1, batch.tokens.shape[1]), spec.mask_id, jnp.int32)
  return prompt, states, jnp.zeros(batch.tokens.shape, jnp.int32)


def _coupled(spec: Resolved, batch: RLBatch) -> States:
  tokens, committed = batch.tokens, batch.commit_rank >= 0
  rate_B = _row_uniform(batch.score_keys, 1, 1)
  masked = _row_uniform(batch.score_keys, tokens.shape[1], 2) < rate_B
  states = jnp.stack([jnp.where(masked | ~committed, spec.mask_id, tokens),
                      jnp.where(~masked | ~committed, spec.mask_id, tokens)], axis=1)
  return batch.prompt, states, jnp.where(masked, 0, 1).astype(jnp.int32)


ESTIMATORS: dict[str, Callable[..., States]] = {
    "trace": lambda spec, batch, prompt_mask_prob: _trace(spec, batch),
    "one_step": _one_step,
    "coupled": lambda spec, batch, prompt_mask_prob: _coupled(spec, batch),
}


def policy_logprobs(graphdef: nnx.GraphDef, params: nnx.State, spec: Resolved, estimator: str, batch: RLBatch,
                    prompt_mask_prob: float = 0.15) -> tuple[jax.Array, jax.Array]:
  """(log-prob, entropy) BxG of the batch's generated tokens under `estimator` (pure; jit it)."""
  if estimator not in ESTIMATORS:
    raise ValueError(f"log-prob estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}")
  prompt, states, state_index = ESTIMATORS[estimator](spec, batch, prompt_mask_prob)
  return score(graphdef, params, spec, prompt, batch.prompt_lengths, batch.tokens, states, state_index)
