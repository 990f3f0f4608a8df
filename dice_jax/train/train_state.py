"""The train state (step, float32 params, optimizer state, RNG) and its shardings.

The state is one pytree so that a jitted step can take it with `donate_argnums=0`, orbax can save
and restore it in one item, and its shardings follow from the params' shardings: AdamW moments
mirror their parameter, scalars (step, counts, RNG) are replicated.
"""

from __future__ import annotations

from typing import Any, cast

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Any  # float32 master weights: nnx.State or a nested dict of arrays
  opt_state: optax.OptState
  rng: jax.Array  # uint32[2] raw key (orbax saves raw keys, not typed ones); split each step


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def state_shardings(tx: optax.GradientTransformation, params_sharding: Any,
                    abstract_params: Any, mesh: Mesh) -> TrainState:
  """TrainState of NamedShardings: optimizer leaves shaped like a param take the param's sharding."""
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  opt_sharding = optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_opt, params_sharding,
      transform_non_params=lambda _: replicated(mesh))
  # A TrainState-shaped pytree of shardings (as jit and orbax take them): its leaves are not arrays.
  return TrainState(step=cast(Any, replicated(mesh)), params=params_sharding, opt_state=opt_sharding,
                    rng=cast(Any, replicated(mesh)))


def abstract_state(tx: optax.GradientTransformation, abstract_params: Any,
                   shardings: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying shardings: the restore target, and what the step compiles for."""
  shapes = TrainState(
      step=cast(Any, jax.ShapeDtypeStruct((), jnp.int32)),  # a pytree of shapes, not of arrays
      params=abstract_params,
      opt_state=jax.eval_shape(tx.init, abstract_params),
      rng=jax.eval_shape(lambda: jax.random.PRNGKey(0)))
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)


def create_train_state(params: Any, tx: optax.GradientTransformation, seed: int,
                       shardings: TrainState) -> TrainState:
  """A fresh state around already-placed float32 params (donated: they become the state's).

  AdamW moments are created directly with their shardings, never whole on one device.
  """
  init = jax.jit(
      lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p),
                           rng=jax.random.PRNGKey(seed)),
      out_shardings=shardings, donate_argnums=0)
  return init(params)

