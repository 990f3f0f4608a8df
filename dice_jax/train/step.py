"""One optimizer update as a pure function, and compiling it once with explicit shardings.

`make_train_step(loss_fn, ...)` serves any objective with the signature
`loss_fn(params, batch, rng, context) -> (loss, aux_metrics)`: the SFT diffusion losses and the RL
policy losses alike. `batch` is split into micro-batches under gradient accumulation; `context`
(None, or e.g. the frozen reference params of a KL term) is passed whole and gets no gradient.
The returned `train_step(state, batch, context=None) -> (state, metrics)` does no I/O and no
Python branching on traced values; `compile_train_step` lowers it ahead of time so a config that
does not fit in memory fails at start-up, with the compiled memory analysis in the log.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dice_jax.train.optim import cast_floating
from dice_jax.train.train_state import TrainState

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
  """The loss became NaN or infinite (SFT or RL); the last good checkpoint is kept."""


# (params in compute dtype, batch, rng, context) -> (scalar loss, dict of scalar metrics)
LossFn = Callable[[Any, Any, jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]


def _split_microbatches(batch: Any, num: int) -> Any:
  """[B, ...] -> [num, B/num, ...], micro-batch i taking rows i, i+num, ...

  Strided rather than contiguous so that every device keeps its own rows of a batch sharded on
  the leading axis: no data moves between devices to form a micro-batch.
  """
  def split(x):
    if x.shape[0] % num:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by grad_accum_steps {num}")
    return jnp.swapaxes(x.reshape(x.shape[0] // num, num, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def reduce_metric(name: str, values: jax.Array, axis: int = 0) -> jax.Array:
  """Combines one metric's values over micro-batches or minibatches: a metric named `*_max` by its
  max, `*_min` by its min, any other by its mean (each part weighted equally)."""
  if name.endswith("_max"):
    return jnp.max(values, axis=axis)
  if name.endswith("_min"):
    return jnp.min(values, axis=axis)
  return jnp.mean(values, axis=axis)


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, *, compute_dtype: Any = jnp.bfloat16,
                    grad_accum_steps: int = 1) -> Callable[..., tuple[TrainState, dict]]:
  """Builds `train_step(state, batch, context=None) -> (state, metrics)`.

  The loss sees a `compute_dtype` copy of the float32 master params; gradients flow back through
  the cast, so grads and optimizer moments stay float32. With `grad_accum_steps > 1` the batch is
  split into equal micro-batches scanned in sequence; loss and gradients are their means (each
  micro-batch weighted equally), metrics are combined by `reduce_metric` (`*_max` by max, ...).
  """
  def compute_loss(params, batch, rng, context):
    return loss_fn(cast_floating(params, compute_dtype), batch, rng, context)

  grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

  def loss_and_grads(params, batch, rng, context):
    if grad_accum_steps == 1:
      return grad_fn(params, batch, rng, context)
    micro = _split_microbatches(batch, grad_accum_steps)
    rngs = jax.random.split(rng, grad_accum_steps)

    def body(acc, xs):
      (loss, aux), grads = grad_fn(params, *xs, context)
      return jax.tree.map(jnp.add, acc, (loss, grads)), aux

    shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), rngs[0], context)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[0][0], shapes[1]))
    (loss, grads), aux_per_micro = jax.lax.scan(body, zeros, (micro, rngs))
    aux = {k: reduce_metric(k, v) for k, v in aux_per_micro.items()}
    return (loss / grad_accum_steps, aux), jax.tree.map(lambda g: g / grad_accum_steps, grads)

  def train_step(state: TrainState, batch: Any,
                 context: Any = None) -> tuple[TrainState, dict[str, jax.Array]]:
    rng, step_rng = jax.random.split(state.rng)
    (loss, aux), grads = loss_and_grads(state.params, batch, step_rng, context)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "lr": jnp.asarray(schedule(state.step), jnp.float32), **aux}
    new_state = dataclasses.replace(state, step=state.step + 1, params=params, opt_state=opt_state, rng=rng)
    return new_state, metrics

  return train_step


def format_memory_analysis(compiled: Any) -> str:
  """One line of the compiled program's memory use per device, in GiB."""
  mem = compiled.memory_analysis()
  if mem is None:
    return "memory analysis unavailable on this backend"
  gib = 1024 ** 3
  fields = ("argument", "output", "temp", "alias", "generated_code")
  parts = [f"{name}={getattr(mem, f'{name}_size_in_bytes', 0) / gib:.3f}" for name in fields]
  return "compiled memory per device (GiB): " + " ".join(parts)


def compile_train_step(train_step: Callable, abstract_state: TrainState, abstract_batch: Any,
                       state_sharding: TrainState, batch_sharding: Any, mesh: Mesh, *,
                       abstract_context: Any = None, context_sharding: Any = None):
  """Lowers and compiles `train_step` once, donating the state; logs the memory analysis.

  Traced under `jax.set_mesh(mesh)`, so the model's logical activation constraints apply.
  Returns the compiled executable: call it as `compiled(state, batch)`, or
  `compiled(state, batch, context)` when compiled with an `abstract_context`. Metrics come back
  replicated, so reading them on any host needs no gather.
  """
  args: tuple[Any, ...] = (abstract_state, abstract_batch)
  shardings: tuple[Any, ...] = (state_sharding, batch_sharding)
  if abstract_context is not None:
    args, shardings = args + (abstract_context,), shardings + (context_sharding,)
  jitted = jax.jit(train_step, in_shardings=shardings,
                   out_shardings=(state_sharding, NamedSharding(mesh, P())), donate_argnums=0)
  with jax.set_mesh(mesh):
    compiled = jitted.lower(*args).compile()
  log.info("%s", format_memory_analysis(compiled))
  return compiled
