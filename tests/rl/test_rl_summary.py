"""The end-of-run summary: outcome counts per item phase, and a zero-reward note that states the
counts it read (never a guess about the cause)."""

from __future__ import annotations

import io

from rich.console import Console

from dice_jax.rewards import outcomes
from dice_jax.rl import summary
from dice_jax.rl.loop import RLResult


def _record(step: int, share: float, reward: float, phase1: dict, phase2: dict) -> dict:
  record = {"step": step, "curriculum/phase2_share": share, "reward": reward, "compile": 0.0, "correct": 0.0}
  labels = [name for name, n in phase1.items() for _ in range(n)] + [name for name, n in phase2.items() for _ in range(n)]
  phases = [1] * sum(phase1.values()) + [2] * sum(phase2.values())
  return record | outcomes.metrics(labels, phases)


def _printed(history, run_dir="/runs/x") -> str:
  out = io.StringIO()
  summary.print_summary(RLResult("done", len(history), 0, history, run_dir, None, "local"),
                        Console(file=out, width=200))
  return out.getvalue()


def test_zero_rewards_are_explained_by_the_counted_outcomes():
  history = [_record(1, 0.0, 0.0, {"FORMAT": 6, "UNREACHABLE": 2}, {}),
             _record(2, 1.0, 0.0, {}, {"COMPILE_ERROR": 5, "FORMAT": 3})]
  text = _printed(history)
  assert ("No response earned any reward. 1 (infilling): 6 FORMAT (no code found, never sent), 2 UNREACHABLE "
          "(no verifier answered); 2 (end to end): 5 COMPILE_ERROR (did not compile), 3 FORMAT") in text
  assert "/runs/x/samples/" in text
  assert "UNREACHABLE" in text.split("responses by outcome")[1]  # the counts table


def test_a_run_that_earned_rewards_gets_no_zero_reward_note():
  history = [_record(1, 0.0, 0.4, {"NO_GPU": 3, "COMPILE_ERROR": 5}, {})]
  text = _printed(history)
  assert "No response earned" not in text and "NO_GPU" in text


def test_labels_of_verdicts():
  from dice.verifier.v1 import verifier_pb2 as pb
  from dice_jax.rewards.candidates import format_verdict
  from dice_jax.verifier.client import infra_verdict

  server = pb.Environment(server_version="0.1.0")
  assert outcomes.label(format_verdict("format: empty generation")) == "FORMAT"
  assert outcomes.label(infra_verdict("r1", "no verifier reachable: x")) == "UNREACHABLE"
  assert outcomes.label(pb.Verdict(request_id="r2", outcome=pb.INFRA_ERROR, environment=server)) == "INFRA_ERROR"
  # A REJECTED verdict of the verifier whose message happens to start with "format:" is the verifier's.
  assert outcomes.label(pb.Verdict(request_id="r3", outcome=pb.REJECTED, stage=pb.STAGE_PARSE,
                                   message="format: x", environment=server)) == "REJECTED"
  assert outcomes.label(pb.Verdict(request_id="r4", outcome=pb.COMPILE_ERROR, environment=server)) == "COMPILE_ERROR"
