"""The end-of-run table of `dice train`, and the run's speedup record for `dice plot`.

MetricsLogger prints every metric's first/last/min/max/mean when it closes; this is the short
answer to "did it learn, and where did the time go": one row per curriculum phase (steps whose
prompts were all phase 1, mixed, all phase 2) with mean reward, compile/correct rates, speedup,
KL and entropy; the caption gives the verifier and the share of step time spent waiting on verdicts.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

SPEEDUPS_FILE = "speedups.jsonl"  # per step: the speedups of correct, timed kernels (for `dice plot`)
_COLUMNS = (("reward", "reward"), ("compile", "compile"), ("correct", "correct"), ("speedup", "speedup"),
            ("kl", "KL"), ("entropy", "entropy"))


def _phase_of(record: dict) -> str:
  share = record.get("curriculum/phase2_share", 0.0)
  return "phase 1" if share == 0 else "phase 2" if share == 1 else "mixed"


def _mean(values: Sequence[float]) -> str:
  finite = [v for v in values if math.isfinite(v)]
  return f"{sum(finite) / len(finite):.3f}" if finite else "-"


def summary_table(history: Sequence[dict], verifier: str = "") -> Table:
  waits = [r["wait_frac"] for r in history if "wait_frac" in r]
  caption = [f"verifier: {verifier}"] if verifier else []
  if waits:
    caption.append(f"steps spent {100 * sum(waits) / len(waits):.1f}% of their time waiting on verdicts")
  table = Table(title="dice train: means per curriculum phase", caption="\n".join(caption) or None)
  table.add_column("phase", no_wrap=True)
  table.add_column("steps", justify="right")
  for _, title in _COLUMNS:
    table.add_column(title, justify="right")
  for phase in ("phase 1", "mixed", "phase 2"):
    rows = [r for r in history if _phase_of(r) == phase]
    if rows:
      first, last = rows[0]["step"], rows[-1]["step"]
      table.add_row(phase, f"{first}-{last}" if last != first else str(first),
                    *(_mean([r[k] for r in rows if k in r]) for k, _ in _COLUMNS))
  return table


def print_summary(result, console: Console | None = None) -> None:
  """The table, plus a plain note when no response earned any reward."""
  console = console or Console(stderr=True)
  if not result.history:
    return
  console.print(summary_table(result.history, result.verifier))
  if all(r.get("reward", 0.0) == 0.0 for r in result.history):
    console.print("No response earned any reward: no generation held code that parsed or compiled. Expected "
                  "of a random or barely trained model (the tiny default); start from an SFT'd checkpoint "
                  "(model.path=...) to learn.", highlight=False)


def append_speedups(run_dir: str, step: int, speedups: Sequence[float]) -> None:
  """Adds one step's speedups to `<run_dir>/speedups.jsonl` (written by the primary process)."""
  with open(os.path.join(run_dir, SPEEDUPS_FILE), "a", encoding="utf-8") as f:
    f.write(json.dumps({"step": int(step), "speedups": [float(s) for s in speedups]}) + "\n")
