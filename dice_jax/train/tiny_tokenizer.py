"""A byte-level tokenizer with a ChatML template, for tiny random models that run on a laptop.

Real checkpoints bring their own tokenizer files. A tiny random model (SFT's and RL's `tiny`
configs, tests) cannot use SDAR's 151,936-token vocabulary without paying for a huge embedding and
logits, so it uses this one: the 256 bytes plus four special tokens, written as ordinary tokenizer
files (tokenizer.json + tokenizer_config.json) and read back through `load_tokenizer`, so nothing
downstream can tell it from a checkpoint's tokenizer.
"""

from __future__ import annotations

import json
import os
import pathlib

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers


BUILTIN = "builtin:bytes"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>")  # ids 256..259

# ChatML, as SDAR/Qwen render it without tools or thinking.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def write_byte_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
  """Writes tokenizer.json and tokenizer_config.json of the byte tokenizer into `out_dir`."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  byte_to_char = {b: c for b, c in zip(range(256), sorted(alphabet, key=_byte_of))}
  vocab = {byte_to_char[b]: b for b in range(256)}
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
  backend.save(str(out / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "mask_token": "<|MASK|>", "chat_template": CHAT_TEMPLATE}
  (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
  return out


def _byte_of(char: str) -> int:
  """GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256+."""
  code = ord(char)
  printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
      range(ord("®"), ord("ÿ") + 1))
  if code in printable:
    return code
  others = [b for b in range(256) if b not in printable]
  return others[code - 256]

