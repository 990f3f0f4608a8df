"""A byte-level BPE fitted to a few texts: the byte tokenizer plus merges, for tiny models on a laptop.

The byte tokenizer (tiny_tokenizer.py) spends one token per byte, so a 600-byte kernel file is 600
positions to sample and, in SDAR's two-copy SFT layout, 1,200 to attend over. A tiny model warm-
started on a handful of bundled problems (dice_jax.rl.warm_start_run) reads and writes those texts
in about a third as many tokens with merges learned from them by the `tokenizers` library's BPE
trainer, the same algorithm and GPT-2-style pre-tokenisation (words, numbers, punctuation and
whitespace runs are never merged across) as real checkpoints' tokenizers.

Decision: the fitted tokenizer keeps the byte tokenizer's ids. Bytes are ids 0..255 and
<|endoftext|> <|im_start|> <|im_end|> <|MASK|> are 256..259 in both, and merged tokens follow from
260, so a model config written for `builtin:bytes` (mask 259, end of turn 258, pad 256) stays valid
with only `vocab_size` raised, and any text the merges never saw still encodes, byte by byte.
Fitting is deterministic: the same texts and size give the same tokenizer.
"""

from __future__ import annotations

import json
import os
import pathlib
import typing
from collections.abc import Iterable

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

from dice_jax.train import tiny_tokenizer

BASE_SIZE = 256 + len(tiny_tokenizer.SPECIAL_TOKENS)  # the byte tokenizer's ids


def _pre_tokenizer() -> pre_tokenizers.ByteLevel:
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _merges(texts: Iterable[str], vocab_size: int) -> list[tuple[str, str]]:
  """The merges the library's BPE trainer learns from `texts`, in the order it learned them."""
  trainer_tok = tokenizers.Tokenizer(models.BPE())
  trainer_tok.pre_tokenizer = _pre_tokenizer()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(tiny_tokenizer.SPECIAL_TOKENS), special_tokens=[],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  trainer_tok.train_from_iterator(texts, trainer)
  merges = json.loads(trainer_tok.to_str())["model"]["merges"]
  # Each merge is a pair: "a b" in older tokenizers' JSON, ["a", "b"] in newer.
  return [typing.cast(tuple[str, str], tuple(m.split(" ")) if isinstance(m, str) else tuple(m)) for m in merges]


def write_bpe_tokenizer(out_dir: str | os.PathLike, texts: Iterable[str], vocab_size: int) -> pathlib.Path:
  """Writes tokenizer.json and tokenizer_config.json of a BPE of at most `vocab_size` tokens fitted to
  `texts` (ids as in the module docstring) into `out_dir`; returns it."""
  if vocab_size < BASE_SIZE:
    raise ValueError(f"a byte-level BPE needs vocab_size >= {BASE_SIZE} (bytes and special tokens), got {vocab_size}")
  byte_to_char = {b: c for b, c in zip(range(256), sorted(pre_tokenizers.ByteLevel.alphabet(),
                                                          key=tiny_tokenizer._byte_of))}  # pylint: disable=protected-access
  vocab = {byte_to_char[b]: b for b in range(256)}
  vocab |= {token: 256 + i for i, token in enumerate(tiny_tokenizer.SPECIAL_TOKENS)}
  merges = []
  for left, right in _merges(texts, vocab_size):
    if left + right not in vocab and len(vocab) < vocab_size:
      vocab[left + right] = len(vocab)
      merges.append((left, right))
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
  backend.pre_tokenizer = _pre_tokenizer()
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tiny_tokenizer.SPECIAL_TOKENS])
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  backend.save(str(out / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "mask_token": "<|MASK|>", "chat_template": tiny_tokenizer.CHAT_TEMPLATE}
  (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
  return out
