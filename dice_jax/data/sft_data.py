"""SFT input pipeline: prompt/response files -> chat-templated, padded, shuffled batches (grain).

Files are JSON (a list of objects) or JSONL (one object per line). An example is either
  `{"prompt": str, "response": str}` (DICE's CuKe format; an optional "system" string), or
  `{"messages": [{"role": ..., "content": ...}, ..., {"role": "assistant", "content": ...}]}`
where the last assistant turn is the target and everything before it the prompt.

Tokenisation follows what the model sees at RL time: the prompt is the chat template rendered with
`add_generation_prompt=True`, tokenised alone; the response is the rest of the template's
rendering of the whole conversation (so it ends with the template's end-of-turn token), tokenised
alone. All examples are tokenised once at start-up, so a bad file fails before training starts.

Every example is padded with the tokenizer's pad token to `max_length`. Arrays per batch:
  tokens          int32 BxL
  response_mask   bool BxL: the positions that may be masked and are scored: the response, and
                  the padding when `pad_in_loss` (LLaDA's SFT recipe: the model learns to fill the
                  tail with EOS, i.e. to stop). The prompt is always False: never noised, never
                  scored, always visible.
Examples longer than `max_length` are dropped or have their response cut, per `overlong`.

Order: one seeded permutation per epoch (grain `shuffle` + `repeat`), endless; each process takes
every `process_count`-th example of the global order, so the processes' local batches together
form the global batch and share one iterator position (the checkpointed state).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import logging
import os
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from dice_jax.config import require, require_file

log = logging.getLogger(__name__)

BUNDLED_PREFIX = "bundled:"


class SFTDataError(ValueError):
  """An SFT data file is missing or malformed; the message names the file and the example."""


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
  # JSON/JSONL files, or `bundled:<name>` for a set shipped in dice_jax/data (`bundled:sft_tiny`).
  train_files: tuple[str, ...] = ()
  max_length: int = 2048  # static sequence length (prompt + response + padding)
  batch_size: int = 8  # global examples per optimizer step (split over processes and devices)
  seed: int = 0
  shuffle: bool = True
  overlong: Literal["drop", "truncate"] = "drop"
  pad_in_loss: bool = True
  # Prepended as a system turn to prompt/response examples (not to `messages` examples).
  system_prompt: str | None = None

  def __post_init__(self):
    require(len(self.train_files) > 0, "train_files", "at least one JSON/JSONL file is required")
    for i, path in enumerate(self.train_files):
      if not path.startswith(BUNDLED_PREFIX):
        require_file(path, f"train_files[{i}]")
    require(self.max_length > 1, "max_length", f"must be > 1, got {self.max_length}")
    require(self.batch_size > 0, "batch_size", f"must be > 0, got {self.batch_size}")


def resolve_path(path: str) -> str:
  """A file path, with `bundled:<name>` mapped to dice_jax/data/<name>.json."""
  if not path.startswith(BUNDLED_PREFIX):
    return os.path.expanduser(path)
  name = path[len(BUNDLED_PREFIX):]
  resource = importlib.resources.files("dice_jax.data").joinpath(f"{name}.json")
  if not name.replace("_", "").isalnum() or not resource.is_file():
    raise SFTDataError(f"{path}: no bundled SFT set {name!r} in dice_jax/data")
  return str(resource)


def _check_messages(messages: Any, where: str) -> list[dict[str, str]]:
  if not isinstance(messages, list) or len(messages) < 2:
    raise SFTDataError(f"{where}: 'messages' must be a list of at least two turns")
  for j, turn in enumerate(messages):
    if not (isinstance(turn, dict) and isinstance(turn.get("role"), str)
            and isinstance(turn.get("content"), str)):
      raise SFTDataError(f"{where}: messages[{j}] must be {{'role': str, 'content': str}}, got {turn!r:.80}")
  if messages[-1]["role"] != "assistant":
    raise SFTDataError(f"{where}: the last turn must be the assistant's (the training target), "
                       f"got role {messages[-1]['role']!r}")
  return [{"role": t["role"], "content": t["content"]} for t in messages]


def to_messages(record: Any, where: str, system_prompt: str | None = None) -> list[dict[str, str]]:
  """The conversation of one example (last turn: the assistant's target)."""
  if not isinstance(record, dict):
    raise SFTDataError(f"{where}: expected an object, got {type(record).__name__}")
  if "messages" in record:
    return _check_messages(record["messages"], where)
  prompt, response = record.get("prompt"), record.get("response")
  if not isinstance(prompt, str) or not isinstance(response, str):
    raise SFTDataError(f"{where}: needs string fields 'prompt' and 'response' (or 'messages'); "
                       f"has keys {sorted(record)}")
  if not response.strip():
    raise SFTDataError(f"{where}: 'response' is empty")
  system = record.get("system", system_prompt)
  head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
  return head + [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def read_examples(path: str, system_prompt: str | None = None) -> list[list[dict[str, str]]]:
  """Conversations from one JSON or JSONL file; errors name the file and line/index."""
  real = resolve_path(path)
  if not os.path.isfile(real):
    raise SFTDataError(f"SFT data file not found: {path!r}")
  try:
    with open(real, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise SFTDataError(f"{path}: not UTF-8 text ({e})") from None
  stripped = text.lstrip()
  if stripped.startswith("["):
    try:
      records = json.loads(text)
    except json.JSONDecodeError as e:
      raise SFTDataError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    where = [f"{path}[{i}]" for i in range(len(records))]
  else:
    records, where = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise SFTDataError(f"{path}:{lineno}: invalid JSON ({e.msg}); expected one object per line "
                           f"(JSONL) or a JSON list") from None
      where.append(f"{path}:{lineno}")
  if not records:
    raise SFTDataError(f"{path}: no examples")
  return [to_messages(r, w, system_prompt) for r, w in zip(records, where)]


def tokenize_example(tokenizer: Any, messages: list[dict[str, str]],
                     where: str = "example") -> tuple[list[int], list[int]]:
  """(prompt_ids, response_ids): the prompt as generated at RL time, the response after it."""
  prompt_text = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True)
  full_text = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
  if not full_text.startswith(prompt_text):
    raise SFTDataError(f"{where}: the chat template's rendering of the prompt with a generation "
                       f"prompt is not a prefix of the whole conversation; cannot split prompt "
                       f"from response")
  return tokenizer.encode(prompt_text), tokenizer.encode(full_text[len(prompt_text):])


@dataclasses.dataclass(frozen=True)
class TokenizedSet:
  """Examples as token arrays (unpadded), plus what was dropped or cut."""
  tokens: list[np.ndarray]  # prompt + response ids, each of length <= max_length
  prompt_lengths: np.ndarray
  dropped: int
  truncated: int


def tokenize_files(cfg: SFTDataConfig, tokenizer: Any) -> TokenizedSet:
  tokens, prompt_lengths, dropped, truncated = [], [], 0, 0
  for path in cfg.train_files:
    for i, messages in enumerate(read_examples(path, cfg.system_prompt)):
      prompt, response = tokenize_example(tokenizer, messages, f"{path}[{i}]")
      if len(prompt) + len(response) > cfg.max_length:
        if cfg.overlong == "drop" or len(prompt) >= cfg.max_length:
          dropped += 1
          continue
        response = response[:cfg.max_length - len(prompt)]
        truncated += 1
      tokens.append(np.asarray(prompt + response, np.int32))
      prompt_lengths.append(len(prompt))
  if not tokens:
    raise SFTDataError(f"every example of {list(cfg.train_files)} is longer than max_length="
                       f"{cfg.max_length} tokens; raise data.max_length")
  if dropped or truncated:
    log.warning("SFT data: %d examples kept, %d dropped and %d truncated (longer than %d tokens)",
                len(tokens), dropped, truncated, cfg.max_length)
  return TokenizedSet(tokens, np.asarray(prompt_lengths, np.int32), dropped, truncated)


def pad_example(tokens: np.ndarray, prompt_length: int, max_length: int, pad_id: int,
                pad_in_loss: bool) -> dict[str, np.ndarray]:
  """One example's padded tokens and response mask (see the module docstring)."""
  n = len(tokens)
  tokens_L = np.full((max_length,), pad_id, np.int32)
  tokens_L[:n] = tokens
  positions_L = np.arange(max_length)
  end = max_length if pad_in_loss else n
  return {"tokens": tokens_L, "response_mask": (positions_L >= prompt_length) & (positions_L < end)}


def make_iterator(data: TokenizedSet, cfg: SFTDataConfig, pad_id: int, *,
                  process_index: int = 0, process_count: int = 1, prefetch: int = 4):
  """An endless grain iterator of this process's batches (`get_state`/`set_state` for resume)."""
  try:
    import grain  # deferred: only the SFT loop needs grain
  except ImportError as e:
    raise SFTDataError("the SFT input pipeline needs grain: pip install 'grain>=0.2.18,<0.3' "
                       "(or install its wheels where there is no package index)") from e

  if cfg.batch_size % process_count:
    raise SFTDataError(f"data.batch_size={cfg.batch_size} is not divisible by the "
                       f"{process_count} processes")
  source = list(zip(data.tokens, data.prompt_lengths.tolist()))
  ds = grain.MapDataset.source(source)
  if cfg.shuffle:
    ds = ds.shuffle(seed=cfg.seed)
  ds = ds.repeat()[process_index::process_count]
  ds = ds.map(lambda ex: pad_example(ex[0], ex[1], cfg.max_length, pad_id, cfg.pad_in_loss))
  ds = ds.batch(cfg.batch_size // process_count, drop_remainder=True)
  options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=prefetch)
  return iter(ds.to_iter_dataset(options))


def batch_spec(cfg: SFTDataConfig) -> dict[str, tuple[tuple[int, ...], Any]]:
  """Global shape and dtype of each batch array (for compiling the step before data arrives)."""
  shape = (cfg.batch_size, cfg.max_length)
  return {"tokens": (shape, np.int32), "response_mask": (shape, np.bool_)}


def describe(data: TokenizedSet, sources: Sequence[str]) -> str:
  lengths = np.asarray([len(t) for t in data.tokens])
  return (f"{len(lengths)} examples from {len(sources)} file(s); tokens per example: "
          f"mean {lengths.mean():.0f}, max {lengths.max()}; prompt mean "
          f"{data.prompt_lengths.mean():.0f}")
