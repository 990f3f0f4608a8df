"""The `model:` config section and turning it into sharded parameters and a tokenizer.

Shared by SFT and RL. A run starts from a Hugging Face checkpoint directory (`path`) or from a
random model described by config.json fields (`init`, e.g. the tiny configs). Abstract parameters
(shapes, dtypes, shardings, nothing allocated) come first, so a resumed run restores its orbax
checkpoint straight onto the devices without ever reading the pretrained weights.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from dice_jax import sharding
from dice_jax.config import ConfigError, require, require_dir
from dice_jax.model import hf_io, transformer
from dice_jax.model.config import ATTENTION_IMPLS, REMAT_POLICIES, ModelConfig, UnsupportedModelError
from dice_jax.model.tokenizer import Tokenizer, load_tokenizer
from dice_jax.train import tiny_tokenizer


@dataclasses.dataclass(frozen=True)
class ModelSection:
  # A Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files).
  path: str | None = None
  # Or: config.json fields of a randomly initialised model (used when `path` is null).
  init: dict[str, Any] | None = None
  # Tokenizer directory; null: `path`. `builtin:bytes`: the byte-level tokenizer for tiny models.
  tokenizer: str | None = None
  dtype: str = "bfloat16"  # compute dtype (activations, matmuls)
  param_dtype: str = "float32"  # master weights and optimizer state
  remat: str = "none"
  scan_layers: bool = True
  attention_impl: str = "auto"
  seed: int = 0  # random init only

  def __post_init__(self):
    require_dir(self.path, "path")
    require((self.path is None) != (self.init is None), "path",
            "set exactly one of model.path (a checkpoint directory) and model.init (a random model)")
    require(self.remat in REMAT_POLICIES, "remat", f"{self.remat!r} is not one of {list(REMAT_POLICIES)}")
    require(self.attention_impl in ATTENTION_IMPLS, "attention_impl",
            f"{self.attention_impl!r} is not one of {list(ATTENTION_IMPLS)}")
    for name in ("dtype", "param_dtype"):
      require(getattr(self, name) in ("bfloat16", "float32", "float16"), name,
              f"must be bfloat16, float16 or float32, got {getattr(self, name)!r}")
    if self.tokenizer is None:
      require(self.path is not None, "tokenizer", "a random model (model.init) needs model.tokenizer "
              f"(a tokenizer directory, or {tiny_tokenizer.BUILTIN!r})")
    elif self.tokenizer != tiny_tokenizer.BUILTIN:
      require_dir(self.tokenizer, "tokenizer")


def model_config(section: ModelSection) -> ModelConfig:
  """ModelConfig from the checkpoint's config.json or from `init`, with the run options."""
  run = dict(dtype=section.dtype, param_dtype=section.param_dtype, remat=section.remat,
             scan_layers=section.scan_layers, attention_impl=section.attention_impl)
  try:
    if section.path is not None:
      return hf_io.read_config(section.path, **run)
    return ModelConfig.from_hf_dict(dict(section.init), **run)
  except (UnsupportedModelError, ValueError, TypeError) as e:
    raise ConfigError(f"model: {e}") from None


def tokenizer_for(section: ModelSection, run_dir: str) -> tuple[Tokenizer, str]:
  """(tokenizer, its directory): the byte tokenizer is written under the run directory."""
  source = section.tokenizer or section.path
  if source == tiny_tokenizer.BUILTIN:
    source = str(tiny_tokenizer.write_byte_tokenizer(os.path.join(run_dir, "tokenizer")))
  return load_tokenizer(source), source


def check_compatible(config: ModelConfig, tokenizer: Tokenizer) -> None:
  """A tokenizer whose ids do not fit the model would index past the embedding: refuse it."""
  if tokenizer.vocab_size > config.vocab_size:
    raise ConfigError(f"model: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                      f"vocab_size is {config.vocab_size}")
  if config.mask_token_id is not None and tokenizer.mask_id not in (None, config.mask_token_id):
    raise ConfigError(f"model: mask_token_id {config.mask_token_id} in the model config differs "
                      f"from the tokenizer's mask token id {tokenizer.mask_id}")


def abstract_params(config: ModelConfig, mesh: Mesh) -> tuple[nnx.GraphDef, Any, Any]:
  """(graphdef, abstract params carrying shardings, params shardings); allocates nothing."""
  graphdef, abstract = transformer.abstract_model(config)
  shardings = sharding.state_shardings(abstract, mesh)
  placed = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        abstract, shardings)
  return graphdef, placed, shardings


def load_params(section: ModelSection, config: ModelConfig, mesh: Mesh) -> Any:
  """The parameters (nnx.State), read or initialised directly onto their shards."""
  if section.path is not None:
    model = hf_io.load_pretrained(section.path, mesh=mesh, dtype=config.dtype,
                                  param_dtype=config.param_dtype, remat=config.remat,
                                  scan_layers=config.scan_layers,
                                  attention_impl=config.attention_impl)
  else:
    model = transformer.init_model(config, mesh=mesh, seed=section.seed)
  return nnx.state(model)
