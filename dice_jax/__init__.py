"""dice-jax: diffusion language models that learn to write CUDA kernels (trainer side).

The public surface (ARCHITECTURE.md, "Public surface"), imported lazily so `import dice_jax` and
`dice --help` stay fast and do not initialise JAX:

    import dice_jax as dj
    model = dj.load_pretrained("ckpt_dir")                 # HF layout: config.json + *.safetensors
    logits_BxLxV = model(tokens_BxL, attention="block_causal")
    dj.save_pretrained(model, "out_dir")
    tok = dj.load_tokenizer("ckpt_dir")
    rollout = dj.sample(model, prompt_ids, rng, dj.SamplerConfig(...))
    gen = dj.KernelGenerator("ckpt_dir", verifier="HOST:PORT")
"""

from __future__ import annotations

import importlib

# Public name -> module that defines it.
_EXPORTS = {
    "load_pretrained": "dice_jax.model.hf_io",
    "save_pretrained": "dice_jax.model.hf_io",
    "load_tokenizer": "dice_jax.model.tokenizer",
    "ModelConfig": "dice_jax.model.config",
    "sample": "dice_jax.sampler",
    "SamplerConfig": "dice_jax.sampler",
    "Rollout": "dice_jax.sampler",
    "KernelGenerator": "dice_jax.generation",
    "GenerationResult": "dice_jax.generation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'dice_jax' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> list[str]:
  return __all__
