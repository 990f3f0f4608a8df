"""The RL batch: one rollout's rows, and everything the update reads about them, as one typed struct.

The rollout engine builds it on device (dice_jax.rl.rollout), the loop adds the rewards, the update
adds the advantages and reads the rest (dice_jax.rl.update); the log-prob estimators read its
trace (dice_jax.rl.logprobs). Fields, shapes and dtypes are stated here once (`SHAPES`), and
`abstract` turns them into what the update is compiled for. Rows are on the leading axis, grouped
by prompt (B = prompts x group size); P is the prompt width (data.max_prompt_length) and G the
generated length (rollout.gen_length).

Decision: a flax.struct dataclass (as the sampler's Rollout): a pytree, so jit, device_put,
sharding and the strided minibatch split work on it unchanged; frozen, changed with `.replace`.
An optional field is None until it applies, which is part of the compiled program's input structure.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class RLBatch:
  prompt: jax.Array          # int32 BxP: the sampler's input, right-padded
  prompt_lengths: jax.Array  # int32 B
  tokens: jax.Array          # int32 BxG: the rollout (dice_jax.sampler.Rollout), pad where not generated
  valid: jax.Array           # bool BxG: real response tokens (up to and including EOS)
  commit_rank: jax.Array     # int32 BxG: the trace TraceRL scores from
  old_logp: jax.Array        # float32 BxG: the behaviour policy's log-probs, recorded by the sampler or
                             # recomputed at rollout time with the params that sampled it (algo.old_logprobs)
  score_keys: jax.Array      # uint32 Bx2: per-row keys of the one_step / coupled masks
  ref_logp: jax.Array | None = None      # float32 BxG: the frozen start model's (algo.kl_reference=reference)
  rewards: jax.Array | None = None       # float32 B: from the verifier and reward shaping (the loop)
  reward_valid: jax.Array | None = None  # bool B: False for excluded outcomes (zero weight)
  advantages: jax.Array | None = None    # float32 B: set by the update from the rewards, per group
  weights: jax.Array | None = None       # float32 B: the advantage estimator's row weights
  prox_logp: jax.Array | None = None     # float32 BxG: under the params the update starts from, set by
                                         # the update for stale rollouts (algo.stale_correction)

  # Field -> (dimensions, dtype); the one statement of the batch's layout.
  SHAPES: ClassVar[dict[str, tuple[str, Any]]] = {
      "prompt": ("BP", jnp.int32), "prompt_lengths": ("B", jnp.int32), "tokens": ("BG", jnp.int32),
      "valid": ("BG", jnp.bool_), "commit_rank": ("BG", jnp.int32), "old_logp": ("BG", jnp.float32),
      "score_keys": ("B2", jnp.uint32), "ref_logp": ("BG", jnp.float32), "rewards": ("B", jnp.float32),
      "reward_valid": ("B", jnp.bool_), "advantages": ("B", jnp.float32), "weights": ("B", jnp.float32),
      "prox_logp": ("BG", jnp.float32)}

  @classmethod
  def abstract(cls, rows: int, prompt_width: int, gen_length: int, sharding: Any, *,
               with_ref: bool) -> RLBatch:
    """ShapeDtypeStructs of the batch an update step takes: rollout, rewards, and `ref_logp` when
    the KL is to a frozen reference (advantages, weights and prox_logp are the update's own, so absent)."""
    sizes = {"B": rows, "P": prompt_width, "G": gen_length, "2": 2}
    present = {"rewards", "reward_valid"} | ({"ref_logp"} if with_ref else set())
    values: dict[str, Any] = {}  # ShapeDtypeStructs where the fields are typed as arrays
    for field in dataclasses.fields(cls):
      dims, dtype = cls.SHAPES[field.name]
      required = field.default is dataclasses.MISSING
      if required or field.name in present:
        values[field.name] = jax.ShapeDtypeStruct(tuple(sizes[d] for d in dims), dtype, sharding=sharding)
    return cls(**values)
