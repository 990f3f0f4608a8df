"""The shipped reward functions and presets; `RewardConfig` selects and tunes them from a config file.

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
                It is never evidence of correctness; `preset_for_servers` picks it when no
                verifier target reports a GPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import extract
from dice_jax.rewards.shaping import (DEFAULT_EXCLUDED, HackPolicy, RewardComponent, RewardFn,
                                      RewardShaper)

Preset = Literal["default", "dice_binary", "compile_only"]
PRESET_WEIGHTS: dict[str, dict[str, float]] = {
    "default": {"format": 0.1, "compile": 0.2, "correct": 1.0, "speedup": 0.5},
    "dice_binary": {"correct": 1.0},
    "compile_only": {"format": 0.2, "compile": 1.0},
}


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


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Reward settings (a config section). `weights`/`normalize` override the preset per component;
  a weight of 0 keeps a component logged but out of the total."""

  preset: Preset = "default"
  weights: dict[str, float] = dataclasses.field(default_factory=dict)
  normalize: dict[str, str] = dataclasses.field(default_factory=dict)
  hack_mode: Literal["zero", "penalty", "ignore"] = "zero"
  hack_penalty: float = 1.0
  speedup_min_log2: float = -1.0
  speedup_max_log2: float = 2.0

  def __post_init__(self):
    if self.preset not in PRESET_WEIGHTS:
      raise ValueError(f"reward preset must be one of {sorted(PRESET_WEIGHTS)}, got {self.preset!r}")
    known = set(_functions(self))
    for field in ("weights", "normalize"):
      unknown = set(getattr(self, field)) - known
      if unknown:
        raise ValueError(f"rewards.{field}: unknown components {sorted(unknown)}; known: {sorted(known)}")


def _functions(config: RewardConfig) -> dict[str, RewardFn]:
  return {"format": format_reward, "compile": compile_reward, "correct": correctness_reward,
          "speedup": speedup_reward(config.speedup_min_log2, config.speedup_max_log2),
          "kernel_share": kernel_share_reward}


def make_shaper(config: RewardConfig = RewardConfig(),
                extra: Sequence[RewardComponent] = ()) -> RewardShaper:
  """The preset's components with the config's overrides, plus user components in `extra`."""
  functions = _functions(config)
  weights = PRESET_WEIGHTS[config.preset] | config.weights
  components = [RewardComponent(name, functions[name], weight, config.normalize.get(name, "none"))
                for name, weight in weights.items()]
  exclude = DEFAULT_EXCLUDED - {pb.NO_GPU} if config.preset == "compile_only" else DEFAULT_EXCLUDED
  hack = HackPolicy(mode=config.hack_mode, penalty=config.hack_penalty)
  return RewardShaper([*components, *extra], hack=hack, exclude=exclude)


def preset(name: Preset) -> RewardShaper:
  """A preset with its default settings: `preset("dice_binary")`."""
  return make_shaper(RewardConfig(preset=name))


def preset_for_servers(infos: Mapping[str, Any]) -> Preset:
  """"compile_only" unless some reachable verifier reports a GPU, then "default"."""
  has_gpu = any(isinstance(info, pb.ServerInfo) and len(info.gpus) > 0 for info in infos.values())
  return "default" if has_gpu else "compile_only"
