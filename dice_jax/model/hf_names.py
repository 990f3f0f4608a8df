"""Which Hugging Face tensor holds which of our parameters, and how their layouts differ.

HF stores a linear layer as weight[out, in]; we store [in, out], with attention projections split
per head ([D, H, K] for q/k/v, [H, K, D] for o) so heads can shard over the 'tensor' mesh axis.
Our layer parameters are stacked ([num_layers, ...]); HF has one tensor per layer.
Names are exactly those of SDAR's model.safetensors.index.json (Qwen3 layout), of transformers'
Qwen2/LLaMA, and of LLaDA's own checkpoints (model.transformer.blocks.N.*).

`read_region` reads only the part of an HF tensor that one device shard needs, so a loader never
holds a whole (stacked) parameter on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from dice_jax.model.config import ModelConfig

# Layout kinds: how our per-layer array relates to the HF tensor.
#   identity:   same array (embeddings, norm scales)
#   transpose:  ours [in, out] = hf[out, in].T
#   heads_out:  ours [D, H, K] = hf[H*K, D].T reshaped   (q/k/v projections)
#   heads_in:   ours [H, K, D] = hf[D, H*K].T reshaped   (o projection)
#   heads_bias: ours [H, K]    = hf[H*K] reshaped        (q/k/v biases)
KINDS = ("identity", "transpose", "heads_out", "heads_in", "heads_bias")


@dataclasses.dataclass(frozen=True)
class HFParam:
  path: tuple[str, ...]  # our nnx.State path
  hf_name: str  # with "{i}" for the layer index when layered
  kind: str
  layered: bool

  def names(self, num_layers: int) -> list[str]:
    return [self.hf_name.format(i=i) for i in range(num_layers)] if self.layered else [self.hf_name]


def _qwen_llama_table(config: ModelConfig) -> list[HFParam]:
  layer = "model.layers.{i}."
  table = [
      HFParam(("embed",), "model.embed_tokens.weight", "identity", False),
      HFParam(("layers", "input_norm", "weight"), layer + "input_layernorm.weight", "identity", True),
      HFParam(("layers", "attn", "q_proj"), layer + "self_attn.q_proj.weight", "heads_out", True),
      HFParam(("layers", "attn", "k_proj"), layer + "self_attn.k_proj.weight", "heads_out", True),
      HFParam(("layers", "attn", "v_proj"), layer + "self_attn.v_proj.weight", "heads_out", True),
      HFParam(("layers", "attn", "o_proj"), layer + "self_attn.o_proj.weight", "heads_in", True),
      HFParam(("layers", "post_attn_norm", "weight"), layer + "post_attention_layernorm.weight", "identity", True),
      HFParam(("layers", "mlp", "gate_proj"), layer + "mlp.gate_proj.weight", "transpose", True),
      HFParam(("layers", "mlp", "up_proj"), layer + "mlp.up_proj.weight", "transpose", True),
      HFParam(("layers", "mlp", "down_proj"), layer + "mlp.down_proj.weight", "transpose", True),
      HFParam(("final_norm", "weight"), "model.norm.weight", "identity", False),
  ]
  if config.qk_norm:
    table += [HFParam(("layers", "attn", "q_norm", "weight"), layer + "self_attn.q_norm.weight", "identity", True),
              HFParam(("layers", "attn", "k_norm", "weight"), layer + "self_attn.k_norm.weight", "identity", True)]
  if config.qkv_bias:
    table += [HFParam(("layers", "attn", f"{p}_bias"), layer + f"self_attn.{p}_proj.bias", "heads_bias", True)
              for p in "qkv"]
  if not config.tie_word_embeddings:
    table.append(HFParam(("lm_head",), "lm_head.weight", "transpose", False))
  return table


def _llada_table(config: ModelConfig) -> list[HFParam]:
  block = "model.transformer.blocks.{i}."
  table = [
      HFParam(("embed",), "model.transformer.wte.weight", "identity", False),
      HFParam(("layers", "input_norm", "weight"), block + "attn_norm.weight", "identity", True),
      HFParam(("layers", "attn", "q_proj"), block + "q_proj.weight", "heads_out", True),
      HFParam(("layers", "attn", "k_proj"), block + "k_proj.weight", "heads_out", True),
      HFParam(("layers", "attn", "v_proj"), block + "v_proj.weight", "heads_out", True),
      HFParam(("layers", "attn", "o_proj"), block + "attn_out.weight", "heads_in", True),
      HFParam(("layers", "post_attn_norm", "weight"), block + "ff_norm.weight", "identity", True),
      HFParam(("layers", "mlp", "gate_proj"), block + "ff_proj.weight", "transpose", True),
      HFParam(("layers", "mlp", "up_proj"), block + "up_proj.weight", "transpose", True),
      HFParam(("layers", "mlp", "down_proj"), block + "ff_out.weight", "transpose", True),
      HFParam(("final_norm", "weight"), "model.transformer.ln_f.weight", "identity", False),
  ]
  if not config.tie_word_embeddings:
    table.append(HFParam(("lm_head",), "model.transformer.ff_out.weight", "transpose", False))
  return table


def param_table(config: ModelConfig) -> list[HFParam]:
  return _llada_table(config) if config.architecture == "llada" else _qwen_llama_table(config)


def is_ignorable(name: str) -> bool:
  """Tensors some checkpoints carry that hold no weights (recomputed RoPE buffers)."""
  return name.endswith("rotary_emb.inv_freq")


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor shape for our per-layer shape."""
  if kind == "identity":
    return shape
  if kind == "transpose":
    return shape[::-1]
  if kind == "heads_out":
    d, h, k = shape
    return (h * k, d)
  if kind == "heads_in":
    h, k, d = shape
    return (d, h * k)
  if kind == "heads_bias":
    return (shape[0] * shape[1],)
  raise ValueError(kind)


def read_region(kind: str, read: Callable[[tuple[slice, ...]], np.ndarray], index: tuple[slice, ...],
                shape: tuple[int, ...]) -> np.ndarray:
  """Our array[index] (per-layer `shape`) from `read(hf_index)`, which slices the HF tensor."""
  index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))
  if kind == "identity":
    return read(index)
  if kind == "transpose":
    return read(index[::-1]).T
  if kind == "heads_out":
    d, h, k = index
    head_dim = shape[2]
    rows = slice(h.start * head_dim, h.stop * head_dim)
    return read((rows, d)).T.reshape(d.stop - d.start, h.stop - h.start, head_dim)[:, :, k]
  if kind == "heads_in":
    h, k, d = index
    head_dim = shape[1]
    cols = slice(h.start * head_dim, h.stop * head_dim)
    return read((d, cols)).T.reshape(h.stop - h.start, head_dim, d.stop - d.start)[:, k, :]
  if kind == "heads_bias":
    h, k = index
    head_dim = shape[1]
    return read((slice(h.start * head_dim, h.stop * head_dim),)).reshape(h.stop - h.start, head_dim)[:, k]
  raise ValueError(kind)


def to_hf(kind: str, ours: np.ndarray) -> np.ndarray:
  """One layer's array in HF layout (contiguous, ready for safetensors)."""
  if kind == "identity":
    out = ours
  elif kind == "transpose":
    out = ours.T
  elif kind == "heads_out":
    out = ours.reshape(ours.shape[0], -1).T
  elif kind == "heads_in":
    out = ours.reshape(-1, ours.shape[-1]).T
  elif kind == "heads_bias":
    out = ours.reshape(-1)
  else:
    raise ValueError(kind)
  return np.ascontiguousarray(out)
