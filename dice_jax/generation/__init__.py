"""Generating kernels with a trained model: `KernelGenerator` (verified best-of-N for a user's
PyTorch module), prompts with target architecture, precision and statically read input shapes,
and the batched completion model shared with `dice eval --model`."""

from dice_jax.generation.generator import GenerationResult, KernelGenerator
from dice_jax.generation.ranking import Candidate

__all__ = ["Candidate", "GenerationResult", "KernelGenerator"]
