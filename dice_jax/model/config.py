"""ModelConfig: one frozen description of every supported architecture, read from config.json.

Supported Hugging Face `model_type`s and what they become:

| model_type | layout                                   | default attention | notes                      |
|------------|------------------------------------------|-------------------|----------------------------|
| sdar       | Qwen3 (q/k RMSNorm, GQA, SwiGLU)          | block_causal      | block_size, mask_token_id  |
| qwen3      | Qwen3                                     | causal            | autoregressive             |
| llada      | LLaMA, LLaDA's own names (OLMo-style keys)| bidirectional     | block_type "llama" only    |
| llama      | LLaMA (HF names)                          | causal            | no biases                  |
| qwen2      | Qwen2 (q/k/v bias, no q/k norm)           | causal            |                            |
| Dream      | Qwen2                                     | bidirectional     | logits shifted by one      |

LLaDA's config.json uses OLMo names (d_model, n_heads, n_kv_heads, n_layers, mlp_hidden_size,
embedding_size, weight_tying, ...); we support `block_type: "llama"`, `activation_type: "silu"`,
`layer_norm_type: "rms"`, `rope: true`, and no biases, alibi, q/k layer norm or logit scaling:
exactly what LLaDA-8B-Base/Instruct ship. Anything else is refused with a message naming the key.
Dream-style models predict token i+1 at position i; `logits_shift=True` shifts their logits right
by one so that, like SDAR and LLaDA, logits at i predict token i.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax.numpy as jnp

# Default attention pattern per architecture (see dice_jax.model.masks).
_DEFAULT_ATTENTION = {"sdar": "block_causal", "qwen3": "causal", "qwen2": "causal", "dream": "bidirectional",
                      "llama": "causal", "llada": "bidirectional"}
SUPPORTED_MODEL_TYPES = ("sdar", "qwen3", "qwen2", "Dream", "llama", "llada")
REMAT_POLICIES = ("none", "minimal", "dots", "dots_no_batch", "full")
ATTENTION_IMPLS = ("auto", "cudnn", "xla", "pallas")


class UnsupportedModelError(ValueError):
  """config.json describes an architecture or option this package does not implement."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture (from config.json) plus how to run it (dtypes, remat, scan, attention kernel)."""
  architecture: str  # one of _DEFAULT_ATTENTION's keys
  vocab_size: int  # rows of the embedding and lm_head (LLaDA: embedding_size)
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1e6
  max_position_embeddings: int = 32768
  qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3/SDAR)
  qkv_bias: bool = False  # bias on q/k/v projections (Qwen2/Dream)
  tie_word_embeddings: bool = False
  attention: str = "causal"  # default pattern: causal | block_causal | bidirectional
  block_size: int = 0  # SDAR block length (block_causal and two_copy masks)
  mask_token_id: int | None = None
  logits_shift: bool = False  # Dream: logits at i predict token i+1; shifted back to align
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  pad_token_id: int | None = None
  # How to run it.
  dtype: str = "float32"  # compute dtype of activations and matmuls
  param_dtype: str = "float32"  # master weights
  remat: str = "none"  # one of REMAT_POLICIES (dice_jax.model.transformer maps them)
  scan_layers: bool = True  # lax.scan over stacked layers; False unrolls (same parameter layout)
  attention_impl: str = "auto"  # auto | cudnn | xla | pallas (dice_jax.model.attention)
  # The config.json this came from, written back by to_hf_dict (not part of equality: it does not
  # change the computation, and jit caches key on the config).
  hf_config_json: str = dataclasses.field(default="{}", compare=False, repr=False)

  def __post_init__(self):
    if self.architecture not in _DEFAULT_ATTENTION:
      raise UnsupportedModelError(f"architecture {self.architecture!r}; supported: {sorted(_DEFAULT_ATTENTION)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat={self.remat!r}; choose one of {REMAT_POLICIES}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl={self.attention_impl!r}; choose one of {ATTENTION_IMPLS}")
    if self.attention not in ("causal", "block_causal", "bidirectional"):
      raise ValueError(f"attention={self.attention!r}; choose causal, block_causal or bidirectional")
    if self.attention == "block_causal" and self.block_size < 1:
      raise ValueError(f"block_causal attention needs block_size >= 1, got {self.block_size}")
    if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
      raise ValueError(f"mask_token_id={self.mask_token_id} is outside the vocabulary ({self.vocab_size})")
    for name in ("dtype", "param_dtype"):
      jnp.dtype(getattr(self, name))  # raises on an unknown dtype name

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> ModelConfig:
    """Parse a Hugging Face config.json dict; `overrides` set run options (dtype, remat, ...)."""
    model_type = d.get("model_type")
    parse = _PARSERS.get(str(model_type).lower() if model_type else "")
    if parse is None:
      raise UnsupportedModelError(
          f"config.json has model_type={model_type!r} (architectures={d.get('architectures')}); "
          f"supported model_type values: {', '.join(SUPPORTED_MODEL_TYPES)}")
    fields = parse(d)
    fields.update(hf_config_json=json.dumps(d, sort_keys=True))
    fields.update(overrides)
    return cls(**fields)

  def to_hf_dict(self) -> dict[str, Any]:
    """config.json for this architecture: the original keys, with our fields written over them."""
    d = json.loads(self.hf_config_json)
    d.update(_WRITERS[self.architecture](self))
    if "rope_parameters" in d:
      d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default"}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
      value = getattr(self, key)
      if value is not None and _first_id(d.get(key)) != value:
        d[key] = value  # a list of eos ids whose first entry is ours is kept as is
    return d


