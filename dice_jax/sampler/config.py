"""SamplerConfig: how to decode (one frozen, hashable value: it is a static argument of the jit).

The one sampling-settings type of the project. The library takes it (`dj.sample`); `dice train`'s
`rollout` section IS one (dice_jax.rl.config.RolloutSection adds the rollout batch's keys); `dice
eval` and `dice generate` build one from flags named after its fields (dice_jax.cli.sampling); the
RL scorer reads the same settings resolved against the model (`Resolved`). A knob added here is a
knob of every command.

Commit rules, per denoising step of the current block (m = tokens still masked in this row's block,
T = steps_per_block, s = steps already taken in this block):
- `static`: commit the ceil(m / (T - s)) highest-confidence masked tokens. With m = block_size this
  is LLaDA/SDAR's schedule (block_size // T per step, the remainder first); T = block_size commits
  one token per step. A block always finishes within T steps.
- `dynamic`: commit every masked token whose confidence >= threshold, and at least the static
  count (so at least one, and the block still finishes within T steps).

Confidence is the probability of the sampled token under softmax(logits / temperature), before
top-k/top-p truncation: exp(the recorded log-probability). SDAR's reference `generate.py` uses the
truncated distribution instead, which makes every greedy (top_k=1) confidence 1.0 and the
"low-confidence" order arbitrary; with DICE's rollout settings (top_k=0, top_p=1) the two agree.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Literal

from dice_jax.config import ConfigError

if TYPE_CHECKING:  # only an annotation: reading SamplerConfig must not import JAX (see __init__.py)
  from dice_jax.model.config import ModelConfig

# The Literal types are written out (a type checker cannot read `Literal[A_TUPLE]`); the tuples are
# read from them, so the two cannot drift.
Mode = Literal["static", "dynamic"]
DecodeAttention = Literal["auto", "xla", "pallas"]
MODES: tuple[str, ...] = typing.get_args(Mode)
DECODE_ATTENTION: tuple[str, ...] = typing.get_args(DecodeAttention)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Decoding settings. Greedy decoding is top_k=1 (temperature then only scales the log-probs)."""
  gen_length: int = 256  # new tokens per sequence (the canvas's generated region)
  block_size: int | None = None  # None: the model's block_size (SDAR); 32 for bidirectional models
  steps_per_block: int | None = None  # None: block_size (one token per step in static mode)
  mode: Mode = "static"  # static | dynamic (see module docstring)
  threshold: float = 0.9  # dynamic mode: commit every token at least this confident
  temperature: float = 1.0  # > 0; the log-probs are those of softmax(logits / temperature)
  top_k: int = 0  # 0: off; 1: greedy
  top_p: float = 1.0  # nucleus sampling; 1.0: off
  eos_ids: tuple[int, ...] | None = None  # None: the model's eos_token_id; (): never stop early
  pad_id: int | None = None  # fills never-generated positions; None: model pad id, else eos, else 0
  max_length: int | None = None  # prompt + generation (+ suffix) limit; None: model max positions
  kv_cache: bool = True  # block models: exact KV cache; False recomputes the whole canvas each step
  decode_attention: DecodeAttention = "auto"  # cached attention: auto (Pallas on GPU) | xla | pallas

  def __post_init__(self):
    checks = [
        (self.gen_length >= 1, f"gen_length must be >= 1, got {self.gen_length}"),
        (self.block_size is None or self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}"),
        (self.steps_per_block is None or self.steps_per_block >= 1,
         f"steps_per_block must be >= 1, got {self.steps_per_block}"),
        (self.mode in MODES, f"mode={self.mode!r}; choose one of {MODES}"),
        (0.0 <= self.threshold, f"threshold must be >= 0, got {self.threshold}"),
        (self.temperature > 0, f"temperature must be > 0, got {self.temperature} (greedy decoding is top_k=1)"),
        (self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}"),
        (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
        (self.max_length is None or self.max_length >= 1, f"max_length must be >= 1, got {self.max_length}"),
        (self.decode_attention in DECODE_ATTENTION,
         f"decode_attention={self.decode_attention!r}; choose one of {DECODE_ATTENTION}"),
    ]
    for ok, message in checks:
      if not ok:  # a ConfigError (a ValueError) names the field first: `rollout.top_p must be ...`
        raise ConfigError(message)
    if self.eos_ids is not None:
      object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))

  def replace(self, **changes) -> SamplerConfig:
    return dataclasses.replace(self, **changes)

  @property
  def greedy(self) -> bool:
    return self.top_k == 1

  def describe(self) -> str:
    """"greedy (top_k=1); dynamic threshold 0.9; up to 4096 new tokens", for reports."""
    if self.greedy:
      how = "greedy (top_k=1)"
    else:
      how = f"temperature {self.temperature:g}, top_p {self.top_p:g}" + (
          f", top_k {self.top_k}" if self.top_k else "")
    rule = self.mode + (f" threshold {self.threshold:g}" if self.mode == "dynamic" else "")
    return f"{how}; {rule}; up to {self.gen_length} new tokens"


