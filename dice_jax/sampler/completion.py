"""Chat prompts in, completion texts out: a checkpoint, its tokenizer and the diffusion sampler.

Shared by `dice eval --model` and `KernelGenerator`. Batching keeps the number of compiled sampler
programs small: rows are sorted by prompt length, cut into batches of exactly `batch_size` rows
(the last one filled with copies, whose outputs are dropped), and every batch is right-padded to a
multiple of `PAD_MULTIPLE` tokens, so a whole evaluation compiles a handful of shapes.
Settings are a SamplerConfig (greedy decoding is its top_k=1, what `dice eval` uses with one sample
per problem); `eos_ids=None` stops at the model's, the tokenizer's and the chat end-of-turn ids.
A prompt that does not fit the model's context with the requested new tokens is an error naming
it; nothing is truncated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import jax
import numpy as np

from dice_jax.model import hf_io
from dice_jax.model.tokenizer import load_tokenizer
from dice_jax.sampler.api import sample
from dice_jax.sampler.config import SamplerConfig

PAD_MULTIPLE = 512  # few distinct prompt widths, so few sampler compiles per evaluation
Messages = list[dict[str, str]]


class CompletionModel:
  """A loaded checkpoint that completes chat conversations."""

  def __init__(self, model_dir: str | os.PathLike[str], *, dtype: str = "auto"):
    if not os.path.isdir(model_dir):
      raise FileNotFoundError(f"--model {model_dir}: no such directory")
    if dtype == "auto":
      dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    self.model_dir = str(model_dir)
    self.model = hf_io.load_pretrained(model_dir, dtype=dtype)
    self.tokenizer = load_tokenizer(model_dir)
    config = self.model.config
    if self.tokenizer.vocab_size > config.vocab_size:
      raise ValueError(f"{model_dir}: the tokenizer has {self.tokenizer.vocab_size} tokens but the "
                       f"model's vocab_size is {config.vocab_size}")
    eos = [config.eos_token_id, self.tokenizer.eos_id, self.tokenizer.im_end_id]
    self.eos_ids = tuple(sorted({i for i in eos if i is not None}))
    self.max_length = config.max_position_embeddings

  def sampler_config(self, settings: SamplerConfig) -> SamplerConfig:
    """`settings` with this checkpoint's stop ids where it gives none."""
    return settings if settings.eos_ids is not None else settings.replace(eos_ids=self.eos_ids)

  def encode(self, messages: Messages) -> list[int]:
    return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)

  def check_fits(self, prompts: Sequence[list[int]], settings: SamplerConfig,
                 names: Sequence[str] | None = None) -> None:
    """ValueError naming every prompt that leaves no room for `settings.gen_length` new tokens."""
    limit = self.max_length - settings.gen_length
    too_long = [(names[i] if names else str(i), len(p)) for i, p in enumerate(prompts) if len(p) > limit]
    if too_long:
      listed = ", ".join(f"{n} ({t} tokens)" for n, t in too_long[:5])
      raise ValueError(f"{len(too_long)} prompt(s) do not fit the model's context of {self.max_length} "
                       f"tokens with {settings.gen_length} new tokens (at most {limit} prompt "
                       f"tokens): {listed}; lower --gen-length or leave these problems out")

  def complete(self, prompts: Sequence[list[int]], settings: SamplerConfig, *, seed: int = 0,
               batch_size: int = 8,
               on_batch: Callable[[list[int], list[str]], None] | None = None) -> list[str]:
    """One completion per prompt (repeat a prompt for several samples); `on_batch(rows, texts)`
    is called as each batch finishes, so callers can persist results before the next one."""
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    self.check_fits(prompts, settings)
    config = self.sampler_config(settings)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts: list[str | None] = [None] * len(prompts)
    for b, start in enumerate(range(0, len(order), batch_size)):
      rows = order[start:start + batch_size]
      filled = rows + [rows[-1]] * (batch_size - len(rows))
      lengths = np.array([len(prompts[i]) for i in filled], np.int32)
      width = min(-(-int(lengths.max()) // PAD_MULTIPLE) * PAD_MULTIPLE,
                  self.max_length - settings.gen_length)
      batch = np.zeros((batch_size, width), np.int32)
      for r, i in enumerate(filled):
        batch[r, :len(prompts[i])] = prompts[i]
      rng = jax.random.fold_in(jax.random.key(seed), b)
      rollout = sample(self.model, batch, rng, config, prompt_lengths=lengths)
      tokens, valid = jax.device_get((rollout.tokens, rollout.lengths))
      done = []
      for r, i in enumerate(rows):
        texts[i] = self.tokenizer.decode(np.asarray(tokens)[r, :int(valid[r])], skip_special_tokens=True)
        done.append(texts[i])
      if on_batch is not None:
        on_batch(rows, done)
    return texts