def _get(d: dict, key: str, default: Any = ...) -> Any:
  if key in d and d[key] is not None:
    return d[key]
  if default is ...:
    raise UnsupportedModelError(f"config.json (model_type={d.get('model_type')!r}) lacks required key {key!r}")
  return default


def _rope_theta(d: dict) -> float:
  """rope_theta from transformers 4 (`rope_theta`, `rope_scaling`) or 5 (`rope_parameters`) keys."""
  params = d.get("rope_parameters") or {}
  scaling = d.get("rope_scaling") or {}
  for rope in (params, scaling):
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
      raise UnsupportedModelError(f"rope type {kind!r} is not supported (only default RoPE); config: {rope}")
  return float(params.get("rope_theta", d.get("rope_theta", 10000.0)))


def _check(d: dict, key: str, allowed: tuple, default: Any = None) -> None:
  value = d.get(key, default)
  if value not in allowed:
    raise UnsupportedModelError(f"config.json key {key}={value!r} is not supported (supported: {allowed})")


def _first_id(v):
  return v[0] if isinstance(v, list) and v else v


def _parse_qwen(d: dict, architecture: str) -> dict[str, Any]:
  _check(d, "hidden_act", ("silu",), "silu")
  if d.get("use_sliding_window"):
    raise UnsupportedModelError("config.json key use_sliding_window=true is not supported")
  if any(t != "full_attention" for t in d.get("layer_types") or ()):
    raise UnsupportedModelError(f"config.json layer_types={d['layer_types']} (only full_attention is supported)")
  qwen2 = architecture in ("qwen2", "dream")
  if not qwen2:
    _check(d, "attention_bias", (False,), False)
  heads = _get(d, "num_attention_heads")
  return dict(
      architecture=architecture, vocab_size=_get(d, "vocab_size"), hidden_size=_get(d, "hidden_size"),
      intermediate_size=_get(d, "intermediate_size"), num_layers=_get(d, "num_hidden_layers"),
      num_heads=heads, num_kv_heads=_get(d, "num_key_value_heads", heads),
      head_dim=_get(d, "head_dim", _get(d, "hidden_size") // heads), rms_norm_eps=_get(d, "rms_norm_eps", 1e-6),
      rope_theta=_rope_theta(d), max_position_embeddings=_get(d, "max_position_embeddings", 32768),
      qk_norm=not qwen2, qkv_bias=qwen2, tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      attention=_DEFAULT_ATTENTION[architecture], block_size=int(d.get("block_size") or 0),
      mask_token_id=d.get("mask_token_id"), logits_shift=architecture == "dream",
      bos_token_id=d.get("bos_token_id"), eos_token_id=_first_id(d.get("eos_token_id")),
      pad_token_id=d.get("pad_token_id"))


def _parse_sdar(d: dict) -> dict[str, Any]:
  fields = _parse_qwen(d, "sdar")
  if fields["block_size"] < 1:
    raise UnsupportedModelError("SDAR config.json needs block_size >= 1")
  if fields["mask_token_id"] is None:
    raise UnsupportedModelError("SDAR config.json lacks required key 'mask_token_id'")
  return fields


def _parse_llama(d: dict) -> dict[str, Any]:
  _check(d, "hidden_act", ("silu",), "silu")
  _check(d, "attention_bias", (False,), False)
  _check(d, "mlp_bias", (False,), False)
  heads = _get(d, "num_attention_heads")
  return dict(
      architecture="llama", vocab_size=_get(d, "vocab_size"), hidden_size=_get(d, "hidden_size"),
      intermediate_size=_get(d, "intermediate_size"), num_layers=_get(d, "num_hidden_layers"),
      num_heads=heads, num_kv_heads=_get(d, "num_key_value_heads", heads),
      head_dim=_get(d, "head_dim", _get(d, "hidden_size") // heads), rms_norm_eps=_get(d, "rms_norm_eps", 1e-6),
      rope_theta=_rope_theta(d), max_position_embeddings=_get(d, "max_position_embeddings", 2048),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), attention="causal",
      mask_token_id=d.get("mask_token_id"), bos_token_id=d.get("bos_token_id"),
      eos_token_id=_first_id(d.get("eos_token_id")), pad_token_id=d.get("pad_token_id"))


def _parse_llada(d: dict) -> dict[str, Any]:
  _check(d, "block_type", ("llama",))
  _check(d, "activation_type", ("silu",))
  _check(d, "layer_norm_type", ("rms",))
  _check(d, "rope", (True,))
  for key in ("alibi", "include_bias", "include_qkv_bias", "attention_layer_norm", "scale_logits",
              "input_emb_norm", "bias_for_layer_norm"):
    _check(d, key, (False, None), False)
  _check(d, "layer_norm_with_affine", (True, None), True)
  _check(d, "block_group_size", (1, None), 1)
  heads = _get(d, "n_heads")
  kv_heads = d.get("n_kv_heads")
  if kv_heads is None:
    kv_heads = 1 if d.get("multi_query_attention") else heads
  d_model = _get(d, "d_model")
  return dict(
      architecture="llada", vocab_size=_get(d, "embedding_size", _get(d, "vocab_size")), hidden_size=d_model,
      intermediate_size=_get(d, "mlp_hidden_size", _get(d, "mlp_ratio", 4) * d_model),
      num_layers=_get(d, "n_layers"), num_heads=heads, num_kv_heads=kv_heads, head_dim=d_model // heads,
      rms_norm_eps=_get(d, "rms_norm_eps", 1e-5), rope_theta=float(_get(d, "rope_theta", 10000.0)),
      max_position_embeddings=_get(d, "max_sequence_length", 4096),
      tie_word_embeddings=bool(d.get("weight_tying", False)), attention="bidirectional",
      mask_token_id=_get(d, "mask_token_id", 126336), bos_token_id=d.get("bos_token_id"),
      eos_token_id=_first_id(d.get("eos_token_id")), pad_token_id=d.get("pad_token_id"))


_PARSERS = {
    "sdar": _parse_sdar,
    "qwen3": lambda d: _parse_qwen(d, "qwen3"),
    "qwen2": lambda d: _parse_qwen(d, "qwen2"),
    "dream": lambda d: _parse_qwen(d, "dream"),
    "llama": _parse_llama,
    "llada": _parse_llada,
}


def _write_qwen_llama(c: ModelConfig) -> dict[str, Any]:
  model_type = {"sdar": "sdar", "qwen3": "qwen3", "qwen2": "qwen2", "dream": "Dream", "llama": "llama"}
  architectures = {"sdar": "SDARForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "dream": "DreamModel", "llama": "LlamaForCausalLM"}
  d = dict(model_type=model_type[c.architecture], architectures=[architectures[c.architecture]],
           vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
           num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
           head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=None,
           max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
           hidden_act="silu", attention_bias=c.qkv_bias)
  if c.architecture == "sdar":
    d["block_size"] = c.block_size
  if c.architecture == "llama":
    d["mlp_bias"] = False
  return d


def _write_llada(c: ModelConfig) -> dict[str, Any]:
  return dict(model_type="llada", architectures=["LLaDAModelLM"], d_model=c.hidden_size, n_heads=c.num_heads,
              n_kv_heads=c.num_kv_heads, n_layers=c.num_layers, mlp_hidden_size=c.intermediate_size,
              embedding_size=c.vocab_size, vocab_size=json.loads(c.hf_config_json).get("vocab_size", c.vocab_size),
              rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, max_sequence_length=c.max_position_embeddings,
              weight_tying=c.tie_word_embeddings, block_type="llama", activation_type="silu",
              layer_norm_type="rms", rope=True, alibi=False, include_bias=False, include_qkv_bias=False,
              attention_layer_norm=False, scale_logits=False, input_emb_norm=False)


_WRITERS = {"sdar": _write_qwen_llama, "qwen3": _write_qwen_llama, "qwen2": _write_qwen_llama,
            "dream": _write_qwen_llama, "llama": _write_qwen_llama, "llada": _write_llada}
