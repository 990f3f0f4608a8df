"""The fitted BPE keeps the byte tokenizer's ids, round-trips any text, is deterministic and short."""

from __future__ import annotations

import pytest

from dice_jax.data.problems import load_problems
from dice_jax.model.tokenizer import load_tokenizer
from dice_jax.train import bpe_tokenizer, tiny_tokenizer


@pytest.fixture(scope="module")
def texts() -> list[str]:
  return [p.known_good for p in load_problems("bundled:elementwise_warmup")]


def test_byte_and_special_ids_are_the_byte_tokenizers(tmp_path, texts):
  bpe = load_tokenizer(bpe_tokenizer.write_bpe_tokenizer(tmp_path / "bpe", texts, 640))
  byte = load_tokenizer(tiny_tokenizer.write_byte_tokenizer(tmp_path / "bytes"))
  for token in tiny_tokenizer.SPECIAL_TOKENS:
    assert bpe.token_to_id(token) == byte.token_to_id(token)
  assert (bpe.mask_id, bpe.eos_id, bpe.pad_id) == (259, 258, 256)
  # Text the merges never saw (other scripts, control bytes) still encodes, byte by byte, to the same ids.
  odd = "é\x00€ ∑"
  assert bpe.encode(odd) == byte.encode(odd) and bpe.decode(bpe.encode(odd)) == odd
  assert bpe.vocab_size <= 640 and bpe.vocab_size > bpe_tokenizer.BASE_SIZE


def test_round_trip_chat_template_and_compression(tmp_path, texts):
  bpe = load_tokenizer(bpe_tokenizer.write_bpe_tokenizer(tmp_path / "bpe", texts, 640))
  rl_file = load_problems("bundled:elementwise")[0].known_good  # not among the fitted texts
  ids = bpe.encode(rl_file)
  assert bpe.decode(ids) == rl_file and len(ids) < len(rl_file.encode()) / 2.5
  rendered = bpe.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
  assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  assert bpe.encode(rendered)[0] == bpe.token_to_id("<|im_start|>")


def test_fitting_is_deterministic_and_sizes_are_checked(tmp_path, texts):
  a = bpe_tokenizer.write_bpe_tokenizer(tmp_path / "a", texts, 400)
  b = bpe_tokenizer.write_bpe_tokenizer(tmp_path / "b", list(texts), 400)
  assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
  assert load_tokenizer(a).vocab_size == 400
  with pytest.raises(ValueError, match="vocab_size >= 260"):
    bpe_tokenizer.write_bpe_tokenizer(tmp_path / "c", texts, 100)
