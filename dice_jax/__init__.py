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

from dice_jax import lazy

# Module -> the public names it defines.
_EXPORTS = {
    "dice_jax.model.hf_io": ("load_pretrained", "save_pretrained"),
    "dice_jax.model.tokenizer": ("load_tokenizer",),
    "dice_jax.model.config": ("ModelConfig",),
    "dice_jax.sampler": ("sample", "SamplerConfig", "Rollout"),
    "dice_jax.generation": ("KernelGenerator", "GenerationResult"),
}
__getattr__, __dir__ = lazy.exports(__name__, _EXPORTS)
__all__ = __dir__()
