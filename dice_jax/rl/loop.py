"""The RL run: rollout -> verify -> rewards -> update, pipelined, checkpointed, logged.

Step k (k = 0 .. train.steps-1) is one rollout batch and one `update_step` call:

    behaviour params θ_k ──sample──► R_k ──verify──► rewards_k ──update──► θ_{k+1}

With `pipeline.overlap` the loop samples R_{k+1} with θ_k (the params before update k) and submits
it to the verifier *before* waiting for R_k's verdicts, so the accelerator samples while the
verifier compiles; update k then runs, and R_{k+1}'s ratio is taken against the log-probs θ_k
recorded (one step off-policy). Update k+1 then re-scores R_{k+1} under θ_{k+1} and takes its
clipped ratio against those log-probs, weighting each token by a truncated importance weight from
θ_k to θ_{k+1} (`algo.stale_correction=decoupled`, dice_jax.rl.update says why). Without overlap
every rollout is sampled with the newest params and the accelerator idles during verification.
Either way the *old* log-probs in a batch are those of the params that sampled it.
`timing/wait_frac` is the fraction of each step the loop sat blocked on verdicts with nothing
queued on the accelerator.

With `rollout.dynamic_sampling`, groups whose rewards are all equal are replaced before the update
by informative groups of up to `rollout.max_refills` extra rollouts of the same step, sampled with
the current params and verified then (dice_jax.rl.dynamic). After each update the KL spike guard
(dice_jax.rl.guard, the `kl_guard` section) may cut the learning rate or stop the run.

Checkpoints (params, optimizer, RNG, step, data-stream position, curriculum state) are taken with
nothing in flight: before a scheduled checkpoint step, or when asked to stop, the loop does not
pre-sample, so a killed run restarted with the same command continues exactly as it would have.
If a save happens at another step (a preemption notice), the data position and curriculum state
saved are those from before the in-flight rollout was drawn, and the resumed run re-samples it
on-policy: the same run, one rollout fresher.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax import distributed, sharding
from dice_jax.config import to_yaml
from dice_jax.data.rl_data import REWARD_COLUMNS, collate
from dice_jax.metrics_log import MetricsLogger, truncate_jsonl
from dice_jax.model import hf_io
from dice_jax.rewards import defaults
from dice_jax.rewards.shaping import RewardComponent
from dice_jax.rl import dynamic, rewarding, samples, setup, summary
from dice_jax.rl.config import RLConfig
from dice_jax.rl.curriculum import Curriculum
from dice_jax.rl.guard import KLGuard
from dice_jax.rl.rollout import InFlight, RolloutEngine
from dice_jax.train.optim import cast_floating
from dice_jax.train.step import TrainingDiverged

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RLResult:
  status: str  # "done" | "stopped" (asked to stop; checkpoint saved) | "preempted"
  step: int
  start_step: int
  history: list[dict[str, float]]  # every logged step's metrics, this process
  run_dir: str
  hf_dir: str | None
  verifier: str  # what the verifier said about itself


@dataclasses.dataclass(frozen=True)
class _Saved:
  """A data-stream position captured earlier (a Checkpointer `data_iterator` stand-in)."""
  state: dict[str, Any]

  def get_state(self) -> dict[str, Any]:
    return self.state


def run_rl(cfg: RLConfig, *, should_stop: Callable[[], bool] = lambda: False,
           reward_components: Sequence[RewardComponent] = (),
           verifier: concurrent.futures.Future | None = None) -> RLResult:
  """Trains (or resumes) per `cfg`. `reward_components` join the configured reward shaping.
  `verifier`: a connection already being started (setup.start_verifier), which the run closes."""
  run_dir = os.path.abspath(os.path.expanduser(cfg.run_dir))
  distributed.initialize(cfg.distributed)
  primary = distributed.is_primary()
  config_text = to_yaml(cfg)
  if primary:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as f:
      f.write(config_text)
  with setup.Run(cfg, run_dir, verifier) as run:
    shaper = defaults.make_shaper(cfg.rewards, reward_components, has_gpu=run.connection.has_gpu)
    log.info("verifier: %s; reward components: %s", run.connection.describe(),
             ", ".join(f"{c.name}x{c.weight:g}" for c in shaper.components))
    if not run.connection.has_gpu and pb.NO_GPU in shaper.exclude:
      log.warning("no verifier target has a GPU, so every compiled candidate gets NO_GPU, which this reward "
                  "excludes: nothing will be learned. Use a GPU verifier, or rewards.preset=compile_only")
    engine = RolloutEngine(cfg, run.graphdef, run.spec, run.sampling, run.mesh, run.tokenizer, run.book,
                           run.connection.client, run.verify_options, run.ref_params)
    loop = _Loop(cfg, run, engine, shaper, should_stop)
    if primary:  # a resumed run redoes the steps after its checkpoint
      truncate_jsonl(os.path.join(run_dir, summary.SPEEDUPS_FILE), run.start)
      samples.drop_after(run_dir, run.start)
    with MetricsLogger(run_dir=run_dir, total_steps=cfg.train.steps, start_step=run.start, cfg=cfg.logging,
                       title="dice train", config_text=config_text, enabled=primary,
                       summary_keys=summary.SUMMARY_METRICS) as logger:
      status = loop.train(logger)
    run.checkpointer.wait()
    hf_dir = None
    if status == "done" and cfg.train.export_hf and loop.step > run.start:
      hf_dir = os.path.join(run_dir, "hf")
      hf_io.save_pretrained(nnx.merge(run.graphdef, loop.state.params), hf_dir, dtype=cfg.model.dtype,
                            tokenizer_dir=run.tokenizer_dir)
    return RLResult(status=status, step=loop.step, start_step=run.start, history=loop.history, run_dir=run_dir,
                    hf_dir=hf_dir, verifier=run.connection.describe())


class _Loop:
  """The step loop's state: train state, in-flight rollout, curriculum, metric history."""

  def __init__(self, cfg: RLConfig, run: setup.Run, engine: RolloutEngine, shaper, should_stop):
    self.cfg, self.run, self.engine, self.shaper, self.should_stop = cfg, run, engine, shaper, should_stop
    self.state, self.step = run.state, run.start
    self.curriculum = Curriculum(cfg.curriculum, cfg.rollout.prompts_per_step, jax.process_count())
    self.curriculum.load_state_dict(run.meta.get("curriculum", {}))
    self.counts: dict[int, tuple[int, int]] = {}
    self.history: list[dict[str, float]] = []
    self.batch_sharding = sharding.batch_sharding(run.mesh, 1)
    self.compute_dtype = jnp.dtype(cfg.model.dtype)
    self.guard = KLGuard(cfg.kl_guard)

  def _scheduled(self, step: int) -> bool:
    return step % self.cfg.checkpoint.every_steps == 0 or step == self.cfg.train.steps

  def _launch(self, step: int) -> InFlight:
    """Draws step `step`'s prompts and starts its rollout with the current params."""
    n1, n2 = self.counts[step] = self.curriculum.counts(step)
    unit = jax.process_count()
    items = self.run.stream.next_batch(n1 // unit, n2 // unit)
    return self.engine.start(step, cast_floating(self.state.params, self.compute_dtype), items)

  def train(self, logger: MetricsLogger) -> str:
    total = self.cfg.train.steps
    current = self._launch(self.step) if self.step < total else None
    data_state, curriculum_state = self.run.stream.get_state(), self.curriculum.state_dict()
    while self.step < total:
      t0 = time.perf_counter()
      stop = self.should_stop()
      nxt = None
      if (self.cfg.pipeline.overlap and not stop and self.step + 1 < total
          and not self._scheduled(self.step + 1)):
        data_state, curriculum_state = self.run.stream.get_state(), self.curriculum.state_dict()
        nxt = self._launch(self.step + 1)  # with θ_k: overlaps the verification of step k
      t_wait = time.perf_counter()
      verdicts = current.verdicts.result()
      wait_s = time.perf_counter() - t_wait
      metrics = self._update(current, verdicts, logger)
      self.step += 1
      self.curriculum.observe(current.step, metrics)
      if nxt is None:  # drained: what is saved now is exactly the state after this update
        data_state, curriculum_state = self.run.stream.get_state(), self.curriculum.state_dict()
      else:  # a preemption save keeps the position from before `nxt` was drawn (see module doc)
        curriculum_state = {**self.curriculum.state_dict(), "switch_step": curriculum_state["switch_step"]}
      step_s = time.perf_counter() - t0
      metrics |= {"timing/step_s": step_s, "timing/sample_s": current.sample_s, "timing/wait_s": wait_s,
                  "wait_frac": wait_s / step_s if step_s > 0 else 0.0}
      self._log(logger, metrics, current)
      self.run.checkpointer.save(self.step, self.state, data_iterator=_Saved(data_state),
                                 force=stop or self.step == total,
                                 meta={"step": self.step, "curriculum": curriculum_state})
      if stop:
        return "stopped"
      if self.run.checkpointer.reached_preemption(self.step):
        return "preempted"
      current = nxt if nxt is not None else (self._launch(self.step) if self.step < total else None)
    return "done"

  def _score(self, rollout: InFlight, verdicts) -> rewarding.Scored:
    g = self.cfg.rollout.group_size
    return rewarding.score(self.shaper, rollout.prompts, rollout.completions, verdicts,
                           collate(rollout.items, g, REWARD_COLUMNS), [i // g for i in range(len(rollout.completions))])

  def _refill(self, step: int, refill: int) -> dynamic.Sampled:
    """The step's `refill`-th extra rollout (dynamic sampling): drawn, sampled with the current
    params, verified and scored before the update."""
    n1, n2 = self.counts[step]
    items = self.run.stream.next_batch(n1, n2)
    extra = self.engine.start(step, cast_floating(self.state.params, self.compute_dtype), items, refill=refill)
    return dynamic.Sampled(extra, self._score(extra, extra.verdicts.result()))

  def _update(self, current: InFlight, verdicts, logger: MetricsLogger) -> dict[str, float]:
    g = self.cfg.rollout.group_size
    scored = self._score(current, verdicts)
    if logger.enabled and self.cfg.logging.samples_per_phase:
      columns = collate(current.items, g, REWARD_COLUMNS)
      rows = samples.pick_rows(columns["phase"], g, self.cfg.logging.samples_per_phase)
      samples.write_step(logger.run_dir, current.step + 1, rows, labels=scored.labels, verdicts=verdicts,
                         completions=current.completions, columns=columns, total=scored.result.total,
                         valid=scored.result.valid, components=scored.result.components)
    extra: dict[str, float] = {}
    if self.cfg.rollout.dynamic_sampling:
      filled = dynamic.fill(dynamic.Sampled(current, scored), lambda r: self._refill(current.step, r),
                            groups=self.cfg.rollout.prompts_per_step, group_size=g,
                            max_refills=self.cfg.rollout.max_refills, reward_array=self.engine.reward_array)
      batch, extra = filled.batch, filled.metrics
    else:
      batch = dataclasses.replace(current.batch, rewards=self.engine.reward_array(scored.result.total, "float32"),
                                  reward_valid=self.engine.reward_array(scored.result.valid, "bool"))
    batch = jax.device_put(batch, self.batch_sharding)
    self.state, device_metrics = self.run.compiled(self.state, batch)
    metrics = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    if not math.isfinite(metrics["loss"]):
      raise TrainingDiverged(f"loss is {metrics['loss']} at step {current.step + 1}; the last good checkpoint is "
                             f"step {self.run.checkpointer.latest_step()}")
    self.state, guarded = self.guard.check(current.step + 1, metrics, self.state,
                                           last_checkpoint=self.run.checkpointer.latest_step())
    metrics |= extra | guarded
    if len(scored.speedups):
      logger.histogram(current.step + 1, "speedup_dist", scored.speedups)
      if logger.enabled:
        summary.append_speedups(logger.run_dir, current.step + 1, scored.speedups)
    return metrics | scored.metrics

  def _log(self, logger: MetricsLogger, metrics: Mapping[str, float], current: InFlight) -> None:
    n1, n2 = self.counts[current.step]
    metrics = dict(metrics) | {
        "curriculum/phase2_share": n2 / (n1 + n2), "rollout/length_mean": float(current.lengths.mean()),
        "rollout/finished_frac": float(current.finished.mean())}
    if current.logprob_mismatch is not None:
      metrics["rollout/logprob_mismatch"] = current.logprob_mismatch
    self.history.append({"step": self.step, **metrics})
    logger.advance(self.step)
    if self.step % self.cfg.logging.every_steps == 0 or self.step == self.cfg.train.steps:
      logger.write(self.step, metrics)
