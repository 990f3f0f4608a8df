"""dice-jax: diffusion language models that learn to write CUDA kernels (trainer side)."""
