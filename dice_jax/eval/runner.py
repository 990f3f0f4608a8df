"""One evaluation pass: plan what needs a verdict, verify it concurrently, collect the results.

`plan` builds every sample's candidate and store key and sees which keys the store already has;
`verify_pending` sends each distinct pending candidate once (all concurrently, over the client's
streams) and persists every verdict the moment it arrives; `collect` reads the results back from
the store. Splitting it so makes the resume rule easy to state and test: a key in the store is
never sent again, and an interrupted `verify_pending` leaves the store holding exactly the verdicts
that came back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data.problems import Problem
from dice_jax.eval import generations as gen_lib
from dice_jax.eval import records
from dice_jax.eval.metrics import ProblemScores
from dice_jax.eval.store import VerdictStore, item_key
from dice_jax.rewards.candidates import format_verdict
from dice_jax.verifier.client import VerifyItem
from dice_jax.verifier.sync_client import VerifierClient


@dataclasses.dataclass(frozen=True)
class PlannedSample:
  """One sample: its graded candidate and store key, or the format failure that replaces them."""

  problem: Problem
  generation: gen_lib.Generation
  candidate: str | None
  key: str | None
  format_failure: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
  samples: tuple[PlannedSample, ...]
  pending: dict[str, PlannedSample]  # key -> the first sample with it, for every key not stored
  stored: int = 0  # samples whose verdict an earlier run already stored


@dataclasses.dataclass
class SampleResult:
  sample: int
  path: str
  verdict: pb.Verdict
  key: str | None


@dataclasses.dataclass
class ProblemResult:
  problem: Problem
  samples: list[SampleResult]

  def scores(self) -> ProblemScores:
    return ProblemScores(self.problem.id, self.problem.level,
                         tuple(records.score(s.verdict) for s in self.samples))


def plan(problems: Sequence[Problem], generations: Mapping[str, Sequence[gen_lib.Generation]],
         store: VerdictStore, *, mode: str, options: pb.VerifyOptions) -> Plan:
  """Every sample of every problem that has generations, and the keys still to verify."""
  samples, pending, stored = [], {}, 0
  for problem in problems:
    for generation in generations.get(problem.id, ()):
      found = gen_lib.candidate(problem, generation, mode)
      if not found.ok:
        samples.append(PlannedSample(problem, generation, None, None, found.failure))
        continue
      key = item_key(problem.reference_source, found.candidate, options)
      planned = PlannedSample(problem, generation, found.candidate, key)
      samples.append(planned)
      if key in store:
        stored += 1
      elif key not in pending:
        pending[key] = planned
  return Plan(tuple(samples), pending, stored)


def verify_pending(the_plan: Plan, client: VerifierClient, store: VerdictStore,
                   options: pb.VerifyOptions,
                   on_verdict: Callable[[PlannedSample, pb.Verdict], None] | None = None
                   ) -> dict[str, pb.Verdict]:
  """Verifies every pending key once (one request each), storing verdicts as they arrive.

  Returns the INFRA_ERROR verdicts by key: they are not stored, so a rerun asks again.

  On an exception (Ctrl-C included) the outstanding requests are cancelled and the exception
  propagates; what already came back is in the store.
  """
  futures: dict[concurrent.futures.Future, tuple[str, PlannedSample]] = {}
  infra: dict[str, pb.Verdict] = {}
  for key, s in the_plan.pending.items():
    item = VerifyItem(s.problem.reference_source, s.candidate, options)
    futures[client.submit([item])] = (key, s)
  try:
    for future in concurrent.futures.as_completed(futures):
      key, s = futures[future]
      verdict = future.result()[0]
      if verdict.outcome == pb.INFRA_ERROR:
        infra[key] = verdict
      else:
        store.put(key, verdict, problem_id=s.problem.id, sample=s.generation.sample)
      if on_verdict is not None:
        on_verdict(s, verdict)
  finally:
    for future in futures:
      future.cancel()
  return infra


def _infra(message: str) -> pb.Verdict:
  return pb.Verdict(outcome=pb.INFRA_ERROR, stage=pb.STAGE_QUEUE, message=message)


def collect(the_plan: Plan, store: VerdictStore,
            infra: Mapping[str, pb.Verdict] | None = None) -> list[ProblemResult]:
  """Results per problem in plan order; `infra`: this run's INFRA_ERROR verdicts (never stored)."""
  infra = infra or {}
  by_problem: dict[str, ProblemResult] = {}
  for s in the_plan.samples:
    if s.key is None:
      verdict = format_verdict(s.format_failure)
    else:
      verdict = store.get(s.key) or infra.get(s.key) or _infra(
          "no verdict: the evaluation was interrupted before this candidate was verified")
    result = by_problem.setdefault(s.problem.id, ProblemResult(s.problem, []))
    result.samples.append(SampleResult(s.generation.sample, str(s.generation.path), verdict, s.key))
  return list(by_problem.values())
