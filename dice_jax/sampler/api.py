"""Entry points: `generate` (pure, jitted over (graphdef, state)) and `sample` (a model and token lists).

    rollout = sample(model, [[1, 2, 3], [4, 5]], jax.random.key(0), SamplerConfig(gen_length=256))

The RL loop calls the pure core directly, every step with updated parameters; it compiles once per
(batch, prompt width, suffix width, config) and never again for new parameter values:

    graphdef, state = nnx.split(model)
    rollout = generate(graphdef, state, prompt_BxP, prompt_lengths_B, rng, config)

Prompts are right-padded token arrays plus per-row lengths (pad values are never read); the sampler
re-lays them out itself (see dice_jax.sampler.block / .bidirectional). Put them on the batch
sharding (dice_jax.sharding.batch_sharding) and call under `jax.set_mesh(mesh)` when sharded.
Lengths are checked here and in `sample`: nothing is ever truncated silently.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dice_jax import sharding
from dice_jax.model.transformer import Transformer
from dice_jax.sampler.bidirectional import generate_bidirectional
from dice_jax.sampler.block import generate_block
from dice_jax.sampler.config import Resolved, SamplerConfig, resolve
from dice_jax.sampler.rollout import Rollout


def _check_static(settings: Resolved, config: SamplerConfig, prompt_width: int, suffix_width: int) -> None:
  total = prompt_width + config.gen_length + suffix_width
  if total > settings.max_length:
    parts = f"prompt width {prompt_width} + gen_length {config.gen_length}"
    parts += f" + suffix width {suffix_width}" if suffix_width else ""
    raise ValueError(f"{parts} = {total} tokens exceeds max_length {settings.max_length}")


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def generate(graphdef: nnx.GraphDef, state: nnx.State, prompt_BxP: jax.Array, prompt_lengths_B: jax.Array,
             rng: jax.Array, config: SamplerConfig, suffix_BxS: jax.Array | None = None,
             suffix_lengths_B: jax.Array | None = None) -> Rollout:
  """One rollout of the model (graphdef, state); see dice_jax.sampler.rollout for what it records.

  prompt_BxP / prompt_lengths_B: int32 tokens, row b's prompt in [:, :len_b] (len_b >= 1; the rest
    is never read). P + gen_length (+ suffix width) must fit max_length: checked while tracing.
  rng: a PRNG key; step s draws with fold_in(rng, s). Same key and inputs: the same rollout.
  suffix_BxS / suffix_lengths_B: bidirectional models only: text after the generated middle.
  """
  model_config = nnx.merge(graphdef, state).config
  settings = resolve(config, model_config)
  suffix_width = 0 if suffix_BxS is None else suffix_BxS.shape[1]
  _check_static(settings, config, prompt_BxP.shape[1], suffix_width)
  if model_config.attention == "block_causal":
    if suffix_BxS is not None:
      raise ValueError("infilling (a suffix after the generated middle) needs a bidirectional model; "
                       "a block-causal model cannot attend to text after the block it decodes")
    return generate_block(graphdef, state, prompt_BxP, prompt_lengths_B, rng, config, settings)
  if suffix_BxS is None:
    suffix_BxS = jnp.zeros((prompt_BxP.shape[0], 0), jnp.int32)
    suffix_lengths_B = jnp.zeros((prompt_BxP.shape[0],), jnp.int32)
  rollout, _ = generate_bidirectional(graphdef, state, prompt_BxP, prompt_lengths_B, suffix_BxS, suffix_lengths_B,
                                      rng, config, settings)
  return rollout


def pad_batch(sequences, lengths=None, *, what: str, vocab_size: int, allow_empty: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded int32 [B, W] and lengths [B] from token lists (or an array + optional lengths)."""
  if isinstance(sequences, (np.ndarray, jax.Array)):
    array = np.asarray(sequences)
    if array.ndim != 2:
      raise ValueError(f"{what} ids must be a 2-D [batch, length] array or a list of token lists, "
                       f"got shape {array.shape}")
    lens = np.full(array.shape[0], array.shape[1]) if lengths is None else np.asarray(lengths)
    rows = [array[i, :n] for i, n in enumerate(lens)] if lens.shape == (array.shape[0],) else None
    if rows is None or np.any(lens > array.shape[1]) or np.any(lens < 0):
      raise ValueError(f"{what} lengths {lens.tolist()} do not fit a {array.shape} array")
  else:
    if lengths is not None:
      raise ValueError(f"{what} lengths are only meaningful with a padded array")
    rows = [np.asarray(list(s)) for s in sequences]
  if not rows:
    raise ValueError(f"no {what}s given")
  for i, row in enumerate(rows):
    if row.size == 0 and not allow_empty:
      raise ValueError(f"{what} {i} is empty: a {what} needs at least one token")
    if row.size and (not np.issubdtype(row.dtype, np.integer) or row.min() < 0 or row.max() >= vocab_size):
      raise ValueError(f"{what} {i} has token ids outside [0, {vocab_size}) (or non-integer ids)")
  width = max(max(len(r) for r in rows), 0 if allow_empty else 1)
  out = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out, np.array([len(r) for r in rows], np.int32)


def _mesh_of(state: nnx.State) -> jax.sharding.Mesh | None:
  leaf = jax.tree.leaves(state)[0]
  if not isinstance(leaf.sharding, jax.sharding.NamedSharding):
    return None
  return typing.cast(jax.sharding.Mesh, leaf.sharding.mesh)  # a placed array's: concrete, not abstract


def sample(model: Transformer, prompt_ids: Sequence[Sequence[int]] | np.ndarray, rng: jax.Array,
           config: SamplerConfig, *, prompt_lengths: Sequence[int] | np.ndarray | None = None,
           suffix_ids: Sequence[Sequence[int]] | np.ndarray | None = None,
           suffix_lengths: Sequence[int] | np.ndarray | None = None) -> Rollout:
  """Decode a batch of prompts (token lists, or a padded array with `prompt_lengths`).

  `suffix_ids` (bidirectional models only) makes it infilling: each row's generated middle of
  `config.gen_length` tokens sits between its prompt and its suffix, both clamped.
  Runs on the mesh the model's parameters live on, batch split over (data, fsdp).
  """
  settings = resolve(config, model.config)
  vocab = model.config.vocab_size
  prompts, lengths = pad_batch(prompt_ids, prompt_lengths, what="prompt", vocab_size=vocab)
  suffix = suffix_len = None
  if suffix_ids is not None:
    suffix, suffix_len = pad_batch(suffix_ids, suffix_lengths, what="suffix", vocab_size=vocab, allow_empty=True)
    if len(suffix) != len(prompts):
      raise ValueError(f"{len(suffix)} suffixes for {len(prompts)} prompts")
  total = lengths + config.gen_length + (0 if suffix_len is None else suffix_len)
  if np.any(total > settings.max_length):
    i = int(np.argmax(total))
    raise ValueError(f"row {i}: prompt {lengths[i]} + gen_length {config.gen_length}"
                     + ("" if suffix_len is None else f" + suffix {suffix_len[i]}")
                     + f" = {total[i]} tokens exceeds max_length {settings.max_length}")
  graphdef, state = nnx.split(model)
  mesh = _mesh_of(state)
  if mesh is None:
    return generate(graphdef, state, prompts, lengths, rng, config, suffix, suffix_len)
  with jax.set_mesh(mesh):
    put = lambda x: None if x is None else jax.device_put(x, sharding.batch_sharding(mesh, x.ndim))  # noqa: E731
    return generate(graphdef, state, put(prompts), put(lengths), rng, config, put(suffix), put(suffix_len))
