"""A few sampled completions per step and phase, with what the verifier said and what they earned.

`<run_dir>/samples/step_<N>.jsonl` holds, for step N, up to `logging.samples_per_phase` rows of
each phase, one JSON object per line:

    {"step": 3, "phase": 1, "problem_id": "19_ReLU", "row": 0, "outcome": "COMPILE_ERROR",
     "stage": "COMPILE", "message": "...", "reward": 0.0, "valid": true,
     "components": {"format": 1.0, "compile": 0.0}, "completion": "```python\\nsource = ..."}

`outcome` is the label of dice_jax.rewards.outcomes (the verdict's outcome, FORMAT when no code was
found, UNREACHABLE when no verifier answered). Rows are taken across groups first (the first
response of each problem, then the second, ...), so a step's file shows as many problems as it can.
Only the primary process writes, from its own rows.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

import numpy as np

from dice.verifier.v1 import verifier_pb2 as pb

SAMPLES_DIR = "samples"
_MESSAGE_CHARS = 4000
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def pick_rows(phases: Sequence[int], group_size: int, per_phase: int) -> list[int]:
  """Up to `per_phase` row indices of each phase, the first response of each group first."""
  phase_B = np.asarray(phases)
  order = sorted(range(len(phase_B)), key=lambda r: (r % group_size, r // group_size))
  picked: list[int] = []
  for phase in sorted(set(phase_B.tolist())):
    picked += [r for r in order if phase_B[r] == phase][:per_phase]
  return sorted(picked)


def write_step(run_dir: str, step: int, rows: Sequence[int], *, labels: Sequence[str],
               verdicts: Sequence[pb.Verdict], completions: Sequence[str], columns: dict[str, list],
               total: np.ndarray, valid: np.ndarray, components: dict[str, np.ndarray]) -> str:
  """Writes step `step`'s file from the chosen `rows` (this process's row indices); returns its path."""
  folder = os.path.join(run_dir, SAMPLES_DIR)
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f"step_{step}.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      v = verdicts[r]
      record = {"step": int(step), "phase": int(columns["phase"][r]), "problem_id": str(columns["problem_id"][r]),
                "row": int(r), "outcome": labels[r], "stage": pb.Stage.Name(v.stage).removeprefix("STAGE_"),
                "message": v.message[:_MESSAGE_CHARS], "reward": float(total[r]), "valid": bool(valid[r]),
                "components": {name: float(values[r]) for name, values in components.items()},
                "completion": completions[r]}
      f.write(json.dumps(record) + "\n")
  return path


def drop_after(run_dir: str, last_step: int) -> None:
  """Removes the files of steps after `last_step` (a resumed run redoes those steps)."""
  folder = os.path.join(run_dir, SAMPLES_DIR)
  if not os.path.isdir(folder):
    return
  for name in os.listdir(folder):
    match = _STEP_FILE.match(name)
    if match and int(match.group(1)) > last_step:
      os.remove(os.path.join(folder, name))
