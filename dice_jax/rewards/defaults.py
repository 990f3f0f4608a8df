"""The shipped reward functions and presets; `RewardConfig` selects and tunes them: the library's
argument and `dice train`'s `rewards` config section (one type).

Functions (each `fn(prompts, completions, verdicts, **item_columns) -> list[float]`):
  format       1 if the generation holds the code we asked for and it parses (phase 1: the
               `source = '''...'''` assignment; phase 2: a file defining `ModelNew`) and the
               verifier did not REJECT it; else 0. Without the last condition a plain-PyTorch
               `ModelNew` (which the verifier rejects as "no custom kernel") would still earn
               format credit: a reward hack the policy would find.
  compile      1 if the candidate compiled (also under NO_GPU, where only compilation ran).
  correct      1 if the verdict is OK: compiled and passed every correctness trial.
  speedup      for OK verdicts with timing: log2(speedup) clipped to [min_log2, max_log2]; else 0.
               Log scale, so 2x faster and 2x slower are symmetric; clipped, so one implausible
               timing cannot dominate a batch.
  kernel_share for OK verdicts: the share (0..1) of GPU kernel time in the candidate's own kernels
               (Verdict.custom_kernel_time_fraction); else 0. Optional (in no preset): under the
               verifier's default partial-replacement policy a candidate that keeps a cuBLAS
               matmul is correct, and this is how to pay more for writing the matmul too, e.g.
               `rewards: {weights: {kernel_share: 0.3}}`.

Presets:
  default       format 0.1 + compile 0.2 + correct 1.0 + speedup 0.5; hacks zeroed.
  dice_binary   DICE's reward: correct 1.0 only (1 if it compiles and is correct, else 0); no
                speedup term; hacks zeroed.
  compile_only  format 0.2 + compile 1.0, and NO_GPU verdicts count (they are excluded by the
                other presets): for verifiers without a GPU, such as the `tiny` config on a laptop.
                It is never evidence of correctness.
  auto          (`resolve_preset`) compile_only when no verifier target reports a GPU, else
                default: `dice train`'s default, decided once the verifier has answered.

`RewardConfig.custom` adds user functions by `module:function` (dice_jax.rewards.custom); `weights`
and `normalize` apply to shipped and custom components alike.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence
from typing import Literal

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.config import require
from dice_jax.data import extract
from dice_jax.rewards import custom as custom_lib
from dice_jax.rewards.custom import CustomReward
from dice_jax.rewards.shaping import (DEFAULT_EXCLUDED, HackPolicy, Normalize, RewardComponent, RewardFn,
                                      RewardShaper)

Preset = Literal["default", "dice_binary", "compile_only"]
PRESET_WEIGHTS: dict[str, dict[str, float]] = {
    "default": {"format": 0.1, "compile": 0.2, "correct": 1.0, "speedup": 0.5},
    "dice_binary": {"correct": 1.0},
    "compile_only": {"format": 0.2, "compile": 1.0},
}
AUTO = "auto"
SHIPPED = ("format", "compile", "correct", "speedup", "kernel_share")  # the functions below


def compiled(verdict: pb.Verdict) -> bool:
  """Whether compilation succeeded: reported directly, implied by a later stage, or NO_GPU."""
  return (verdict.compile.compiled or verdict.outcome in (pb.OK, pb.INCORRECT, pb.NO_GPU)
          or (verdict.stage >= pb.STAGE_LOAD and verdict.outcome != pb.INFRA_ERROR))


def format_reward(prompts, completions: Sequence[str], verdicts: Sequence[pb.Verdict], *,
                  phase: Sequence[int] | None = None, **_) -> list[float]:
  """1.0 if the generation contains the requested code, it parses, and it was not REJECTED."""
  del prompts
  if phase is None:
    raise ValueError("format_reward needs the `phase` item column (1 or 2 per completion)")
  out = []
  for text, p, verdict in zip(completions, phase, verdicts):
    found = extract.extract_middle(text) if p == 1 else extract.extract_end_to_end(text)
    out.append(1.0 if found.ok and verdict.outcome != pb.REJECTED else 0.0)
  return out


def compile_reward(prompts, completions, verdicts: Sequence[pb.Verdict], **_) -> list[float]:
  """1.0 if the candidate compiled."""
  del prompts, completions
  return [1.0 if compiled(v) else 0.0 for v in verdicts]


def correctness_reward(prompts, completions, verdicts: Sequence[pb.Verdict], **_) -> list[float]:
  """1.0 if the verdict is OK (compiled and correct on every trial)."""
  del prompts, completions
  return [1.0 if v.outcome == pb.OK else 0.0 for v in verdicts]


def speedup_reward(min_log2: float = -1.0, max_log2: float = 2.0) -> RewardFn:
  """log2(reference time / candidate time) of correct, timed kernels, clipped; 0 otherwise."""
  if not (math.isfinite(min_log2) and math.isfinite(max_log2) and min_log2 < max_log2):
    raise ValueError(f"speedup clip needs finite min_log2 < max_log2, got {min_log2}, {max_log2}")

  def speedup(prompts, completions, verdicts: Sequence[pb.Verdict], **_) -> list[float]:
    del prompts, completions
    out = []
    for v in verdicts:
      s = v.timing.speedup if v.outcome == pb.OK and v.HasField("timing") else 0.0
      out.append(min(max_log2, max(min_log2, math.log2(s))) if s > 0 and math.isfinite(s) else 0.0)
    return out

  return speedup


def kernel_share_reward(prompts, completions, verdicts: Sequence[pb.Verdict], **_) -> list[float]:
  """Share of GPU kernel time in the candidate's own kernels, for OK verdicts; 0 otherwise."""
  del prompts, completions
  return [min(1.0, max(0.0, v.custom_kernel_time_fraction)) if v.outcome == pb.OK else 0.0
          for v in verdicts]


