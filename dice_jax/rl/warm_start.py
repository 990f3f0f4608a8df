"""`dice train`'s `warm_start` section: a short SFT of a *random* model before its RL.

A randomly initialised model (`model.init`, the built-in tiny run) writes no code, so every verdict
is FORMAT and RL has nothing to reinforce. The warm start first teaches it the shape of an answer:
`steps` SFT updates (dice_jax.train.sft_loop, SDAR's two-copy objective) on the known-good answers of
`problems`, phase 1 (the `source = \"\"\"...\"\"\"` middle of a scaffold) and phase 2 (the whole file),
with the very prompts RL will show. RL then starts from that model, on `data.phase1_files` /
`data.phase2_files`; the built-in run's RL problems are ones the warm start never saw
(dice_jax.rl.warm_start_run checks and reports the overlap), so what RL earns is not recall.

`tokenizer_size` > 0 fits a byte-level BPE of at most that many tokens to the warm start's texts
(dice_jax.train.bpe_tokenizer: the byte tokenizer's ids plus merges) and raises the model's
`vocab_size` to match: a third as many positions to sample, score and attend over as bytes.

Decision: it applies only to a random model. A `model.path` checkpoint has had its own SFT (`dice
sft`, the recipes), so the section is ignored there, and the SDAR recipes need not turn it off.
The warm start's files (examples, tokenizer, checkpoints, metrics, hf/) go to `<run_dir>/warm_start`;
a rerun of the same command skips a finished warm start and resumes an interrupted one.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from dice_jax.config import require
from dice_jax.data.problems import ProblemLoadError, check_source
from dice_jax.train.bpe_tokenizer import BASE_SIZE


@dataclasses.dataclass(frozen=True)
class WarmStartSection:
  steps: int = 250  # SFT updates before RL when the model is random (model.init); 0: none
  # Problem sources whose known-good answers are the examples (phase-1 items: a prefix/middle/suffix).
  problems: tuple[str, ...] = ("bundled:elementwise_warmup",)
  tokenizer_size: int = 640  # fit a byte-level BPE of at most this many tokens; 0: keep model.tokenizer
  batch_size: int = 4  # examples per SFT update
  max_length: int = 400  # tokens per example (prompt + answer + padding); longer ones are left out
  lr: float = 3.0e-3  # AdamW's peak, reached after warmup_steps
  warmup_steps: int = 10
  # After the warm-up: "cosine" decays to 0 by the last step, "linear" too, "constant" stays at lr.
  schedule: Literal["constant", "cosine", "linear"] = "cosine"
  seed: int = 0  # example order and noising

  def __post_init__(self):
    require(self.steps >= 0, "steps", f"must be >= 0 (0: no warm start), got {self.steps}")
    require(self.steps == 0 or bool(self.problems), "problems", "a warm start needs at least one problem source")
    for i, path in enumerate(self.problems):
      try:
        check_source(path)
      except ProblemLoadError as e:
        require(False, f"problems[{i}]", str(e))
    require(self.tokenizer_size == 0 or self.tokenizer_size >= BASE_SIZE, "tokenizer_size",
            f"0 (keep model.tokenizer) or >= {BASE_SIZE} (bytes and special tokens), got {self.tokenizer_size}")
    require(self.batch_size > 0, "batch_size", f"must be > 0, got {self.batch_size}")
    require(self.max_length > 1, "max_length", f"must be > 1, got {self.max_length}")
    require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
    require(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
