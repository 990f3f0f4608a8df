"""benchmarks/rl_learning.py end to end at toy size on CPU (`--smoke`): every stage runs (data, SFT,
both RL arms, four `dice eval`s, plots, the table) against a real loopback verifier, compile-only."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "rl_learning.py"


@pytest.mark.slow
def test_learning_benchmark_smoke(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, not conftest's 8 fakes
  proc = subprocess.run([sys.executable, str(SCRIPT), "--work", str(tmp_path), "--smoke", "--budget-s", "840",
                         "--rl-set", "optimizer.lr=3e-5"], capture_output=True, text=True, timeout=900, env=env)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  state = json.loads((tmp_path / "state.json").read_text())
  assert {k: v["status"] for k, v in state.items() if k != "warm_rl_answers"} == {
      name: "done" for name in ("sft", "eval_known_good", "rl_e2e", "rl_biphase", "eval_sft", "eval_rl_e2e",
                                "eval_rl_biphase")}
  results = json.loads((tmp_path / "results.json").read_text())
  assert list(results["rows"]) == ["known_good", "sft", "rl_e2e", "rl_biphase"]
  assert results["rows"]["known_good"]["compile_rate"] == 1.0  # the known-good answers compiled here
  assert results["targets"] is None  # no GPU: correctness, hence the targets, cannot be decided
  assert results["rl_completions_per_arm"] == 8
  assert [len(results["rl"][arm]["steps"]) for arm in ("rl_e2e", "rl_biphase")] == [2, 2]
  assert len(results["plots"]) >= 2 and all(pathlib.Path(p).is_file() for p in results["plots"])
  assert "(c) bi-phase RL" in (tmp_path / "results.md").read_text()
  for arm in ("rl_e2e", "rl_biphase"):  # --rl-set reached both RL runs
    config = yaml.safe_load((tmp_path / arm / "config.yaml").read_text())
    assert config["optimizer"]["lr"] == pytest.approx(3e-5), arm
