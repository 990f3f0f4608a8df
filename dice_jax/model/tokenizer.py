"""Tokenizer and chat template from a checkpoint directory, with the `tokenizers` library.

Sources, in the order transformers uses them: tokenizer.json if present; otherwise a byte-level
BPE built from vocab.json + merges.txt with Qwen2's pre-tokenizer (the pipeline of transformers'
Qwen2Tokenizer; SDAR ships these files). Added tokens and special-token names come from
tokenizer_config.json (`added_tokens_decoder`, `eos_token`, `pad_token`, `mask_token`, ...); only
when it has no `added_tokens_decoder` do added_tokens.json and special_tokens_map.json count.

Note on SDAR-4B-Chat's files: id 151669 is `<|MASK|>` in tokenizer_config.json (which transformers
follows, and so do we) but `<MASK>` in added_tokens.json and special_tokens_map.json. The id is
what matters and it matches config.json's mask_token_id; the string `<MASK>` is ordinary text.

The chat template (chat_template.jinja, else tokenizer_config.json's `chat_template`) is rendered
with jinja2 the way transformers renders it: a sandboxed environment with trim_blocks and
lstrip_blocks, loop controls, a non-escaping `tojson`, `raise_exception` and `strftime_now`, and
the special tokens (bos_token, eos_token, ...) as variables.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
from typing import Any, Literal, overload

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "special_tokens_map.json", "chat_template.jinja", "generation_config.json")
# transformers' Qwen2Tokenizer pre-tokenizer split.
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
                           r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_BPE_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")


def _read_json(path: pathlib.Path) -> dict:
  return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _content(token: Any) -> str | None:
  return token.get("content") if isinstance(token, dict) else token


def _qwen2_bpe(vocab: pathlib.Path, merges: pathlib.Path, add_prefix_space: bool) -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(BPE.from_file(str(vocab), str(merges), dropout=None, unk_token=None,
                                           continuing_subword_prefix="", end_of_word_suffix="",
                                           fuse_unk=False, byte_fallback=False))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
  ])
  tok.decoder = decoders.ByteLevel()
  return tok


class Tokenizer:
  """Encode/decode, special ids and the chat template of one checkpoint."""

  def __init__(self, backend: tokenizers.Tokenizer, special_tokens: dict[str, str], chat_template: str | None):
    self.backend = backend
    self.special_tokens = special_tokens  # e.g. {"eos_token": "<|endoftext|>", "mask_token": "<|MASK|>"}
    self.chat_template = chat_template

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  def _special_id(self, name: str) -> int | None:
    token = self.special_tokens.get(name)
    return None if token is None else self.token_to_id(token)

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size(with_added_tokens=True)

  @property
  def mask_id(self) -> int | None:
    return self._special_id("mask_token")

  @property
  def eos_id(self) -> int | None:
    return self._special_id("eos_token")

  @property
  def pad_id(self) -> int | None:
    return self._special_id("pad_token") if "pad_token" in self.special_tokens else self.eos_id

  @property
  def bos_id(self) -> int | None:
    return self._special_id("bos_token")

  @property
  def endoftext_id(self) -> int | None:
    return self.token_to_id("<|endoftext|>")

  @property
  def im_end_id(self) -> int | None:
    return self.token_to_id("<|im_end|>")

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` (no BOS/EOS added; special tokens in the text are recognised)."""
    return self.backend.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  @overload
  def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = ...,
                          tokenize: Literal[False] = ..., tools: list[dict] | None = ...,
                          documents: list[dict] | None = ..., **template_kwargs) -> str: ...

  @overload
  def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = ...,
                          tokenize: Literal[True], tools: list[dict] | None = ...,
                          documents: list[dict] | None = ..., **template_kwargs) -> list[int]: ...

  def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                          tokenize: bool = False, tools: list[dict] | None = None,
                          documents: list[dict] | None = None, **template_kwargs) -> str | list[int]:
    """The conversation rendered by the checkpoint's chat template (ids if `tokenize`)."""
    if self.chat_template is None:
      raise ValueError("this tokenizer has no chat template (chat_template.jinja or tokenizer_config.json)")
    text = _compile(self.chat_template).render(
        messages=messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
        **self.special_tokens, **template_kwargs)
    return self.encode(text) if tokenize else text


def _compile(template: str) -> jinja2.Template:
  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                     extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template)


def load_tokenizer(ckpt_dir: str | os.PathLike) -> Tokenizer:
  """The tokenizer of a checkpoint directory (see module docstring for which files count)."""
  d = pathlib.Path(ckpt_dir)
  config = _read_json(d / "tokenizer_config.json")
  if (d / "tokenizer.json").is_file():
    backend = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
  elif (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
    cls = config.get("tokenizer_class")
    if cls not in _BPE_CLASSES:
      raise ValueError(f"{d}: tokenizer_class {cls!r} without tokenizer.json is not supported "
                       f"(vocab.json + merges.txt are read for {', '.join(_BPE_CLASSES)})")
    backend = _qwen2_bpe(d / "vocab.json", d / "merges.txt", bool(config.get("add_prefix_space", False)))
  else:
    raise FileNotFoundError(f"{d} has neither tokenizer.json nor vocab.json + merges.txt")

  decoder = config.get("added_tokens_decoder")
  special_map = {} if decoder else _read_json(d / "special_tokens_map.json")
  special = {name: _content(config.get(name, special_map.get(name))) for name in _SPECIAL_NAMES}
  special = {k: v for k, v in special.items() if v is not None}
  extra = {_content(t) for t in config.get("additional_special_tokens") or special_map.get(
      "additional_special_tokens") or []}
  if decoder:
    added = sorted((int(i), t) for i, t in decoder.items())
  else:
    added = sorted((i, {"content": t, "special": True}) for t, i in _read_json(d / "added_tokens.json").items())
  for token_id, t in added:
    content = t["content"]
    is_special = bool(t.get("special")) or content in extra or content in special.values()
    backend.add_tokens([AddedToken(content, single_word=t.get("single_word", False), lstrip=t.get("lstrip", False),
                                   rstrip=t.get("rstrip", False), normalized=t.get("normalized", not is_special),
                                   special=is_special)])
    if backend.token_to_id(content) != token_id:
      raise ValueError(f"{d}: added token {content!r} should have id {token_id}, "
                       f"got {backend.token_to_id(content)} (vocabulary and added tokens disagree)")
  for name, token in special.items():
    if backend.token_to_id(token) is None:
      raise ValueError(f"{d}: {name} {token!r} is not in the vocabulary")

  template = None
  if (d / "chat_template.jinja").is_file():
    template = (d / "chat_template.jinja").read_text(encoding="utf-8")
  elif isinstance(config.get("chat_template"), str):
    template = config["chat_template"]
  elif isinstance(config.get("chat_template"), list):  # named templates: use "default"
    template = next((t["template"] for t in config["chat_template"] if t.get("name") == "default"), None)
  return Tokenizer(backend, special, template)
