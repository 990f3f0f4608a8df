"""Our tokenizer (tokenizers + jinja2) against transformers' on SDAR's real tokenizer files."""

import json
import shutil

import pytest
import transformers

from dice_jax.model.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def sdar_dir(shared_dir):
  return shared_dir / "models/sdar-4b-chat"


@pytest.fixture(scope="module")
def ours(sdar_dir):
  return load_tokenizer(sdar_dir)


@pytest.fixture(scope="module")
def reference(sdar_dir):
  return transformers.AutoTokenizer.from_pretrained(str(sdar_dir), trust_remote_code=False)


@pytest.fixture(scope="module")
def texts(shared_dir):
  item = json.loads((shared_dir / "data/dice/end_to_end_kernel_generation_4000.json").read_text())[0]
  return [item["pytorch_code"], item["cuda_code"], "hello <MASK> world<|im_end|>",
          "<|im_start|>user\nhi<|im_end|><|MASK|><|endoftext|>", "  leading spaces\tand tabs\r\n\n\n",
          "ünïcödé 你好 🙂 I'll can't 123456 3.14e-5", "__global__ void k(float* a){a[threadIdx.x]+=1.0f;}"]


def test_sdar_special_ids(ours, sdar_dir):
  assert ours.mask_id == 151669  # `<|MASK|>` in tokenizer_config.json (`<MASK>` in added_tokens.json)
  assert ours.eos_id == ours.endoftext_id == ours.pad_id == 151643
  assert ours.im_end_id == 151645
  assert ours.vocab_size == 151670
  assert json.loads((sdar_dir / "config.json").read_text())["mask_token_id"] == ours.mask_id


def test_encodings_match_transformers(ours, reference, texts):
  for text in texts:
    ids = ours.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False), text[:60]
    assert ours.decode(ids) == reference.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
  assert ours.encode_batch(texts[:2]) == [ours.encode(t) for t in texts[:2]]


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, reference, generation_prompt):
  conversations = [
      [{"role": "user", "content": "Write a CUDA kernel for ReLU."}],
      [{"role": "system", "content": "You write fast CUDA."}, {"role": "user", "content": "Softmax, please."},
       {"role": "assistant", "content": "```cpp\n__global__ void k() {}\n```"}, {"role": "user", "content": "Faster."}],
  ]
  for messages in conversations:
    expected = reference.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
    assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == expected
    assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True) == \
        reference.encode(expected, add_special_tokens=False)


def test_tokenizer_json_path(tmp_path, sdar_dir, reference, ours, texts):
  """A checkpoint that ships tokenizer.json (the common case) loads from it."""
  reference.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
  shutil.copy(sdar_dir / "tokenizer_config.json", tmp_path)
  tok = load_tokenizer(tmp_path)
  assert [tok.encode(t) for t in texts] == [ours.encode(t) for t in texts]
  assert (tok.mask_id, tok.eos_id, tok.vocab_size) == (151669, 151643, 151670)
  assert tok.chat_template is not None  # tokenizer_config.json's copy of the template
  messages = [{"role": "user", "content": "hi"}]
  assert tok.apply_chat_template(messages) == ours.apply_chat_template(messages)


def test_missing_or_unsupported_files(tmp_path, sdar_dir):
  with pytest.raises(FileNotFoundError, match="neither tokenizer.json nor vocab.json"):
    load_tokenizer(tmp_path)
  for name in ("vocab.json", "merges.txt"):
    shutil.copy(sdar_dir / name, tmp_path / name)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
  with pytest.raises(ValueError, match="tokenizer_class 'GPT2Tokenizer'"):
    load_tokenizer(tmp_path)
