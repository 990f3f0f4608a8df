"""The RL batch's layout is stated once (RLBatch.SHAPES) and is what the update is compiled for."""

import dataclasses

import jax
import jax.numpy as jnp

from dice_jax.rl.batch import RLBatch


def test_shapes_name_every_field_and_abstract_follows_them():
  assert set(RLBatch.SHAPES) == {f.name for f in dataclasses.fields(RLBatch)}
  batch = RLBatch.abstract(8, 5, 3, None, with_ref=False)
  assert batch.prompt.shape == (8, 5) and batch.prompt.dtype == jnp.int32
  assert batch.tokens.shape == batch.old_logp.shape == (8, 3) and batch.valid.dtype == jnp.bool_
  assert batch.score_keys.shape == (8, 2) and batch.score_keys.dtype == jnp.uint32
  assert batch.rewards.shape == batch.reward_valid.shape == (8,)
  assert batch.ref_logp is None and batch.advantages is None and batch.weights is None
  assert len(jax.tree.leaves(batch)) == 9  # a pytree: None fields hold no leaves
  with_ref = RLBatch.abstract(8, 5, 3, None, with_ref=True)
  assert with_ref.ref_logp.shape == (8, 3) and len(jax.tree.leaves(with_ref)) == 10


def test_a_batch_splits_by_rows_as_a_pytree():
  rows = jnp.arange(4)
  batch = RLBatch(prompt=jnp.zeros((4, 2), jnp.int32), prompt_lengths=rows, tokens=jnp.zeros((4, 3), jnp.int32),
                  valid=jnp.ones((4, 3), bool), commit_rank=jnp.zeros((4, 3), jnp.int32),
                  old_logp=jnp.zeros((4, 3)), score_keys=jnp.zeros((4, 2), jnp.uint32))
  half = jax.tree.map(lambda x: x[::2], batch)
  assert isinstance(half, RLBatch) and half.prompt_lengths.tolist() == [0, 2] and half.rewards is None
  assert batch.replace(rewards=rows.astype(jnp.float32)).rewards.shape == (4,)
