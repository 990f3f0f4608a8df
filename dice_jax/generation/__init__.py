"""Generating kernels with a trained model: `KernelGenerator` (verified best-of-N for a user's
PyTorch module), prompts with target architecture, precision and statically read input shapes.
The batched completion model it shares with `dice eval --model` is dice_jax.sampler.completion."""

from dice_jax.generation.generator import GenerationResult, KernelGenerator
from dice_jax.generation.ranking import Candidate

__all__ = ["Candidate", "GenerationResult", "KernelGenerator"]