# DICE's rollout settings (block 4 and 4 steps per block come from an SDAR checkpoint): the
# defaults of `dice eval`, `dice generate` and KernelGenerator.
DICE_SAMPLING = SamplerConfig(gen_length=4096, mode="dynamic", threshold=0.9)


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A SamplerConfig's defaults filled in from one model's config (all static): what the sampler
  decodes with, and what the RL scorer (dice_jax.rl.scoring) needs to re-score its rollouts."""
  attention: str  # the model's: "block_causal" (SDAR) | "bidirectional" (LLaDA, Dream)
  block_size: int
  steps_per_block: int
  gen_length: int
  mask_id: int
  eos_ids: tuple[int, ...]
  pad_id: int
  max_length: int
  temperature: float
  logits_shift: bool = False  # Dream: position i's logits predict token i + 1


def resolve(config: SamplerConfig, model: ModelConfig) -> Resolved:
  """Fill defaults from the model and refuse combinations that cannot be decoded."""
  if model.attention not in ("block_causal", "bidirectional"):
    raise ValueError(f"{model.architecture} is a {model.attention} (autoregressive) model; the diffusion sampler "
                     "decodes block_causal (SDAR) and bidirectional (LLaDA, Dream) models")
  if model.mask_token_id is None:
    raise ValueError(f"{model.architecture} model config has no mask_token_id; diffusion decoding needs one")
  if model.attention == "block_causal":
    if config.block_size is not None and config.block_size != model.block_size:
      raise ValueError(f"block_size={config.block_size} differs from the model's block_size={model.block_size}: "
                       "a block-causal model decodes in the blocks its attention was trained with")
    if model.logits_shift:
      raise ValueError("shifted logits (Dream) are only supported for bidirectional models")
    block_size = model.block_size
  else:
    block_size = min(config.block_size or 32, config.gen_length)
  if config.eos_ids is not None:
    eos_ids = config.eos_ids
  else:
    eos_ids = () if model.eos_token_id is None else (model.eos_token_id,)
  pad_id = config.pad_id
  if pad_id is None:
    pad_id = next((i for i in (model.pad_token_id, *eos_ids) if i is not None), 0)
  max_length = config.max_length or model.max_position_embeddings
  if max_length > model.max_position_embeddings:
    raise ValueError(f"max_length={max_length} exceeds the model's max_position_embeddings="
                     f"{model.max_position_embeddings}")
  return Resolved(attention=model.attention, block_size=block_size,
                  steps_per_block=config.steps_per_block or block_size, gen_length=config.gen_length,
                  mask_id=model.mask_token_id, eos_ids=eos_ids, pad_id=pad_id, max_length=max_length,
                  temperature=config.temperature, logits_shift=model.logits_shift)
