"""The SFT run: config -> mesh, model, data, optimizer -> compiled step -> loop with checkpoints.

Host code only moves data: each step feeds one global batch (every process its own rows) to the
step compiled at start-up, and every `logging.every_steps` fetches the metrics. A run resumes from
the latest checkpoint in its directory (params, optimizer, RNG, data position), so a killed run
started again with the same command continues with the same losses it would have had.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from dice_jax import distributed, sharding
from dice_jax.checkpoints import CheckpointConfig, Checkpointer
from dice_jax.config import ConfigError, to_yaml
from dice_jax.data import sft_data
from dice_jax.data.sft_data import SFTDataConfig
from dice_jax.distributed import DistributedConfig, MeshConfig
from dice_jax.metrics_log import LoggingConfig, MetricsLogger
from dice_jax.model import hf_io
from dice_jax.train import model_setup
from dice_jax.train.model_setup import ModelSection
from dice_jax.train.optim import OptimizerConfig, make_optimizer
from dice_jax.train.sft_step import SFTTrainConfig, make_sft_step
from dice_jax.train.step import TrainingDiverged, compile_train_step
from dice_jax.train.train_state import abstract_state, create_train_state, state_shardings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Everything `dice sft` reads: `configs/sft_*.yaml` plus `key=value` overrides."""
  model: ModelSection
  data: SFTDataConfig
  run_dir: str = "runs/sft"  # checkpoints/, tensorboard/, metrics.jsonl, config.yaml, hf/
  train: SFTTrainConfig = dataclasses.field(default_factory=SFTTrainConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
  logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)


@dataclasses.dataclass(frozen=True)
class SFTResult:
  status: str  # "done" | "stopped" (asked to stop, checkpoint saved) | "preempted" (likewise)
  step: int
  start_step: int
  metrics: dict[str, float]
  run_dir: str
  hf_dir: str | None


def _check_batch(cfg: SFTConfig, mesh: jax.sharding.Mesh) -> None:
  ways = mesh.shape["data"] * mesh.shape["fsdp"]
  micro = cfg.data.batch_size // cfg.train.grad_accum_steps
  if cfg.data.batch_size % cfg.train.grad_accum_steps or micro % ways:
    raise ConfigError(f"data.batch_size={cfg.data.batch_size} must split into "
                      f"train.grad_accum_steps={cfg.train.grad_accum_steps} micro-batches, each "
                      f"divisible by the data x fsdp mesh size {ways}")


def run_sft(cfg: SFTConfig, *, should_stop: Callable[[], bool] = lambda: False) -> SFTResult:
  """Trains (or resumes training) per `cfg`; returns how the run ended."""
  run_dir = os.path.abspath(os.path.expanduser(cfg.run_dir))
  distributed.initialize(cfg.distributed)
  primary = distributed.is_primary()
  mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
  _check_batch(cfg, mesh)
  config_text = to_yaml(cfg)
  if primary:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as f:
      f.write(config_text)

  tokenizer, tokenizer_dir = model_setup.tokenizer_for(cfg.model, run_dir)
  config = model_setup.model_config(cfg.model)
  model_setup.check_compatible(config, tokenizer)
  data = sft_data.tokenize_files(cfg.data, tokenizer)
  log.info("SFT data: %s", sft_data.describe(data, cfg.data.train_files))
  iterator = sft_data.make_iterator(data, cfg.data, tokenizer.pad_id,
                                    process_index=jax.process_index(),
                                    process_count=jax.process_count())

  tx, schedule = make_optimizer(cfg.optimizer, cfg.train.steps)
  graphdef, abstract_params, params_sharding = model_setup.abstract_params(config, mesh)
  shardings = state_shardings(tx, params_sharding, abstract_params, mesh)
  target = abstract_state(tx, abstract_params, shardings)
  checkpointer = Checkpointer.from_config(cfg.checkpoint, run_dir)
  try:
    if cfg.checkpoint.resume and checkpointer.latest_step() is not None:
      restored = checkpointer.restore(target, data_iterator=iterator)
      state, start = restored.state, restored.step
      log.info("resumed from %s at step %d", checkpointer.directory, start)
    else:
      params = model_setup.load_params(cfg.model, config, mesh)
      state, start = create_train_state(params, tx, cfg.train.seed, shardings), 0

    step_fn, objective = make_sft_step(graphdef, config, cfg.train, tx, schedule)
    batch_sharding = sharding.batch_sharding(mesh, 2)
    abstract_batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
                      for k, (shape, dtype) in sft_data.batch_spec(cfg.data).items()}
    log.info("compiling the %s SFT step for %s on mesh %s", objective, config.architecture,
             dict(mesh.shape))
    compiled = compile_train_step(step_fn, target, abstract_batch, shardings, batch_sharding, mesh)
    meta = {"objective": objective, "architecture": config.architecture}
    status, step, metrics, state = _loop(cfg, run_dir, compiled, state, start, iterator,
                                         batch_sharding, checkpointer, meta, config_text,
                                         primary, should_stop)
    checkpointer.wait()
  finally:
    checkpointer.close()
  hf_dir = None
  if status == "done" and cfg.train.export_hf and step > start:
    hf_dir = os.path.join(run_dir, "hf")
    hf_io.save_pretrained(nnx.merge(graphdef, state.params), hf_dir,
                          dtype=cfg.model.dtype, tokenizer_dir=tokenizer_dir)
  return SFTResult(status=status, step=step, start_step=start, metrics=metrics,
                   run_dir=run_dir, hf_dir=hf_dir)


def _loop(cfg: SFTConfig, run_dir: str, compiled: Any, state: Any, start: int, iterator: Any,
          batch_sharding: Any, checkpointer: Checkpointer, meta: dict, config_text: str,
          primary: bool, should_stop: Callable[[], bool]):
  """Steps until done or told to stop. Metrics are fetched (a device sync) only on logging
  steps and before each scheduled checkpoint, so a diverged state is never saved."""
  total = cfg.train.steps
  metrics: dict[str, float] = {}
  status = "done"
  step = start
  with MetricsLogger(run_dir=run_dir, total_steps=total, start_step=start, cfg=cfg.logging,
                     title="sft", config_text=config_text, enabled=primary) as logger:
    while step < total:
      if should_stop():
        status = "stopped"
        break
      batch = distributed.host_to_global(next(iterator), batch_sharding)
      state, step_metrics = compiled(state, batch)
      step += 1
      logger.advance(step)
      log_due = step % cfg.logging.every_steps == 0 or step == total
      if log_due or step % cfg.checkpoint.every_steps == 0:
        metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        if not math.isfinite(metrics["loss"]):
          last = checkpointer.latest_step()
          raise TrainingDiverged(f"loss is {metrics['loss']} at step {step}; " + (
              f"the last good checkpoint is step {last}" if last else "no checkpoint was saved"))
        if log_due:
          logger.write(step, metrics)
      checkpointer.save(step, state, data_iterator=iterator, meta={**meta, "step": step})
      if checkpointer.reached_preemption(step):
        status = "preempted"
        break
    if step not in checkpointer.all_steps() and step > start:
      checkpointer.save(step, state, data_iterator=iterator, meta={**meta, "step": step},
                        force=True)
  return status, step, metrics, state
