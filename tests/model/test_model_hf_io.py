"""Checkpoint loading and saving: transformers round trips, SDAR-4B's file layout, sharded loading,
and a clear error, naming the tensor, for every kind of bad checkpoint."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file, save_file

import model_testlib as tl
from dice_jax import sharding
from dice_jax.model import masks
from dice_jax.model.config import UnsupportedModelError
from dice_jax.model.hf_io import CheckpointError, load_pretrained, save_pretrained


def _leaves(model):
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model))]


@pytest.fixture(scope="module")
def sdar_config(shared_dir):
  return json.loads((shared_dir / "models/sdar-4b-chat/config.json").read_text())


@pytest.fixture(scope="module")
def sdar(tmp_path_factory, sdar_config):
  return tl.make_sdar(tmp_path_factory.mktemp("sdar") / "ckpt", sdar_config)


def test_save_round_trip_loads_in_transformers(sdar, tmp_path, sdar_config):
  ckpt, torch_model = sdar
  model = load_pretrained(ckpt)
  out = save_pretrained(model, tmp_path / "out", max_shard_bytes=60_000, tokenizer_dir=ckpt.parent)
  files = sorted(p.name for p in out.glob("*.safetensors"))
  assert len(files) > 2 and (out / "model.safetensors.index.json").is_file()
  saved = json.loads((out / "config.json").read_text())
  assert saved["model_type"] == "sdar" and saved["block_size"] == 4 and saved["torch_dtype"] == "float32"
  assert {k: v for k, v in saved.items() if k not in ("torch_dtype", "dtype")} == \
      {k: v for k, v in json.loads((ckpt / "config.json").read_text()).items() if k != "torch_dtype"}
  # transformers (Qwen3 = SDAR's layout; SDAR's own class is remote code) loads it unchanged.
  hf_config = transformers.Qwen3Config(**{**saved, "model_type": "qwen3", "attn_implementation": "eager"})
  reloaded = transformers.Qwen3ForCausalLM.from_pretrained(out, config=hf_config).eval()
  tokens = np.random.default_rng(0).integers(0, 500, (2, 12))
  mask = np.asarray(masks.dense(masks.block_causal(4), 12, 12))
  np.testing.assert_array_equal(tl.torch_logits(reloaded, tokens, mask), tl.torch_logits(torch_model, tokens, mask))
  for name, tensor in torch_model.state_dict().items():
    torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
  # And our loader reads our own output back bit for bit.
  for a, b in zip(_leaves(load_pretrained(out)), _leaves(model)):
    np.testing.assert_array_equal(a, b)


def test_bfloat16_save(sdar, tmp_path):
  ckpt, _ = sdar
  out = save_pretrained(load_pretrained(ckpt), tmp_path / "bf16", dtype="bfloat16")
  tensors = load_file(str(out / "model.safetensors"))
  assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
  assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
  assert load_pretrained(out, param_dtype="bfloat16").embed[...].dtype == jnp.bfloat16


def test_llada_round_trip_keeps_names_and_values(tmp_path):
  ckpt, _ = tl.make_llada(tmp_path / "llada")
  out = save_pretrained(load_pretrained(ckpt), tmp_path / "out")
  original, saved = tl.state_dict_of(ckpt), tl.state_dict_of(out)
  assert sorted(saved) == sorted(original)
  for name in original:
    torch.testing.assert_close(saved[name], original[name], rtol=0, atol=0, msg=name)
  assert json.loads((out / "config.json").read_text())["vocab_size"] == 512 - 16  # LLaDA's own keys kept


def test_sharded_load_places_each_shard(sdar):
  ckpt, _ = sdar
  mesh = sharding.make_mesh(2, 2, 2)
  sharded, single = load_pretrained(ckpt, mesh=mesh), load_pretrained(ckpt)
  state = nnx.state(sharded)
  expected = sharding.state_shardings(state, mesh)
  for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
    assert x.sharding == s
  assert state["layers"]["mlp"]["gate_proj"][...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  for a, b in zip(_leaves(sharded), _leaves(single)):
    np.testing.assert_array_equal(a, b)


def test_sdar_4b_file_layout_shrunk(tmp_path, shared_dir, sdar_config):
  """SDAR-4B's index (names, file split) with a 2-layer config: loads and matches the reference."""
  real_index = json.loads((shared_dir / "models/sdar-4b-chat/model.safetensors.index.json").read_text())
  ckpt, torch_model = tl.make_sdar(tmp_path / "src", sdar_config)
  tensors = tl.state_dict_of(ckpt)
  keep = {n: f for n, f in real_index["weight_map"].items() if not n.startswith("model.layers.")
          or int(n.split(".")[2]) < 2}
  assert set(keep) == set(tensors)
  out = tmp_path / "sdar4b-shaped"
  out.mkdir()
  shutil.copy(ckpt / "config.json", out)
  for file_name in sorted(set(keep.values())):
    save_file({n: tensors[n] for n, f in keep.items() if f == file_name}, str(out / file_name), {"format": "pt"})
  (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": keep}))
  model = load_pretrained(out)
  tokens = np.random.default_rng(1).integers(0, 500, (1, 8))
  mask = masks.dense(masks.block_causal(4), 8, 8)
  tl.assert_logits_close(model(jnp.asarray(tokens)), tl.torch_logits(torch_model, tokens, mask))


def _rewrite(src, dst, edit):
  shutil.copytree(src, dst)
  tensors = load_file(str(dst / "model.safetensors"))
  edit(tensors)
  save_file(tensors, str(dst / "model.safetensors"), {"format": "pt"})
  return dst


def test_missing_unexpected_and_misshapen_tensors_are_named(sdar, tmp_path):
  ckpt, _ = sdar

  def edit(t):
    del t["model.layers.1.mlp.up_proj.weight"]
    t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(3)
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)

  bad = _rewrite(ckpt, tmp_path / "bad", edit)
  with pytest.raises(CheckpointError) as e:
    load_pretrained(bad)
  message = str(e.value)
  assert "missing tensor model.layers.1.mlp.up_proj.weight (expected shape (128, 64))" in message
  assert "unexpected tensor model.layers.0.mlp.extra_proj.weight in model.safetensors" in message
  assert "tensor model.layers.0.self_attn.k_proj.weight has shape (16, 64) in model.safetensors, " \
         "expected (32, 64)" in message


