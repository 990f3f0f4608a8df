"""Diffusion decoding: block diffusion with an exact KV cache (SDAR), semi-autoregressive and
infilling decoding for bidirectional models (LLaDA, Dream), with the trace TraceRL trains on.

SamplerConfig (config.py) is the one sampling-settings type of the project: the library's argument,
`dice train`'s `rollout` section and the source of `dice eval`/`dice generate`'s sampling flags.

Decision: the names below are imported on first use (as in dice_jax/__init__.py), so reading
SamplerConfig (the command-line parsers do) does not import JAX.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "generate": "dice_jax.sampler.api",
    "sample": "dice_jax.sampler.api",
    "SamplerConfig": "dice_jax.sampler.config",
    "Rollout": "dice_jax.sampler.rollout",
    "masked_state": "dice_jax.sampler.rollout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'dice_jax.sampler' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return __all__
