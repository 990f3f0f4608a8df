"""Small random checkpoints in real on-disk formats, made with transformers (the PyTorch reference).

Each maker returns (checkpoint_dir, torch_model): the directory holds config.json with the
architecture's own keys (SDAR, LLaDA, Dream, ...) and safetensors with its own tensor names; the
torch model is transformers' implementation of the same layout (Qwen3 for SDAR, LLaMA for LLaDA,
Qwen2 for Dream) holding identical weights. Norm scales are randomised too, so a swapped or
missing norm cannot hide behind all-ones weights.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256,
            tie_word_embeddings=False, initializer_range=0.2)  # large enough for peaked attention


def _randomize_norms(model: torch.nn.Module, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))
      elif name.endswith(".bias"):
        p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _save(model, out: pathlib.Path, config_json: dict, max_shard_size: str | None) -> None:
  kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(out, safe_serialization=True, **kwargs)
  (out / "config.json").write_text(json.dumps(config_json, indent=2))
  for extra in ("generation_config.json",):
    (out / extra).unlink(missing_ok=True)


def make_sdar(out: pathlib.Path, sdar_config: dict, *, seed: int = 0, block_size: int = 4, rope_theta: float = 1e6,
              max_shard_size: str | None = None, **dims) -> tuple[pathlib.Path, torch.nn.Module]:
  """SDAR checkpoint: Qwen3 weights under SDAR's names; config.json = SDAR's real one, shrunk to `dims`."""
  torch.manual_seed(seed)
  d = {**TINY, **dims}
  cfg = transformers.Qwen3Config(**d, rope_theta=rope_theta, attn_implementation="eager")
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  _randomize_norms(model, seed)
  sdar = dict(sdar_config)
  sdar.update({k: v for k, v in d.items()}, num_hidden_layers=d["num_hidden_layers"], rope_theta=rope_theta,
              block_size=block_size, mask_token_id=d["vocab_size"] - 1, bos_token_id=0, eos_token_id=1,
              max_window_layers=d["num_hidden_layers"])
  _save(model, out, sdar, max_shard_size)
  return out, model


def make_llada(out: pathlib.Path, *, seed: int = 0, rope_theta: float = 500000.0, **dims
               ) -> tuple[pathlib.Path, torch.nn.Module]:
  """LLaDA checkpoint: LLaMA weights renamed to LLaDA's model.transformer.* names, LLaDA's config keys."""
  torch.manual_seed(seed)
  d = {**TINY, **dims}
  d.pop("head_dim")
  cfg = transformers.LlamaConfig(**d, rope_theta=rope_theta, attn_implementation="eager")
  model = transformers.LlamaForCausalLM(cfg).eval()
  _randomize_norms(model, seed)
  rename = {"self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
            "self_attn.o_proj": "attn_out", "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj",
            "mlp.down_proj": "ff_out", "input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm"}
  tensors = {}
  for name, p in model.state_dict().items():
    if name == "model.embed_tokens.weight":
      new = "model.transformer.wte.weight"
    elif name == "model.norm.weight":
      new = "model.transformer.ln_f.weight"
    elif name == "lm_head.weight":
      new = "model.transformer.ff_out.weight"
    else:
      layer, rest = name.removeprefix("model.layers.").split(".", 1)
      part, suffix = rest.rsplit(".", 1)
      new = f"model.transformer.blocks.{layer}.{rename[part]}.{suffix}"
    tensors[new] = p.contiguous()
  out.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  config = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu",
            "block_type": "llama", "layer_norm_type": "rms", "rope": True, "rope_full_precision": True,
            "alibi": False, "include_bias": False, "include_qkv_bias": False, "attention_layer_norm": False,
            "scale_logits": False, "input_emb_norm": False, "weight_tying": False, "block_group_size": 1,
            "layer_norm_with_affine": True, "bias_for_layer_norm": False, "d_model": d["hidden_size"],
            "n_heads": d["num_attention_heads"], "n_kv_heads": d["num_key_value_heads"],
            "n_layers": d["num_hidden_layers"], "mlp_hidden_size": d["intermediate_size"], "mlp_ratio": 4,
            "embedding_size": d["vocab_size"], "vocab_size": d["vocab_size"] - 16, "rms_norm_eps": d["rms_norm_eps"],
            "rope_theta": rope_theta, "max_sequence_length": d["max_position_embeddings"],
            "mask_token_id": d["vocab_size"] - 2, "eos_token_id": 1, "pad_token_id": 1}
  (out / "config.json").write_text(json.dumps(config, indent=2))
  return out, model


def make_dream(out: pathlib.Path, *, seed: int = 0, **dims) -> tuple[pathlib.Path, torch.nn.Module]:
  """Dream checkpoint: Qwen2 weights (q/k/v biases), config.json with model_type "Dream"."""
  torch.manual_seed(seed)
  d = {**TINY, **dims}
  d.pop("head_dim")
  cfg = transformers.Qwen2Config(**d, rope_theta=1e6, attn_implementation="eager")
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  _randomize_norms(model, seed)
  config = {**d, "model_type": "Dream", "architectures": ["DreamModel"], "rope_theta": 1e6, "rope_scaling": None,
            "hidden_act": "silu", "mask_token_id": d["vocab_size"] - 1, "use_sliding_window": False}
  _save(model, out, config, None)
  return out, model


def make_llama(out: pathlib.Path, *, seed: int = 0, **dims) -> tuple[pathlib.Path, torch.nn.Module]:
  torch.manual_seed(seed)
  d = {**TINY, **dims}
  cfg = transformers.LlamaConfig(**d, rope_theta=10000.0, attn_implementation="eager")
  model = transformers.LlamaForCausalLM(cfg).eval()
  _randomize_norms(model, seed)
  model.save_pretrained(out, safe_serialization=True)
  return out, model


def torch_logits(model: torch.nn.Module, tokens: np.ndarray, mask_BxQxK: np.ndarray,
                 positions: np.ndarray | None = None) -> np.ndarray:
  """Reference logits with an explicit 4-D additive mask (0 where allowed, min float elsewhere)."""
  bias = torch.where(torch.from_numpy(np.array(mask_BxQxK, dtype=bool))[:, None], 0.0, torch.finfo(torch.float32).min)
  bias = bias.expand(tokens.shape[0], 1, *bias.shape[2:])
  kwargs = {} if positions is None else {"position_ids": torch.from_numpy(np.array(positions)).long()}
  with torch.no_grad():
    out = model(torch.from_numpy(np.array(tokens)).long(), attention_mask=bias, **kwargs)
  return out.logits.float().numpy()


def assert_logits_close(ours: np.ndarray, ref: np.ndarray, rtol: float = 1e-5) -> None:
  """Elementwise |ours - ref| <= rtol * (|ref| + max|ref|): relative to the logit scale."""
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  assert ours.shape == ref.shape, (ours.shape, ref.shape)
  scale = np.max(np.abs(ref))
  err = np.abs(ours - ref)
  bound = rtol * (np.abs(ref) + scale)
  assert np.all(err <= bound), f"max abs err {err.max():.3g}, max relative to scale {(err / scale).max():.3g}"


def state_dict_of(ckpt: pathlib.Path) -> dict[str, torch.Tensor]:
  out = {}
  for f in sorted(ckpt.glob("*.safetensors")):
    out.update(load_file(str(f)))
  return out
