"""The policy model: config, Flax NNX modules run as pure functions, masks, HF checkpoints, tokenizer.

    from dice_jax.model import load_pretrained, forward, masks
    model = load_pretrained("ckpt_dir", dtype="bfloat16")
    graphdef, state = nnx.split(model)
    logits_BxLxV = forward(graphdef, state, tokens_BxL, masks.block_causal(4))
"""

from dice_jax.model import masks
from dice_jax.model.config import ModelConfig, UnsupportedModelError
from dice_jax.model.hf_io import CheckpointError, load_pretrained, read_config, save_pretrained
from dice_jax.model.tokenizer import Tokenizer, load_tokenizer
from dice_jax.model.transformer import Transformer, abstract_model, forward, init_model

__all__ = ["masks", "ModelConfig", "UnsupportedModelError", "CheckpointError", "load_pretrained", "read_config",
           "save_pretrained", "Tokenizer", "load_tokenizer", "Transformer", "abstract_model", "forward", "init_model"]