def resolve_preset(preset: str, has_gpu: bool | None = None) -> Preset:
  """The preset to use: `auto` is compile_only unless a verifier has a GPU, then default."""
  if preset != AUTO:
    return typing.cast(Preset, preset)  # RewardConfig checked it is AUTO or a preset
  if has_gpu is None:
    raise ValueError("reward preset 'auto' depends on the verifier: give has_gpu")
  return "default" if has_gpu else "compile_only"


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Reward settings (the `rewards` section of `dice train`). `weights`/`normalize` override the
  preset per component, shipped or custom; a weight of 0 keeps a component logged but out of the
  total. `custom` adds user functions, in either form:
    rewards.custom=[myrewards:short,myrewards:tidy]        # names `short`, `tidy`; weight 1.0 each
    rewards.custom={short: {fn: "myrewards:short", weight: 0.1, normalize: group}}
  """

  preset: Literal["auto", "default", "dice_binary", "compile_only"] = "default"
  weights: dict[str, float] = dataclasses.field(default_factory=dict)
  normalize: dict[str, str] = dataclasses.field(default_factory=dict)
  hack_mode: Literal["zero", "penalty", "ignore"] = "zero"
  hack_penalty: float = 1.0
  speedup_min_log2: float = -1.0
  speedup_max_log2: float = 2.0
  custom: dict[str, CustomReward] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    presets = [AUTO, *PRESET_WEIGHTS]
    require(self.preset in presets, "preset", f"reward preset must be one of {presets}, got {self.preset!r}")
    clash = sorted(set(self.custom) & set(SHIPPED))
    require(not clash, "custom", f"names {clash} are taken by the shipped components")
    known = sorted({*SHIPPED, *self.custom})
    for field in ("weights", "normalize"):
      unknown = sorted(set(getattr(self, field)) - set(known))
      require(not unknown, field, f"unknown components {unknown}; known: {known}")
    for name, weight in self.weights.items():
      require(math.isfinite(weight), f"weights.{name}", f"must be finite, got {weight}")
    for name, mode in self.normalize.items():
      require(mode in ("none", "batch", "group"), f"normalize.{name}", f"must be none, batch or group, got {mode!r}")

  def custom_components(self) -> list[RewardComponent]:
    """The `custom` functions, imported now (a bad path fails here, naming its key)."""
    return [RewardComponent(name, custom_lib.load(spec.fn, name), self.weights.get(name, spec.weight),
                            self.normalize_of(name, spec.normalize)) for name, spec in self.custom.items()]

  def normalize_of(self, name: str, default: Normalize) -> Normalize:
    """Component `name`'s normalisation, `default` when unset. The values are typed `str` for the
    config loader (so __post_init__ words the error); __post_init__ checked each one."""
    return typing.cast(Normalize, self.normalize.get(name, default))


def _functions(config: RewardConfig) -> dict[str, RewardFn]:
  return {"format": format_reward, "compile": compile_reward, "correct": correctness_reward,
          "speedup": speedup_reward(config.speedup_min_log2, config.speedup_max_log2),
          "kernel_share": kernel_share_reward}


def make_shaper(config: RewardConfig = RewardConfig(), extra: Sequence[RewardComponent] = (), *,
                has_gpu: bool | None = None) -> RewardShaper:
  """The preset's components with the config's overrides, then the config's custom functions, then
  `extra`. `has_gpu` (whether a verifier has one) decides the `auto` preset."""
  preset = resolve_preset(config.preset, has_gpu)
  functions = _functions(config)
  weights = PRESET_WEIGHTS[preset] | {k: v for k, v in config.weights.items() if k in functions}
  components = [RewardComponent(name, functions[name], weight, config.normalize_of(name, "none"))
                for name, weight in weights.items()]
  exclude = DEFAULT_EXCLUDED - {pb.NO_GPU} if preset == "compile_only" else DEFAULT_EXCLUDED
  hack = HackPolicy(mode=config.hack_mode, penalty=config.hack_penalty)
  return RewardShaper([*components, *config.custom_components(), *extra], hack=hack, exclude=exclude)


def preset(name: Preset) -> RewardShaper:
  """A preset with its default settings: `preset("dice_binary")`."""
  return make_shaper(RewardConfig(preset=name))

