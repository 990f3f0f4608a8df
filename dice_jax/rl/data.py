"""The RL run's prompts: problem files -> per-phase streams, with every prompt tokenised once.

Problems come from dice_jax.data (DICE JSON/JSONL, KernelBench dirs, `bundled:tiny`), prompts from
its phase-1/phase-2 templates rendered with the model's chat template. Every problem's prompt is
tokenised at start-up: a prompt longer than `data.max_prompt_length` tokens (the sampler's static
width) is left out with a logged count, as DICE filters by `max_prompt_len`, and a phase left with
no problem is a clear error before anything compiles.

`builtin:compact` templates (the `tiny` config) keep the instructions to a line, so byte-level
prompts of the bundled problems stay around a thousand tokens on a laptop CPU.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import jax

from dice_jax.config import ConfigError
from dice_jax.data import prompts as prompts_lib
from dice_jax.data.problems import Problem, load_problems
from dice_jax.data.rl_data import BiPhaseStream, ProblemStream
from dice_jax.model.tokenizer import Tokenizer
from dice_jax.rl.config import DataSection

log = logging.getLogger(__name__)

_DICE_EVALUATION_SET = "kernel_infilling_evaluation.json"  # DICE's phase-1 test items (no `?split=`)
COMPACT_INFILLING = prompts_lib.PromptTemplate(system=None, user=(
    "Reference:\n```python\n{reference}\n```\nWrite the missing `source = \"\"\"...\"\"\"` (CUDA code) "
    "of this file:\n```python\n{scaffold}\n```"))
COMPACT_END_TO_END = prompts_lib.PromptTemplate(system=None, user=(
    "Write `class ModelNew` with custom CUDA kernels (load_inline) for:\n```python\n{reference}\n```"))


def _template(value: str | None, default: prompts_lib.PromptTemplate, compact: prompts_lib.PromptTemplate
              ) -> prompts_lib.PromptTemplate:
  if value is None:
    return default
  if value == "builtin:compact":
    return compact
  try:
    return prompts_lib.PromptTemplate.from_yaml(os.path.expanduser(value))
  except ValueError as e:
    raise ConfigError(f"data: {e}") from None


@dataclasses.dataclass(frozen=True)
class Prompt:
  ids: tuple[int, ...]
  text: str


class PromptBook:
  """Tokenised prompts of every (phase, problem id) the run may draw."""

  def __init__(self, cfg: DataSection, tokenizer: Tokenizer):
    self.cfg = cfg
    self.tokenizer = tokenizer
    self.infilling = _template(cfg.infilling_template, prompts_lib.INFILLING, COMPACT_INFILLING)
    self.end_to_end = _template(cfg.end_to_end_template, prompts_lib.END_TO_END, COMPACT_END_TO_END)
    self._prompts: dict[tuple[int, str], Prompt] = {}

  def problems(self, phase: int, files: tuple[str, ...]) -> list[Problem]:
    """The phase's problems whose prompts fit; each prompt tokenised and kept."""
    loaded: dict[str, Problem] = {}
    for path in files:
      for problem in load_problems(path):
        if problem.id in loaded:
          raise ConfigError(f"data.phase{phase}_files: problem id {problem.id!r} appears twice "
                            f"({loaded[problem.id].origin} and {problem.origin})")
        loaded[problem.id] = problem
    kept, too_long = [], 0
    for problem in loaded.values():
      if phase == 1 and not problem.has_scaffold:
        raise ConfigError(f"data.phase1_files: problem {problem.id!r} ({problem.origin}) has no prefix/middle/"
                          "suffix scaffold; phase-1 (infilling) files need one per item")
      text = self.render(problem, phase)
      ids = self.tokenizer.encode(text)
      if len(ids) > self.cfg.max_prompt_length:
        too_long += 1
        continue
      self._prompts[(phase, problem.id)] = Prompt(tuple(ids), text)
      kept.append(problem)
    if too_long:
      log.warning("phase %d: %d of %d problems have prompts over data.max_prompt_length=%d tokens; left out",
                  phase, too_long, len(loaded), self.cfg.max_prompt_length)
    if not kept:
      raise ConfigError(f"data.phase{phase}_files: none of the {len(loaded)} problems has a prompt of at most "
                        f"data.max_prompt_length={self.cfg.max_prompt_length} tokens")
    return kept

  def render(self, problem: Problem, phase: int) -> str:
    """The prompt text of `problem` in `phase`: the phase's template in the model's chat template."""
    messages = prompts_lib.build_messages(problem, phase, infilling=self.infilling, end_to_end=self.end_to_end)
    return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

  def prompt(self, phase: int, problem_id: str) -> Prompt:
    return self._prompts[(phase, problem_id)]

  def stream(self, phase1_files: tuple[str, ...], phase2_files: tuple[str, ...], *, need_phase1: bool,
             need_phase2: bool) -> BiPhaseStream:
    """The checkpointable two-phase stream; this process takes its shard of every global batch."""
    for path in phase1_files:
      if os.path.basename(path) == _DICE_EVALUATION_SET:
        log.warning("data.phase1_files: %s is DICE's phase-1 evaluation set: training on all of it leaves nothing "
                    "unseen to evaluate on; use %s?split=train and evaluate on ?split=heldout", path, path)
    streams = {}
    for phase, files, needed in ((1, phase1_files, need_phase1), (2, phase2_files, need_phase2)):
      if not needed:
        streams[phase] = None
        continue
      problems = self.problems(phase, files)
      log.info("phase %d: %d problems from %s", phase, len(problems), ", ".join(files))
      streams[phase] = ProblemStream(
          problems, phase=phase, seed=self.cfg.seed + phase, shard_index=jax.process_index(),
          shard_count=jax.process_count(), infilling=self.infilling, end_to_end=self.end_to_end,
          backend=self.cfg.backend)
    return BiPhaseStream(streams[1], streams[2])
