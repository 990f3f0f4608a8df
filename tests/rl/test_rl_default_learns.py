"""`dice train` with no arguments learns: the built-in run, end to end, on this machine's CPU.

The whole default run is a subprocess (`python -m dice_jax.cli.main train run_dir=...`, i.e. `dice
train` with nothing but where to write): a random tiny model, its warm start (SFT on bundled
problems), then bi-phase RL on bundled problems the warm start never saw, rewarded by a real
`dice-verifier` on loopback (compile-only here: no GPU). What counts as learning is measured on the
RL steps' own responses: the format rate (responses whose code parses and goes to nvcc) and the
mean reward of the last two infilling steps against the first two. The first step samples the warm
start's model before any RL update, so a rise is the updates' doing. Nothing is mocked and no figure
is written into the test: the verdicts are nvcc's.

Checked, not assumed: on the CPU VM the built-in run's compile rate stayed 0 on every step (its
responses that parse do not compile), so the test asks for what the run does show, the format rate
and the reward, and that the responses sent to the verifier rise in number.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

TIMEOUT_S = 1800  # about 3.5 minutes on an idle 2-core CPU; CI's machine is shared


def _records(run_dir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_dice_train_with_no_arguments_learns_within_the_run(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as on a laptop
  run_dir = tmp_path / "tiny"
  done = subprocess.run([sys.executable, "-m", "dice_jax.cli.main", "train", f"run_dir={run_dir}"],
                        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
  assert done.returncode == 0, done.stderr[-4000:]
  warm = json.loads((run_dir / "warm_start" / "summary.json").read_text())
  assert warm["rl_problems"] == 8 and warm["rl_problems_unseen"] == 8  # RL's problems are new to the model
  records = _records(run_dir)
  infilling = [r for r in records if r["curriculum/phase2_share"] == 0.0]
  assert len(infilling) == 6 and len(records) == 8
  first, last = infilling[:2], infilling[-2:]
  mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
  assert mean(last, "format") > mean(first, "format"), [r["format"] for r in infilling]
  assert mean(last, "reward") > mean(first, "reward"), [r["reward"] for r in infilling]
  unparsed = [r.get("outcomes/FORMAT", 0) for r in infilling]  # never sent to the verifier
  assert sum(unparsed[-2:]) < sum(unparsed[:2]), unparsed
  # What a user sees at the end: the warm start, the first and last steps, and where the curves are.
  said = " ".join(done.stderr.split())  # rich wraps lines to the terminal's width
  assert "Warm start: 250 SFT steps" in said and "never saw: 8 of 8" in said
  assert "first and last step of each phase" in said
  assert f"curves in {run_dir / 'plots'}/: phase_rates.png" in done.stderr
  assert (run_dir / "plots" / "phase_rates.png").is_file() and (run_dir / "hf" / "config.json").is_file()
