"""SFT data: file formats and their errors, chat-template split, padding, grain order and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dice_jax.config import ConfigError, load_config
from dice_jax.data import sft_data
from dice_jax.data.sft_data import SFTDataConfig, SFTDataError
from dice_jax.model.tokenizer import load_tokenizer
from dice_jax.train.tiny_tokenizer import write_byte_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return load_tokenizer(write_byte_tokenizer(tmp_path_factory.mktemp("tok")))


def _jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def test_bundled_set_reads_both_formats():
  examples = sft_data.read_examples("bundled:sft_tiny")
  assert len(examples) == 16
  assert all(m[-1]["role"] == "assistant" for m in examples)
  assert examples[0][0] == {"role": "user", "content": examples[0][0]["content"]}
  assert examples[-1][0]["role"] == "system"  # a `messages` example keeps its own turns


def test_prompt_response_split_matches_generation_prompt(tok):
  messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
  prompt, response = sft_data.tokenize_example(tok, messages)
  assert tok.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  assert tok.decode(response) == "yo<|im_end|>\n"
  # The prompt is exactly what the sampler is given at RL time.
  assert prompt == tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True)


def test_sdar_chat_template_split(shared_dir):
  sdar = load_tokenizer(shared_dir / "models" / "sdar-4b-chat")
  messages = [{"role": "user", "content": "Write a kernel."},
              {"role": "assistant", "content": "__global__ void k() {}"}]
  prompt, response = sft_data.tokenize_example(sdar, messages)
  assert sdar.decode(prompt).endswith("<|im_start|>assistant\n")
  # SDAR's (Qwen3) template renders the final assistant turn with an empty think block.
  assert sdar.decode(response) == "<think>\n\n</think>\n\n__global__ void k() {}<|im_end|>\n"
  assert sdar.im_end_id in response


def test_padding_and_response_mask():
  ex = sft_data.pad_example(np.array([5, 6, 7, 8, 9], np.int32), 2, 8, pad_id=0, pad_in_loss=False)
  np.testing.assert_array_equal(ex["tokens"], [5, 6, 7, 8, 9, 0, 0, 0])
  np.testing.assert_array_equal(ex["response_mask"], [0, 0, 1, 1, 1, 0, 0, 0])
  ex = sft_data.pad_example(np.array([5, 6, 7], np.int32), 2, 5, pad_id=0, pad_in_loss=True)
  np.testing.assert_array_equal(ex["response_mask"], [0, 0, 1, 1, 1])


def test_overlong_examples_dropped_or_truncated(tmp_path, tok):
  path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b" * 10},
                                        {"prompt": "a", "response": "b" * 100}])
  cfg = SFTDataConfig(train_files=(path,), max_length=64)
  data = sft_data.tokenize_files(cfg, tok)
  assert len(data.tokens) == 1 and data.dropped == 1
  data = sft_data.tokenize_files(SFTDataConfig(train_files=(path,), max_length=64,
                                               overlong="truncate"), tok)
  assert len(data.tokens) == 2 and data.truncated == 1 and max(map(len, data.tokens)) == 64
  with pytest.raises(SFTDataError, match="longer than max_length=8"):
    sft_data.tokenize_files(SFTDataConfig(train_files=(path,), max_length=8), tok)


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a"}\n', r"d.jsonl:1: needs string fields 'prompt' and 'response'"),
    ('{"prompt": "a", "response": "b"}\n{oops\n', r"d.jsonl:2: invalid JSON"),
    ('[{"prompt": "a", "response": "b"}, ]', r"invalid JSON at line 1"),
    ('{"prompt": "a", "response": "  "}\n', r"'response' is empty"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n',
     r"last turn must be the assistant's"),
    ('{"messages": [{"role": "user"}, {"role": "assistant", "content": "b"}]}\n',
     r"messages\[0\] must be"),
    ('[3]', r"d.jsonl\[0\]: expected an object, got int"),
    ('\n\n', r"no examples"),
])
def test_bad_files_name_file_and_line(tmp_path, content, message):
  path = tmp_path / "d.jsonl"
  path.write_text(content)
  with pytest.raises(SFTDataError, match=message):
    sft_data.read_examples(str(path))


def test_non_utf8_and_missing_files(tmp_path):
  path = tmp_path / "bin.jsonl"
  path.write_bytes(b"\xff\xfe\x00garbage")
  with pytest.raises(SFTDataError, match="not UTF-8"):
    sft_data.read_examples(str(path))
  with pytest.raises(SFTDataError, match="no bundled SFT set 'nope'"):
    sft_data.read_examples("bundled:nope")
  with pytest.raises(ConfigError, match=r"train_files\[0\]: file not found: '/no/such.jsonl'"):
    SFTDataConfig(train_files=("/no/such.jsonl",))
  with pytest.raises(ConfigError, match="train_files: at least one"):
    SFTDataConfig()


def _batches(it, n):
  return [next(it) for _ in range(n)]


def test_iterator_is_seeded_sliced_and_resumable(tmp_path, tok):
  records = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(10)]
  cfg = SFTDataConfig(train_files=(_jsonl(tmp_path / "d.jsonl", records),), max_length=48,
                      batch_size=4, seed=7)
  data = sft_data.tokenize_files(cfg, tok)
  pad = tok.pad_id
  first = _batches(sft_data.make_iterator(data, cfg, pad), 6)
  again = _batches(sft_data.make_iterator(data, cfg, pad), 6)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
  assert first[0]["tokens"].shape == (4, 48) and first[0]["response_mask"].dtype == np.bool_
  # Epochs are reshuffled: 6 batches of 4 cover 2.4 epochs of 10 examples.
  seen = [tuple(row) for b in first for row in b["tokens"]]
  assert len(set(seen)) == 10 and seen[:10] != seen[10:20]
  # Two processes each take half of every global batch; together they are the global batch.
  halves = [_batches(sft_data.make_iterator(data, cfg, pad, process_index=p, process_count=2), 3)
            for p in (0, 1)]
  for k in range(3):
    got = {tuple(r) for h in halves for r in h[k]["tokens"]}
    assert got == {tuple(r) for r in first[k]["tokens"]}
  # get_state / set_state: a fresh iterator continues exactly where the old one was.
  it = sft_data.make_iterator(data, cfg, pad)
  _batches(it, 4)
  state = json.loads(json.dumps(it.get_state()))
  fresh = sft_data.make_iterator(data, cfg, pad)
  fresh.set_state(state)
  for a, b in zip(_batches(fresh, 2), first[4:6]):
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
  with pytest.raises(SFTDataError, match="not divisible by the 3 processes"):
    sft_data.make_iterator(data, cfg, pad, process_count=3)


def test_data_section_errors_through_loader(tmp_path):
  import dataclasses

  @dataclasses.dataclass(frozen=True)
  class Top:
    data: SFTDataConfig

  with pytest.raises(ConfigError, match="data: required"):
    load_config(Top)
  with pytest.raises(ConfigError, match="data.max_length: must be > 1"):
    load_config(Top, None, ["data.train_files=[bundled:sft_tiny]", "data.max_length=0"])
  with pytest.raises(ConfigError, match="data.overlong: 'cut' is not one of"):
    load_config(Top, None, ["data.train_files=[bundled:sft_tiny]", "data.overlong=cut"])