def test_config_with_more_layers_than_the_weights(sdar, tmp_path):
  ckpt, _ = sdar
  bad = shutil.copytree(ckpt, tmp_path / "deeper")
  config = json.loads((bad / "config.json").read_text())
  (bad / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
  with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.2\.input_layernorm\.weight"):
    load_pretrained(bad)


def test_wrong_architecture_and_missing_files(sdar, tmp_path):
  ckpt, _ = sdar
  wrong = shutil.copytree(ckpt, tmp_path / "mistral")
  config = json.loads((wrong / "config.json").read_text())
  (wrong / "config.json").write_text(json.dumps({**config, "model_type": "mistral",
                                                 "architectures": ["MistralForCausalLM"]}))
  with pytest.raises(UnsupportedModelError, match=r"model_type='mistral' \(architectures=\['MistralForCausalLM'\]\)"):
    load_pretrained(wrong)
  with pytest.raises(FileNotFoundError, match="config.json"):
    load_pretrained(tmp_path / "nowhere")
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(ckpt / "config.json", empty)
  with pytest.raises(CheckpointError, match="neither model.safetensors.index.json nor"):
    load_pretrained(empty)
  indexed = shutil.copytree(ckpt, tmp_path / "indexed")
  names = load_file(str(indexed / "model.safetensors")).keys()
  weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
  weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
  (indexed / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (indexed / "model.safetensors").rename(indexed / "model-00001-of-00002.safetensors")
  with pytest.raises(CheckpointError, match="refers to missing files: model-00002-of-00002.safetensors"):
    load_pretrained(indexed)
