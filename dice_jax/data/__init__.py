"""Problems, prompts, code extraction and the grain input pipeline for RL and evaluation."""
