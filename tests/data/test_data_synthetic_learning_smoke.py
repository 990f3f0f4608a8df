"""benchmarks/rl_learning.py end to end at toy size on CPU (`--smoke --stage all`): data, SFT, the gate,
both RL arms in curve segments (dynamic sampling refilling, the KL guard watching), the evaluations
and the report's JSON, against a real loopback verifier (compile-only: the gate and the figures
must then say that correctness could not be decided, never report 0%)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "rl_learning.py"


def _run(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, not conftest's 8 fakes
  return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_learning_benchmark_smoke(tmp_path):
  out, results = tmp_path / "learn", tmp_path / "rl_learning.json"
  proc = _run("--smoke", "--stage", "all", "--out", str(out), "--results", str(results),
              "--rl-set", "optimizer.lr=3e-5")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  state = json.loads((out / "state.json").read_text())
  assert state["data"]["sft_problems"] == 3 and state["sft"]["status"] == "done"
  assert state["gate"]["decided"] is False  # no GPU: nothing was checked for correctness
  assert state["verifier"]["has_gpu"] is False
  for arm in ("b", "c"):
    assert state[f"rl_{arm}"]["status"] == "done" and state[f"rl_{arm}"]["step"] == 2
    assert all((out / f"rl_{arm}" / f"hf_step{s}" / "config.json").is_file() for s in (1, 2))
    config = yaml.safe_load((out / f"rl_{arm}" / "config.yaml").read_text())
    assert config["optimizer"]["lr"] == pytest.approx(3e-5)  # --rl-set reached both arms
    assert config["curriculum"]["phase1_steps"] == (1 if arm == "c" else 0)
    assert (config["algo"]["advantage"], config["rewards"]["preset"]) == ("drgrpo", "dice_binary")
    steps = [json.loads(line) for line in (out / f"rl_{arm}" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    # A random model writes no code: every group scores 0, so each step dropped its groups, refilled
    # once (max_refills 1) and kept its own to fill the batch.
    assert all(s["dynamic/refills"] == 1 and s["dynamic/filled_groups"] == 2 for s in steps)
    assert all(s["kl_guard/lr_scale"] == 1.0 for s in steps)
  assert {p.name for p in (out / "eval").iterdir()} >= {"a_greedy", "b_greedy", "c_greedy", "b_step1_greedy",
                                                        "c_sampled", "c_unseen_greedy", "gate"}
  table = json.loads(results.read_text())
  assert set(table["arms"]) == {"a", "b", "c"} and table["hardware"] and table["date"]
  assert set(table["arms"]["c"]) >= {"exec_greedy", "pass_at_8", "fast_1"}
  assert table["correctness"] is False and table["arms"]["c"]["exec_greedy"] is None and table["c_minus_a"] is None
  assert json.loads((out / "results.json").read_text())["arms"] == table["arms"]
  # Another call with other sizes refuses the folder before doing anything.
  again = _run("--smoke", "--stage", "report", "--out", str(out), "--rl-steps", "3", timeout=60)
  assert again.returncode == 2 and "holds a run with other sizes" in again.stderr


def _write_eval(folder: pathlib.Path, correct: list[bool], *, samples: int = 1, speedup: float = 1.5) -> None:
  (folder / "problems").mkdir(parents=True)
  for i, ok in enumerate(correct):
    rows = [{"sample": s, "outcome": "OK" if ok and s == 0 else "INCORRECT", "compiled": True,
             "correct": ok and s == 0, "speedup": speedup if ok and s == 0 else None} for s in range(samples)]
    (folder / "problems" / f"p{i}.json").write_text(json.dumps({"id": f"p{i}", "samples": rows}))


def test_report_figures_and_paired_intervals(tmp_path):
  """The report's arithmetic on known per-problem outcomes: greedy execution accuracy, fast_1, pass@8,
  the paired difference and its bootstrap interval (above 0 when (c) solves a superset of (a)'s
  problems and 8 more of 20), and the issue's JSON keys."""
  sys.path.insert(0, str(SCRIPT.parent))
  import rl_learning_results as results  # pylint: disable=import-outside-toplevel
  ids = [f"p{i}" for i in range(20)]
  solved = {"a": 4, "b": 6, "c": 12}
  for arm, n in solved.items():
    _write_eval(tmp_path / "eval" / f"{arm}_greedy", [i < n for i in range(20)], speedup=0.5 if arm == "b" else 1.5)
    _write_eval(tmp_path / "eval" / f"{arm}_sampled", [i < n + 2 for i in range(20)], samples=8)
  fig = results.figures(tmp_path, ids, [], [20])
  assert fig["arms"]["c"]["exec_greedy"] == 60.0 and fig["arms"]["a"]["exec_greedy"] == 20.0
  assert fig["arms"]["c"]["fast_1"] == 60.0 and fig["arms"]["b"]["fast_1"] == 0.0  # b's correct ones are slower
  assert fig["arms"]["c"]["pass_at_8"] == 70.0 and fig["arms"]["c"]["pass_at_1_sampled"] == pytest.approx(70 / 8)
  c_a = fig["c_minus_a"]
  assert c_a["diff"] == 40.0 and 0 < c_a["ci_low"] < 40.0 < c_a["ci_high"] <= 60.0
  assert fig["c_minus_b"]["diff"] == 30.0 and fig["arms"]["a"]["unseen_op_exec_greedy"] is None
  assert fig["curve_exec_greedy"]["c"] == {0: 20.0, 20: 60.0}
  table = results.results_json(fig, {})
  assert {"date", "hardware", "arms", "c_minus_a", "c_minus_b"} <= set(table)
  assert "(c) bi-phase RL | 60.0%" in results.markdown(table)
  without_gpu = results.figures(tmp_path, ids, [], [20], correctness=False)
  assert without_gpu["arms"]["c"]["exec_greedy"] is None and "c_minus_a" not in without_gpu
