"""ModelConfig from real and representative config.json files; clear errors for what we do not support."""

import json

import jax
import pytest

from dice_jax.model import hf_names
from dice_jax.model.config import ModelConfig, UnsupportedModelError
from dice_jax.model.transformer import abstract_model, count_params

LLADA_8B = {  # LLaDA-8B-Instruct's config.json keys and values (OLMo-style names)
    "architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu", "alibi": False,
    "attention_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_size": 126464, "eos_token_id": 126081, "include_bias": False, "include_qkv_bias": False,
    "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": 126336,
    "max_sequence_length": 4096, "mlp_hidden_size": 12288, "mlp_ratio": 4, "multi_query_attention": None,
    "n_heads": 32, "n_kv_heads": 32, "n_layers": 32, "pad_token_id": 126081, "rms_norm_eps": 1e-05, "rope": True,
    "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False, "vocab_size": 126464,
    "weight_tying": False}


@pytest.fixture(scope="module")
def sdar_dict(shared_dir):
  return json.loads((shared_dir / "models/sdar-4b-chat/config.json").read_text())


@pytest.fixture(scope="module")
def sdar_index(shared_dir):
  return json.loads((shared_dir / "models/sdar-4b-chat/model.safetensors.index.json").read_text())


def test_sdar_4b_config_fields(sdar_dict):
  c = ModelConfig.from_hf_dict(sdar_dict)
  assert (c.architecture, c.attention, c.block_size, c.mask_token_id) == ("sdar", "block_causal", 4, 151669)
  assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (2560, 36, 32, 8, 128)
  assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.rms_norm_eps) == (9728, 151936, 1e6, 1e-6)
  assert c.qk_norm and not c.qkv_bias and not c.tie_word_embeddings and not c.logits_shift
  assert c.eos_token_id == 151643


def test_sdar_4b_names_and_size_match_the_real_index(sdar_dict, sdar_index):
  """Our tensor names for SDAR-4B are exactly its index's, and our parameter count its total size."""
  c = ModelConfig.from_hf_dict(sdar_dict)
  names = {n for p in hf_names.param_table(c) for n in p.names(c.num_layers)}
  assert names == set(sdar_index["weight_map"])
  _, abstract = abstract_model(c)
  assert 2 * count_params(abstract) == sdar_index["metadata"]["total_size"]  # bf16 on disk


def test_round_trip_keeps_original_keys(sdar_dict):
  c = ModelConfig.from_hf_dict(sdar_dict, dtype="bfloat16", remat="full")
  d = c.to_hf_dict()
  assert d == sdar_dict  # unchanged architecture: identical config.json
  assert ModelConfig.from_hf_dict(d, dtype="bfloat16", remat="full") == c


def test_llada_8b_config():
  c = ModelConfig.from_hf_dict(LLADA_8B)
  assert (c.architecture, c.attention, c.mask_token_id, c.vocab_size) == ("llada", "bidirectional", 126336, 126464)
  assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (4096, 32, 32, 32, 128)
  assert (c.intermediate_size, c.rope_theta, c.rms_norm_eps, c.qk_norm) == (12288, 500000.0, 1e-5, False)
  _, abstract = abstract_model(c)
  per_layer = 4 * 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096  # q,k,v,o + gate,up,down + 2 norms
  assert count_params(abstract) == 2 * 126464 * 4096 + 32 * per_layer + 4096  # 8.02 B, as published
  assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


def test_transformers5_rope_parameters_and_dream():
  qwen3 = {"model_type": "qwen3", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
           "rope_parameters": {"rope_theta": 1234.0, "rope_type": "default"},
           "layer_types": ["full_attention", "full_attention"]}
  c = ModelConfig.from_hf_dict(qwen3)
  assert (c.rope_theta, c.attention, c.qk_norm) == (1234.0, "causal", True)
  dream = {**qwen3, "model_type": "Dream", "mask_token_id": 99}
  dream.pop("head_dim")
  d = ModelConfig.from_hf_dict(dream)
  assert (d.attention, d.logits_shift, d.qkv_bias, d.qk_norm, d.head_dim) == ("bidirectional", True, True, False, 8)


@pytest.mark.parametrize("change, fragment", [
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "model_type='mistral'"),
    ({"model_type": None}, "supported model_type values: sdar, qwen3, qwen2, Dream, llama, llada"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"block_size": None}, "block_size"),
])
def test_unsupported_sdar_variants_are_named(sdar_dict, change, fragment):
  with pytest.raises(UnsupportedModelError, match=None) as e:
    ModelConfig.from_hf_dict({**sdar_dict, **change})
  assert fragment in str(e.value)


@pytest.mark.parametrize("change, fragment", [
    ({"block_type": "sequential"}, "block_type='sequential'"),
    ({"alibi": True}, "alibi=True"),
    ({"include_qkv_bias": True}, "include_qkv_bias=True"),
    ({"layer_norm_type": "default"}, "layer_norm_type='default'"),
])
def test_unsupported_llada_variants_are_named(change, fragment):
  with pytest.raises(UnsupportedModelError) as e:
    ModelConfig.from_hf_dict({**LLADA_8B, **change})
  assert fragment in str(e.value)


def test_bad_run_options(sdar_dict):
  with pytest.raises(ValueError, match="remat"):
    ModelConfig.from_hf_dict(sdar_dict, remat="sometimes")
  with pytest.raises(ValueError, match="attention_impl"):
    ModelConfig.from_hf_dict(sdar_dict, attention_impl="flash")
  with pytest.raises(TypeError):
    ModelConfig.from_hf_dict(sdar_dict, dtype="bfloat17")
  with pytest.raises(ValueError, match="mask_token_id"):
    ModelConfig.from_hf_dict({**sdar_dict, "mask_token_id": 10**6})
  assert jax.numpy.dtype(ModelConfig.from_hf_dict(sdar_dict, dtype="bfloat16").compute_dtype).name == "bfloat16"
