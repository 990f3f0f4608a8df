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


def _rated(step: int, share: float, reward: float, compile_rate: float, phase1: dict, phase2: dict) -> dict:
  return _record(step, share, reward, phase1, phase2) | {"compile": compile_rate, "format": 1.0}


def test_first_and_last_step_of_each_phase_side_by_side():
  history = [_rated(1, 0.0, 0.2, 0.0, {"COMPILE_ERROR": 6, "FORMAT": 2}, {}),
             _rated(2, 0.0, 0.5, 0.25, {"NO_GPU": 2, "COMPILE_ERROR": 6}, {}),
             _rated(3, 0.0, 0.9, 0.75, {"NO_GPU": 6, "COMPILE_ERROR": 2}, {}),
             _rated(4, 1.0, 0.1, 0.0, {}, {"FORMAT": 8})]
  text = _printed(history)
  table = text.split("first and last step of each phase")[1].split("responses by outcome")[0]
  lines = table.splitlines()
  header = next(i for i, line in enumerate(lines) if "phase 1 first" in line)
  assert "phase 1 last" in lines[header] and "phase 2 first" in lines[header]
  assert "phase 2 last" not in table  # one phase-2 step: only its first
  assert "step 1" in lines[header + 1] and "step 3" in lines[header + 1] and "step 4" in lines[header + 1]
  row = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]] for line in lines if line.count("│") > 2}
  assert row["compile rate"] == ["0.000", "0.750", "0.000"] and row["reward"] == ["0.200", "0.900", "0.100"]
  assert row["NO_GPU"] == ["0", "6", "0"] and row["COMPILE_ERROR"] == ["6", "2", "0"] and row["FORMAT"] == ["2", "0", "8"]


def test_the_warm_start_is_stated_before_the_tables():
  from dice_jax.rl.warm_start_run import TrainResult, WarmStartSummary

  warm = WarmStartSummary(steps=300, examples=56, problems=28, rl_problems=8, rl_problems_unseen=8,
                          tokenizer_size=640, seconds=101.4, final_loss=0.1625)
  out = io.StringIO()
  summary.print_summary(TrainResult("done", 1, 0, [_rated(1, 0.0, 0.2, 0.0, {"FORMAT": 8}, {})], "/runs/x", None,
                                    "local", warm_start=warm), Console(file=out, width=200))
  text = out.getvalue()
  assert text.startswith("Warm start: 300 SFT steps on 56 examples of 28 problems, a 640-token BPE fitted to them, "
                         "final SFT loss 0.163 (101 s). RL problems the warm start never saw: 8 of 8.")
