"""AdamW with global-norm clipping and a learning-rate schedule, shared by SFT and RL.

Master weights stay in float32 in the train state; the step casts a copy to the compute dtype
(`cast_floating`) for the forward pass, so gradients and the AdamW moments are float32.

Warm-up: `warmup_steps` optimizer updates rising linearly from 0 to `lr` (optax schedules). RL
starts a fresh AdamW state, whose first updates are about `lr` in every coordinate whatever the
gradient's size (m / sqrt(v) is +-1 after one step), so its default run warms up too.

An adjustable optimizer (`make_optimizer(..., adjustable=True)`, what RL builds) ends its chain
with `optax.inject_hyperparams(optax.scale)`: a scale on every update, held as a scalar in the
optimizer state, which the host can lower between steps (`scale_lr`) without recompiling the step.
The KL spike guard (dice_jax.rl.guard) cuts the learning rate this way. It changes the optimizer
state's structure, so an RL checkpoint written without it does not restore into it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax

from dice_jax.config import require


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW hyperparameters. DICE's RL: lr 1e-6, constant, b2 0.999, no weight decay, clip 1.0."""
  lr: float = 1e-5
  schedule: Literal["constant", "cosine", "linear"] = "constant"
  warmup_steps: int = 0
  # Steps over which cosine/linear decay runs (after warm-up); None: the run's total steps.
  decay_steps: int | None = None
  # Cosine/linear end value as a fraction of lr (DICE's `min_lr_scale`).
  min_lr_ratio: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  # Clip the global gradient norm to this value; None turns clipping off.
  max_grad_norm: float | None = 1.0

  def __post_init__(self):
    require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
    require(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
    require(self.decay_steps is None or self.decay_steps > 0, "decay_steps",
            f"must be > 0, got {self.decay_steps}")
    require(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio",
            f"must be in [0, 1], got {self.min_lr_ratio}")
    for name in ("b1", "b2"):
      value = getattr(self, name)
      require(0.0 <= value < 1.0, name, f"must be in [0, 1), got {value}")
    require(self.eps > 0, "eps", f"must be > 0, got {self.eps}")
    require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
    require(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm",
            f"must be > 0 or null, got {self.max_grad_norm}")


def make_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to lr, then constant, cosine or linear decay to lr * min_lr_ratio."""
  decay_steps = cfg.decay_steps or max(total_steps - cfg.warmup_steps, 1)
  end_lr = cfg.lr * cfg.min_lr_ratio
  if cfg.schedule == "constant":
    main = optax.constant_schedule(cfg.lr)
  elif cfg.schedule == "cosine":
    main = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=cfg.min_lr_ratio)
  else:
    main = optax.linear_schedule(cfg.lr, end_lr, decay_steps)
  if cfg.warmup_steps == 0:
    return main
  warmup = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
  return optax.join_schedules([warmup, main], boundaries=[cfg.warmup_steps])


def decay_mask(params: Any) -> Any:
  """Weight decay for weight matrices only: not norm scales, not biases (the usual AdamW rule).

  Decided by name first (a path containing "norm" or "bias" is not decayed), then by ndim >= 2:
  with layers stacked for `lax.scan` a norm scale is 2-D, so ndim alone is not enough.
  """
  def rule(path, p):
    name = jax.tree_util.keystr(path).lower()
    return not ("norm" in name or "bias" in name) and p.ndim >= 2
  return jax.tree_util.tree_map_with_path(rule, params)


def make_optimizer(cfg: OptimizerConfig, total_steps: int, *,
                   adjustable: bool = False) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer and its schedule (the step logs `schedule(step)` as the learning rate).
  `adjustable`: with a learning-rate scale the host can change (see the module docstring)."""
  schedule = make_schedule(cfg, total_steps)
  parts = [] if cfg.max_grad_norm is None else [optax.clip_by_global_norm(cfg.max_grad_norm)]
  parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  if adjustable:
    parts.append(optax.inject_hyperparams(optax.scale)(step_size=1.0))
  return (parts[0] if len(parts) == 1 else optax.chain(*parts)), schedule


_SCALE = "step_size"  # the hyperparameter of the adjustable optimizer's final optax.scale


def lr_scale(opt_state: Any) -> jax.Array | None:
  """The adjustable optimizer's learning-rate scale (None if the optimizer has none)."""
  return optax.tree_utils.tree_get(opt_state, _SCALE, default=None)


def scale_lr(opt_state: Any, factor: float) -> Any:
  """`opt_state` with its learning-rate scale multiplied by `factor` (same structure, dtype and
  sharding, so the compiled step takes it as it is). ValueError if the optimizer is not adjustable."""
  current = lr_scale(opt_state)
  if current is None:
    raise ValueError("this optimizer has no learning-rate scale (make_optimizer(..., adjustable=True))")
  value = jax.device_put(jnp.asarray(current * factor, current.dtype), current.sharding)
  return optax.tree_utils.tree_set(opt_state, **{_SCALE: value})


def cast_floating(tree: Any, dtype: jnp.dtype) -> Any:
  """Casts floating leaves to `dtype` (bf16 compute copy of f32 master weights); ints untouched."""
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)
