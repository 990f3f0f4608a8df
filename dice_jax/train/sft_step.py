"""The SFT objective and train step: masked-diffusion ELBO or SDAR's two-copy block diffusion.

The objective follows the model: block-causal models (SDAR/TraDo) train with the two-copy
`[x_t | x_0]` layout, fully bidirectional ones (LLaDA, Dream) with the plain masked ELBO
(`train.objective: auto`); either can be forced. The losses themselves are
`dice_jax.diffusion.objectives.diffusion_loss`; this module binds them to a batch of
`{"tokens", "response_mask"}` and to the generic optimizer step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dice_jax.config import require
from dice_jax.diffusion.objectives import diffusion_loss
from dice_jax.model.config import ModelConfig
from dice_jax.train.step import LossFn, make_train_step
from dice_jax.train.train_state import TrainState


@dataclasses.dataclass(frozen=True)
class SFTTrainConfig:
  steps: int = 1000  # optimizer updates in the whole run (also the schedule's length)
  seed: int = 0  # noising RNG (the data order has its own seed: data.seed)
  objective: Literal["auto", "masked", "two_copy"] = "auto"
  # "tokens": sum over the batch / response tokens (SDAR); "sequence": per-sequence mean (LLaDA).
  normalize: Literal["tokens", "sequence"] = "tokens"
  mask_eps: float = 1e-3  # mask rate t ~ U[eps, 1]; keeps the 1/t weight finite
  grad_accum_steps: int = 1  # micro-batches per step (data.batch_size must divide evenly)
  export_hf: bool = True  # write the final model in Hugging Face layout to <run_dir>/hf

  def __post_init__(self):
    require(self.steps > 0, "steps", f"must be > 0, got {self.steps}")
    require(0 < self.mask_eps < 1, "mask_eps", f"must be in (0, 1), got {self.mask_eps}")
    require(self.grad_accum_steps > 0, "grad_accum_steps",
            f"must be > 0, got {self.grad_accum_steps}")


def resolve_objective(config: ModelConfig, requested: str) -> str:
  """`auto`: two_copy for block-causal (SDAR) models, masked for the rest."""
  if requested != "auto":
    if requested == "two_copy" and config.block_size < 1:
      raise ValueError(f"objective two_copy needs a block model (block_size >= 1); "
                       f"{config.architecture} has block_size={config.block_size}")
    return requested
  return "two_copy" if config.attention == "block_causal" else "masked"


def make_sft_loss(graphdef: nnx.GraphDef, objective: str, cfg: SFTTrainConfig) -> LossFn:
  """loss_fn(params, batch, rng, context) -> (loss, metrics) over a padded SFT batch."""
  def loss_fn(params: Any, batch: dict[str, jax.Array], rng: jax.Array, context: None):
    del context  # SFT has no frozen inputs
    return diffusion_loss(graphdef, params, batch["tokens"], batch["response_mask"], rng,
                          objective=objective, eps=cfg.mask_eps, normalize=cfg.normalize)
  return loss_fn


def make_sft_step(graphdef: nnx.GraphDef, config: ModelConfig, cfg: SFTTrainConfig,
                  tx: optax.GradientTransformation, schedule: optax.Schedule
                  ) -> tuple[Callable[[TrainState, Any], tuple[TrainState, dict]], str]:
  """(train_step, objective name) for this model and config; jit it with compile_train_step."""
  objective = resolve_objective(config, cfg.objective)
  step = make_train_step(make_sft_loss(graphdef, objective, cfg), tx, schedule,
                         compute_dtype=jnp.dtype(config.dtype),
                         grad_accum_steps=cfg.grad_accum_steps)
  return step, objective
