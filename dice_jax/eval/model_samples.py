"""`dice eval --model`: samples from our checkpoint, written into the generations layout.

Greedy (one sample) or K samples at temperature, written as raw completions to
OUT/generations/<id>/<i>.txt batch by batch. A rerun generates only what is missing;
OUT/generations/settings.json pins the model and decoding settings so a rerun with different ones
is refused instead of mixing two experiments. Phase-1 (infilling) problems are prompted with the
phase-1 template.

Decision: its own module, apart from pipeline.py, so that `dice eval --generations` never imports
JAX or loads a model: the command imports this only for `--model`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from dice_jax.data import prompts
from dice_jax.data.problems import Problem
from dice_jax.eval import generations as gen_lib
from dice_jax.eval import report
from dice_jax.sampler.completion import CompletionModel
from dice_jax.sampler.config import SamplerConfig

SETTINGS_FILE = "settings.json"


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """How `--model` samples are made."""

  model_dir: str
  samples: int
  decode: SamplerConfig
  seed: int = 0
  batch_size: int = 8
  infilling_template: prompts.PromptTemplate = prompts.INFILLING
  end_to_end_template: prompts.PromptTemplate = prompts.END_TO_END

  def settings(self, mode: str) -> dict[str, Any]:
    return {"model": str(pathlib.Path(self.model_dir).resolve()), "mode": mode,
            "samples": self.samples, "seed": self.seed,
            "decode": json.loads(json.dumps(dataclasses.asdict(self.decode))),  # as read back
            "templates": [dataclasses.asdict(self.infilling_template),
                          dataclasses.asdict(self.end_to_end_template)]}

  def generate_missing(self, folder: pathlib.Path, problems: Sequence[Problem], mode: str,
                       on_batch: Callable[[int, int], None] | None = None) -> int:
    """Writes the missing raw completions; returns how many were generated."""
    settings = self.settings(mode)
    pinned = check_settings(folder, settings)
    todo = missing_samples(folder, problems, self.samples)
    if not todo:
      return 0
    model = CompletionModel(self.model_dir)
    phase = 1 if mode == gen_lib.INFILLING else 2
    encoded: dict[str, list[int]] = {}
    for p, _ in todo:
      if p.id not in encoded:
        messages = prompts.build_messages(p, phase, infilling=self.infilling_template,
                                          end_to_end=self.end_to_end_template)
        encoded[p.id] = model.encode(messages)
    model.check_fits(list(encoded.values()), self.decode, list(encoded))
    if not pinned:  # pinned once generation can start, so a refused first attempt pins nothing
      report.write_json(folder / SETTINGS_FILE, settings)
    done = 0

    def save(rows: list[int], texts: list[str]) -> None:
      nonlocal done
      for row, text in zip(rows, texts):
        p, i = todo[row]
        gen_lib.write_generation(folder, p.id, i, text, raw=True)
      done += len(rows)
      if on_batch is not None:
        on_batch(done, len(todo))

    model.complete([encoded[p.id] for p, _ in todo], self.decode, seed=self.seed,
                   batch_size=self.batch_size, on_batch=save)
    return done


def check_settings(folder: pathlib.Path, settings: dict[str, Any]) -> bool:
  """Whether OUT/generations is pinned to `settings` already; ValueError if to other settings."""
  path = folder / SETTINGS_FILE
  if not path.exists():
    return False
  old = json.loads(path.read_text(encoding="utf-8"))
  if old != settings:
    changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
    raise ValueError(f"{folder} holds generations made with other settings (changed: "
                     f"{', '.join(changed)}); use a new --out directory, or delete {folder} to "
                     "regenerate")
  return True


def missing_samples(folder: pathlib.Path, problems: Sequence[Problem], samples: int
                    ) -> list[tuple[Problem, int]]:
  """(problem, sample index) pairs with no raw completion yet."""
  out = []
  for p in problems:
    have = {g.sample for g in gen_lib.read_problem(folder, p.id)}
    out += [(p, i) for i in range(samples) if i not in have]
  return out
