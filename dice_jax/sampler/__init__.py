"""Diffusion decoding: block diffusion with an exact KV cache (SDAR), semi-autoregressive and
infilling decoding for bidirectional models (LLaDA, Dream), with the trace TraceRL trains on."""

from dice_jax.sampler.api import generate, sample
from dice_jax.sampler.config import SamplerConfig
from dice_jax.sampler.rollout import Rollout, masked_state

__all__ = ["Rollout", "SamplerConfig", "generate", "masked_state", "sample"]
