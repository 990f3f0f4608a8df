"""The policy model: config, Flax NNX modules run as pure functions, masks, HF checkpoints, tokenizer."""
