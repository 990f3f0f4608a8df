"""`dice train`'s configuration: one frozen dataclass per section.

`RLConfig()`'s defaults are a small run that unit tests build configs from: a 64-wide random
SDAR-layout model with the byte tokenizer, the problem set bundled with dice_jax (`bundled:tiny`),
a verifier started on loopback, three phase-1 steps then three phase-2 steps. `dice train` with no
`--config` applies `dice_jax.cli.train.BUILT_IN_RUN` on top of them (the built-in `tiny` run, warm
start included), which `configs/tiny.yaml` spells out (tests/rl/test_rl_train_cli.py keeps the two
equal); the SDAR recipes (`configs/dice_sdar_*.yaml`) override them.

Sections (dotted `key=value` overrides address them): model, data, rollout, algo, train,
curriculum, rewards, verifier, pipeline, kl_guard, optimizer, mesh, distributed, checkpoint, logging.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.checkpoints import CheckpointConfig
from dice_jax.config import require, require_file
from dice_jax.data.problems import ProblemLoadError, check_source
from dice_jax.distributed import DistributedConfig, MeshConfig
from dice_jax.metrics_log import LoggingConfig
from dice_jax.rewards.defaults import RewardConfig
from dice_jax.rl.update import AlgoSection
from dice_jax.rl.warm_start import WarmStartSection
from dice_jax.sampler.config import Mode, SamplerConfig
from dice_jax.train.model_setup import ModelSection
from dice_jax.train.optim import OptimizerConfig
from dice_jax.verifier.defaults import PrecisionName, TRAINING
from dice_jax.verifier.options import verify_options


BUILTIN_TEMPLATE_PREFIX = "builtin:"

# config.json fields of the tiny random model: SDAR layout (Qwen3 + block diffusion, block 4) over
# the byte tokenizer's 260 ids (256 bytes, <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258,
# <|MASK|> 259), padded to 264 rows.
TINY_MODEL_INIT = {
    "model_type": "sdar", "vocab_size": 264, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "block_size": 4, "mask_token_id": 259, "eos_token_id": 258, "pad_token_id": 256,
    "rope_theta": 10000.0, "max_position_embeddings": 4096,
}


def _tiny_model() -> ModelSection:
  return ModelSection(init=dict(TINY_MODEL_INIT), tokenizer="builtin:bytes", dtype="float32",
                      param_dtype="float32")


def _check_source(path: str, key: str) -> None:
  try:
    check_source(path)
  except ProblemLoadError as e:
    require(False, key, str(e))


@dataclasses.dataclass(frozen=True)
class DataSection:
  # Problem files (DICE JSON/JSONL, KernelBench dirs, or `bundled:<name>`). Phase 1 needs items
  # with a prefix/middle/suffix scaffold; phase 2 takes any problem (reference only).
  phase1_files: tuple[str, ...] = ("bundled:tiny",)
  phase2_files: tuple[str, ...] = ("bundled:tiny",)
  # Prompt tokens (chat template applied); the sampler's static prompt width. Problems whose prompt
  # is longer are left out at start-up (the count is logged; none left is an error).
  max_prompt_length: int = 1280
  # Prompt templates: null (dice_jax.data.prompts' defaults), `builtin:compact` (short prompts for
  # byte-level tiny models), or a YAML file with `user` (and `system`) templates.
  infilling_template: str | None = "builtin:compact"
  end_to_end_template: str | None = "builtin:compact"
  seed: int = 0
  backend: Literal["auto", "grain", "numpy"] = "auto"

  def __post_init__(self):
    for phase in (1, 2):
      for i, path in enumerate(getattr(self, f"phase{phase}_files")):
        _check_source(path, f"phase{phase}_files[{i}]")
    require(self.max_prompt_length > 0, "max_prompt_length", f"must be > 0, got {self.max_prompt_length}")
    for key in ("infilling_template", "end_to_end_template"):
      value = getattr(self, key)
      if value is not None and not value.startswith(BUILTIN_TEMPLATE_PREFIX):
        require_file(value, key)
      if value is not None and value.startswith(BUILTIN_TEMPLATE_PREFIX):
        require(value == "builtin:compact", key, f"unknown built-in template {value!r} (have: builtin:compact)")


@dataclasses.dataclass(frozen=True)
class RolloutSection(SamplerConfig):
  """How responses are sampled and how many per step.

  A dice_jax.sampler.SamplerConfig (every key of it, the same knobs as `dice eval`/`dice generate`
  flags; only two defaults differ) plus the rollout batch. `eos_ids: null` stops at the model's,
  the tokenizer's and the chat end-of-turn ids.
  """
  gen_length: int = 32  # new tokens; DICE: 4096
  mode: Mode = "dynamic"  # DICE's: commit every token with confidence >= threshold
  prompts_per_step: int = 2  # DICE: 64
  group_size: int = 4  # responses per prompt (G); DICE: 16
  # Rows per sampler call (a multiple of the data x fsdp devices); null: all rows in one call.
  batch_size: int | None = None
  seed: int = 0
  # DAPO's dynamic sampling (dice_jax.rl.dynamic): groups whose rewards are all equal are dropped
  # and the step's batch refilled from up to `max_refills` more rollouts of prompts_per_step prompts.
  dynamic_sampling: bool = False
  max_refills: int = 2

  def __post_init__(self):
    super().__post_init__()
    for key in ("prompts_per_step", "group_size"):
      require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")
    require(self.max_refills >= 0, "max_refills", f"must be >= 0, got {self.max_refills}")
    require(self.group_size >= 2, "group_size", f"group advantages need >= 2 responses per prompt, got "
            f"{self.group_size}")
    rows = self.prompts_per_step * self.group_size
    require(self.batch_size is None or (self.batch_size > 0 and rows % self.batch_size == 0), "batch_size",
            f"must divide prompts_per_step x group_size = {rows}, got {self.batch_size}")


@dataclasses.dataclass(frozen=True)
class TrainSection:
  steps: int = 6  # RL steps (one rollout batch each); DICE: 20 phase-1 + 100 phase-2
  num_minibatches: int = 2  # optimizer updates per rollout batch (PPO-style); DICE: 4
  grad_accum_steps: int = 1  # micro-batches per optimizer update
  seed: int = 0  # the update's RNG (rollouts use rollout.seed)
  export_hf: bool = True  # write the final policy in Hugging Face layout to <run_dir>/hf

  def __post_init__(self):
    for key in ("steps", "num_minibatches", "grad_accum_steps"):
      require(getattr(self, key) > 0, key, f"must be > 0, got {getattr(self, key)}")


@dataclasses.dataclass(frozen=True)
class CurriculumSection:
  """Phase 1 (infilling) then phase 2 (end to end); see dice_jax.rl.curriculum."""
  schedule: Literal["steps", "metric"] = "steps"
  # steps: the switch happens after this many steps. metric: at most this many (null: no limit).
  phase1_steps: int | None = 3
  metric: str = "phase1/reward/total"  # metric schedule: switch once its window mean >= threshold
  threshold: float = 0.5
  window: int = 3  # steps averaged for the metric schedule
  min_phase1_steps: int = 0  # metric schedule: never switch before this many phase-1 steps
  ramp_steps: int = 0  # after the switch, phase 2's share of prompts grows linearly over this many steps

  def __post_init__(self):
    require(self.phase1_steps is None or self.phase1_steps >= 0, "phase1_steps",
            f"must be >= 0 or null, got {self.phase1_steps}")
    require(self.schedule == "metric" or self.phase1_steps is not None, "phase1_steps",
            "the steps schedule needs a number of phase-1 steps")
    require(self.window > 0, "window", f"must be > 0, got {self.window}")
    require(self.min_phase1_steps >= 0, "min_phase1_steps", f"must be >= 0, got {self.min_phase1_steps}")
    require(self.ramp_steps >= 0, "ramp_steps", f"must be >= 0, got {self.ramp_steps}")


@dataclasses.dataclass(frozen=True)
class VerifierSection:
  # `local` (a `dice-verifier serve` subprocess on loopback for this run) or HOST:PORT targets.
  targets: tuple[str, ...] = ("local",)
  # Client timeouts and window: dice_jax.verifier.defaults.TRAINING says why these values.
  connect_timeout_s: float = TRAINING.connect_timeout_s
  request_timeout_s: float = TRAINING.request_timeout_s  # per request, send to verdict
  max_in_flight: int = TRAINING.max_in_flight_per_stream
  auth_token_file: str | None = None
  precision: PrecisionName = "fp32"
  num_correctness_trials: int = 0  # 0: the server's default
  # Timed trials per side, each a cold and a warm call; 0: the server's default (100, KernelBench's
  # count, which `dice eval` keeps). Fewer shorten the GPU's timing lock per verdict.
  num_timing_trials: int = 0
  atol: float = 0.0  # correctness tolerances; 0: the server's per-precision default (fp32 1e-4)
  rtol: float = 0.0
  skip_timing: bool = False  # correctness only (DICE's binary reward needs no timing)
  local_cache_dir: str | None = None  # compile cache of a local verifier (null: its default)
  # Streams per target: give a `dns:///name:port` target (round-robin over its addresses) several.
  streams_per_target: int = 1
  # TLS to the farm (system roots, or tls_root_certs_file); mTLS with a client certificate and key.
  tls: bool = False
  tls_root_certs_file: str | None = None
  tls_client_cert_file: str | None = None
  tls_client_key_file: str | None = None
  tls_server_name: str | None = None  # override the name checked against the server's certificate

  def __post_init__(self):
    require(bool(self.targets), "targets", "needs `local` or at least one HOST:PORT")
    require(self.targets == ("local",) or "local" not in self.targets, "targets",
            "`local` cannot be combined with remote targets")
    require(self.connect_timeout_s > 0 and self.request_timeout_s > 0, "request_timeout_s", "timeouts must be > 0")
    require(self.max_in_flight > 0, "max_in_flight", f"must be > 0, got {self.max_in_flight}")
    require(self.num_correctness_trials >= 0, "num_correctness_trials", "must be >= 0")
    require(self.num_timing_trials >= 0, "num_timing_trials", "must be >= 0")
    require(self.atol >= 0 and self.rtol >= 0, "atol", "tolerances must be >= 0")
    require(self.streams_per_target >= 1, "streams_per_target", f"must be >= 1, got {self.streams_per_target}")
    require((self.tls_client_cert_file is None) == (self.tls_client_key_file is None), "tls_client_cert_file",
            "and tls_client_key_file must be given together")

  def options(self) -> pb.VerifyOptions:
    """What every request of a run asks the verifier for (precision, trials, tolerances, timing)."""
    return verify_options(precision=self.precision, trials=self.num_correctness_trials, atol=self.atol,
                          rtol=self.rtol, skip_timing=self.skip_timing, timing_trials=self.num_timing_trials)


@dataclasses.dataclass(frozen=True)
class PipelineSection:
  # Sample step k+1 (with the params that existed before update k) while step k is verified; its
  # update corrects for that staleness as algo.stale_correction says. Off: strictly on-policy, the
  # accelerator idles while kernels compile.
  overlap: bool = True


@dataclasses.dataclass(frozen=True)
class KLGuardSection:
  """What happens when an update's mean KL (the `kl` metric, algo.kl_estimator against
  algo.kl_reference) exceeds `max_kl`: `cut_lr` multiplies the learning rate by `lr_factor` for the
  rest of the run, `stop` ends it with exit code 5, keeping the last checkpoint (dice_jax.rl.guard)."""
  max_kl: float | None = 1.0  # null: no guard
  action: Literal["cut_lr", "stop"] = "cut_lr"
  lr_factor: float = 0.5

  def __post_init__(self):
    require(self.max_kl is None or self.max_kl > 0, "max_kl", f"must be > 0 or null, got {self.max_kl}")
    require(0 < self.lr_factor < 1, "lr_factor", f"must be in (0, 1), got {self.lr_factor}")


@dataclasses.dataclass(frozen=True)
class RLLoggingSection(LoggingConfig):
  # Per step, this many completions of each phase are written to <run_dir>/samples/step_<N>.jsonl
  # with their verdict's outcome and message and their reward components (0: none).
  samples_per_phase: int = 2

  def __post_init__(self):
    super().__post_init__()
    require(self.samples_per_phase >= 0, "samples_per_phase", f"must be >= 0, got {self.samples_per_phase}")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Everything `dice train` reads; the defaults are the `tiny` run."""
  run_dir: str = "runs/tiny"
  model: ModelSection = dataclasses.field(default_factory=_tiny_model)
  warm_start: WarmStartSection = dataclasses.field(default_factory=WarmStartSection)  # a random model's SFT first
  data: DataSection = dataclasses.field(default_factory=DataSection)
  rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
  algo: AlgoSection = dataclasses.field(default_factory=AlgoSection)
  train: TrainSection = dataclasses.field(default_factory=TrainSection)
  curriculum: CurriculumSection = dataclasses.field(default_factory=CurriculumSection)
  rewards: RewardConfig = dataclasses.field(default_factory=lambda: RewardConfig(preset="auto"))
  verifier: VerifierSection = dataclasses.field(default_factory=VerifierSection)
  pipeline: PipelineSection = dataclasses.field(default_factory=PipelineSection)
  kl_guard: KLGuardSection = dataclasses.field(default_factory=KLGuardSection)
  # Warm-up in optimizer updates (train.steps x train.num_minibatches of them in a run).
  optimizer: OptimizerConfig = dataclasses.field(
      default_factory=lambda: OptimizerConfig(lr=1e-3, schedule="constant", warmup_steps=2, max_grad_norm=1.0))
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=lambda: CheckpointConfig(every_steps=3, keep=2))
  logging: RLLoggingSection = dataclasses.field(default_factory=lambda: RLLoggingSection(
      every_steps=1, console_metrics=("reward", "compile", "correct", "speedup", "kl")))

  def __post_init__(self):
    require(self.curriculum.phase1_steps == 0 or bool(self.data.phase1_files), "curriculum.phase1_steps",
            "phase-1 steps need data.phase1_files")
    phase2_needed = self.curriculum.schedule == "metric" or self.curriculum.phase1_steps < self.train.steps
    require(not phase2_needed or bool(self.data.phase2_files), "data.phase2_files",
            "the curriculum reaches phase 2, which needs data.phase2_files")
    rows = self.rollout.prompts_per_step * self.rollout.group_size
    require(rows % self.train.num_minibatches == 0, "train.num_minibatches",
            f"must divide the {rows} rows of a step (prompts_per_step x group_size)")
    require(rows // self.train.num_minibatches % self.train.grad_accum_steps == 0, "train.grad_accum_steps",
            f"must divide the {rows // self.train.num_minibatches} rows of a minibatch")
