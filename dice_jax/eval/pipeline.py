"""`dice eval` end to end: where the samples come from, verification, and everything written.

Samples come from one of three places, all ending as the generations layout
(dice_jax.eval.generations) that is then verified and scored the same way:
- `--generations DIR`: kernels made by anything else, read where they are;
- `--reference-generations`: each problem's known-good candidate, written to OUT/generations
  (checks the harness and the data: the DICE infilling items' own `cuda_code`);
- `--model DIR`: our model, greedy (one sample) or K samples at temperature, written as raw
  completions to OUT/generations/<id>/<i>.txt batch by batch. A rerun generates only what is
  missing; OUT/generations/settings.json pins the model and decoding settings so a rerun with
  different ones is refused instead of mixing two experiments.
Phase-1 (infilling) problems are prompted with the phase-1 template and graded as the problem's
`prefix + generated middle + suffix`, which is how DICE reports its infilling evaluation.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import prompts
from dice_jax.data.problems import Problem
from dice_jax.eval import generations as gen_lib
from dice_jax.eval import report
from dice_jax.eval import runner
from dice_jax.eval.store import VerdictStore
from dice_jax.verifier.connect import Connection

SETTINGS_FILE = "settings.json"


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """How `--model` samples are made."""

  model_dir: str
  samples: int
  decode: Any  # dice_jax.generation.completion.DecodeSettings
  seed: int = 0
  batch_size: int = 8
  infilling_template: prompts.PromptTemplate = prompts.INFILLING
  end_to_end_template: prompts.PromptTemplate = prompts.END_TO_END

  def settings(self, mode: str) -> dict[str, Any]:
    return {"model": str(pathlib.Path(self.model_dir).resolve()), "mode": mode,
            "samples": self.samples, "seed": self.seed,
            "decode": dataclasses.asdict(self.decode),
            "templates": [dataclasses.asdict(self.infilling_template),
                          dataclasses.asdict(self.end_to_end_template)]}


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


def generate_missing(folder: pathlib.Path, problems: Sequence[Problem], source: ModelSource, mode: str,
                     on_batch: Callable[[int, int], None] | None = None) -> int:
  """Writes the missing raw completions; returns how many were generated."""
  from dice_jax.generation.completion import CompletionModel  # pylint: disable=import-outside-toplevel
  settings = source.settings(mode)
  pinned = check_settings(folder, settings)
  todo = missing_samples(folder, problems, source.samples)
  if not todo:
    return 0
  model = CompletionModel(source.model_dir)
  phase = 1 if mode == gen_lib.INFILLING else 2
  encoded: dict[str, list[int]] = {}
  for p, _ in todo:
    if p.id not in encoded:
      messages = prompts.build_messages(p, phase, infilling=source.infilling_template,
                                        end_to_end=source.end_to_end_template)
      encoded[p.id] = model.encode(messages)
  model.check_fits(list(encoded.values()), source.decode, list(encoded))
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

  model.complete([encoded[p.id] for p, _ in todo], source.decode, seed=source.seed,
                 batch_size=source.batch_size, on_batch=save)
  return done


@dataclasses.dataclass
class Outcome:
  """What one `run_eval` did."""

  summary: dict[str, Any]
  sent: int          # candidates sent to the verifier in this run
  from_store: int    # samples whose verdict an earlier run had already stored
  infra: int         # INFRA_ERROR verdicts left (a rerun retries them)
  plots: list[pathlib.Path]


def run_eval(out: pathlib.Path, problems: Sequence[Problem], gens: dict, connection: Connection, *,
             mode: str, options: pb.VerifyOptions, run_info: dict[str, Any],
             on_plan: Callable[[runner.Plan], None] | None = None,
             on_verdict: Callable[[runner.PlannedSample, pb.Verdict], None] | None = None,
             make_plots: bool = True) -> Outcome:
  """Verifies what the store lacks and writes every output; interruptions keep stored verdicts."""
  with VerdictStore(out / "verdicts.jsonl") as store:
    the_plan = runner.plan(problems, gens, store, mode=mode, options=options)
    if on_plan is not None:
      on_plan(the_plan)
    infra = runner.verify_pending(the_plan, connection.client, store, options, on_verdict)
    results = runner.collect(the_plan, store, infra)
  info = dict(run_info)
  info.update(mode=mode, verifier=connection.describe(),
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              options=json.loads(json.dumps(_options_dict(options))))
  summary = report.write_outputs(out, results, info)
  paths = []
  if make_plots:
    from dice_jax.eval import plots  # pylint: disable=import-outside-toplevel  (matplotlib: optional)
    paths = plots.write_plots(out, summary, [r.scores() for r in results])
  return Outcome(summary=summary, sent=len(the_plan.pending), from_store=the_plan.stored,
                 infra=len(infra), plots=paths)


def _options_dict(options: pb.VerifyOptions) -> dict[str, Any]:
  from google.protobuf import json_format  # pylint: disable=import-outside-toplevel
  return json_format.MessageToDict(options, preserving_proto_field_name=True)
