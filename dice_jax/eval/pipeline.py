"""`dice eval` end to end: verification of the generations layout, and everything written.

Samples come from one of three places, all ending as the generations layout
(dice_jax.eval.generations) that is then verified and scored the same way:
- `--generations DIR`: kernels made by anything else, read where they are;
- `--reference-generations`: each problem's known-good candidate, written to OUT/generations
  (checks the harness and the data: the DICE infilling items' own `cuda_code`);
- `--model DIR`: our model (dice_jax.eval.model_samples), written as raw completions.
Phase-1 (infilling) problems are graded as the problem's `prefix + generated middle + suffix`,
which is how DICE reports its infilling evaluation.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data.problems import Problem
from dice_jax.eval import report
from dice_jax.eval import runner
from dice_jax.eval.store import VerdictStore
from dice_jax.verifier.connect import Connection


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
