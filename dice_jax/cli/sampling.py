"""The sampling flags of `dice eval` and `dice generate`: one flag per SamplerConfig field.

The flag is the field's name (`--gen-length` sets `gen_length`, as `rollout.gen_length=` does for
`dice train`), so the three commands have the same knobs under the same names. Where an older
spelling exists it still works: `--max-new-tokens` is `--gen-length`, and `--decode-mode` stays
the name of `mode` (`dice eval --mode` chooses infilling or end to end). `eos_ids`, `pad_id` and
`max_length` come from the checkpoint (rollout keys of `dice train` can override them).
Defaults are DICE's rollout settings (dice_jax.sampler.config.DICE_SAMPLING).

Greedy decoding is the sampler's top_k=1. `--temperature 0` asks for it (the sampler's temperature
must be > 0, so it becomes top_k=1 at temperature 1), as does `dice eval` with one sample.
"""

from __future__ import annotations

import argparse
from typing import Any

from dice_jax.sampler.config import DECODE_ATTENTION, DICE_SAMPLING, MODES, SamplerConfig


def add_flags(group, defaults: SamplerConfig = DICE_SAMPLING) -> None:
  """Adds the sampling flags to an argparse parser or argument group."""
  d = defaults
  group.add_argument("--gen-length", "--max-new-tokens", dest="gen_length", type=int, default=d.gen_length,
                     metavar="N", help="new tokens per sample (default %(default)s, DICE's)")
  group.add_argument("--decode-mode", dest="decode_mode", choices=MODES, default=d.mode,
                     help="commit rule per denoising step (default %(default)s, as DICE)")
  group.add_argument("--threshold", type=float, default=d.threshold,
                     help="dynamic mode: commit every token this confident (default %(default)g)")
  group.add_argument("--temperature", type=float, default=d.temperature,
                     help="sampling temperature (default %(default)g); 0 = greedy (top_k 1)")
  group.add_argument("--top-k", type=int, default=d.top_k, help="0 = off (default), 1 = greedy")
  group.add_argument("--top-p", type=float, default=d.top_p, help="nucleus sampling (default %(default)g: off)")
  group.add_argument("--block-size", type=int, default=d.block_size,
                     help="bidirectional models only (block models decode in their own blocks)")
  group.add_argument("--steps-per-block", type=int, default=d.steps_per_block,
                     help="denoising steps per block (default: the block size)")
  group.add_argument("--kv-cache", action=argparse.BooleanOptionalAction, default=d.kv_cache,
                     help="block models: exact KV cache (default on); off recomputes the canvas each step")
  group.add_argument("--decode-attention", choices=DECODE_ATTENTION, default=d.decode_attention,
                     help="cached attention kernel (default %(default)s: Pallas on GPU)")


def from_args(args: argparse.Namespace, *, greedy: bool = False) -> SamplerConfig:
  """The SamplerConfig the flags describe; greedy (top_k=1) when asked or at --temperature 0.

  Raises ValueError (a ConfigError naming the field) for settings the sampler refuses.
  """
  sampling: dict[str, Any]
  if greedy or args.temperature == 0:
    sampling = dict(top_k=1, temperature=1.0, top_p=1.0)
  else:
    sampling = dict(top_k=args.top_k, temperature=args.temperature, top_p=args.top_p)
  return SamplerConfig(gen_length=args.gen_length, block_size=args.block_size, steps_per_block=args.steps_per_block,
                       mode=args.decode_mode, threshold=args.threshold, kv_cache=args.kv_cache,
                       decode_attention=args.decode_attention, **sampling)
