"""Diffusion decoding: block diffusion with an exact KV cache (SDAR), semi-autoregressive and
infilling decoding for bidirectional models (LLaDA, Dream), with the trace TraceRL trains on.

SamplerConfig (config.py) is the one sampling-settings type of the project: the library's argument,
`dice train`'s `rollout` section and the source of `dice eval`/`dice generate`'s sampling flags.

Decision: the names below are imported on first use (dice_jax/lazy.py), so reading SamplerConfig
(the command-line parsers do) does not import JAX.
"""

from __future__ import annotations

from dice_jax import lazy

__getattr__, __dir__ = lazy.exports(__name__, {"dice_jax.sampler.api": ("generate", "sample"),
                                                "dice_jax.sampler.config": ("SamplerConfig",),
                                                "dice_jax.sampler.rollout": ("Rollout", "masked_state")})
__all__ = __dir__()
