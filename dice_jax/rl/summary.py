"""The end-of-run tables of `dice train`, and the run's speedup record for `dice plot`.

The short answer to "did it learn, what happened, and where did the time go": one row per
curriculum phase (steps whose prompts were all phase 1, mixed, all phase 2) with mean reward,
compile/correct rates, speedup, KL and entropy (the caption gives the verifier and the share of
step time spent waiting on verdicts); then the first and the last step of each phase side by side
(reward, format/compile/correct rates and every outcome's count: what changed within the run, as
measured on that step's own responses); then the count of each outcome per item phase over the run
(dice_jax.rewards.outcomes); and, when no response earned any reward, those counts in words. The
metrics table MetricsLogger prints at close shows only SUMMARY_METRICS.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table

from dice_jax.rewards import outcomes
from dice_jax.rl import samples

PHASE_NAMES = {1: "1 (infilling)", 2: "2 (end to end)"}
# The few metrics the closing metrics table shows; every metric is in metrics.jsonl and TensorBoard.
SUMMARY_METRICS = ("loss", "grad_norm", "clip_frac", "timing/step_s", "timing/sample_s", "wait_frac")
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


_FIRST_LAST_RATES = (("reward", "reward"), ("format", "format rate"), ("compile", "compile rate"),
                     ("correct", "correct rate"))


def first_last_table(history: Sequence[dict]) -> Table | None:
  """The first and the last step of each curriculum phase side by side (None without history).

  Rows are the mean reward, the format/compile/correct rates and the number of responses of each
  outcome on that step; a column per (phase, step). Each step's figures are its own responses'."""
  columns = []
  for phase in ("phase 1", "mixed", "phase 2"):
    rows = [r for r in history if _phase_of(r) == phase]
    for position, record in (("first", rows[:1]), ("last", rows[1:][-1:])):
      columns += [(f"{phase} {position}\nstep {r['step']}", r) for r in record]
  if not columns:
    return None
  table = Table(title="first and last step of each phase")
  table.add_column("", no_wrap=True)
  for title, _ in columns:
    table.add_column(title, justify="right")
  for key, name in _FIRST_LAST_RATES:
    table.add_row(name, *(f"{r[key]:.3f}" if key in r else "-" for _, r in columns))
  labels = [name for name in outcomes.LABELS if any(r.get(f"outcomes/{name}") for _, r in columns)]
  for name in labels:
    table.add_row(name, *(str(int(r.get(f"outcomes/{name}", 0))) for _, r in columns))
  return table


def outcome_totals(history: Sequence[dict]) -> dict[int, dict[str, float]]:
  """{item phase: {label: responses}} summed over every logged step (dice_jax.rewards.outcomes)."""
  totals: dict[int, dict[str, float]] = {}
  for record in history:
    for phase in (1, 2):
      for name, n in outcomes.from_metrics(record, f"phase{phase}/").items():
        if n:
          totals.setdefault(phase, {}).setdefault(name, 0.0)
          totals[phase][name] += n
  return totals


def outcome_table(totals: dict[int, dict[str, float]]) -> Table:
  present = [name for name in outcomes.LABELS if any(name in t for t in totals.values())]
  present += sorted({name for t in totals.values() for name in t} - set(present))
  table = Table(title="responses by outcome")  # counts over every step of the run
  table.add_column("item phase", no_wrap=True)
  for name in present:
    table.add_column(name, justify="right")
  for phase, counted in sorted(totals.items()):
    table.add_row(PHASE_NAMES[phase], *(str(int(counted.get(name, 0))) for name in present))
  return table


def zero_reward_note(totals: dict[int, dict[str, float]], run_dir: str) -> str:
  """What the verdicts say about a run in which no response earned any reward."""
  parts = [f"{PHASE_NAMES[phase]}: {outcomes.describe(counted)}" for phase, counted in sorted(totals.items())]
  note = "No response earned any reward. " + ("; ".join(parts) + "." if parts else "No verdicts were logged.")
  if run_dir:
    note += f" Sampled completions with their verdicts: {os.path.join(run_dir, samples.SAMPLES_DIR)}/"
  return note


def warm_start_note(warm) -> str:
  """One line on the warm start before RL (a dice_jax.rl.warm_start_run.WarmStartSummary)."""
  loss = f", final SFT loss {warm.final_loss:.3f}" if warm.final_loss is not None else ""
  tokens = f", a {warm.tokenizer_size}-token BPE fitted to them" if warm.tokenizer_size else ""
  return (f"Warm start: {warm.steps} SFT steps on {warm.examples} examples of {warm.problems} problems{tokens}"
          f"{loss} ({warm.seconds:.0f} s). RL problems the warm start never saw: {warm.rl_problems_unseen} of "
          f"{warm.rl_problems}.")


def print_summary(result, console: Console | None = None) -> None:
  """The warm start (if any), the per-phase table, the first and last step of each phase, what
  happened to the responses, and, when no response earned any reward, the outcome counts that say
  why (read from the verdicts, never guessed)."""
  console = console or Console(stderr=True)
  warm = getattr(result, "warm_start", None)
  if warm is not None:
    console.print(warm_start_note(warm), highlight=False)
  if not result.history:
    return
  console.print(summary_table(result.history, result.verifier))
  first_last = first_last_table(result.history)
  if first_last is not None:
    console.print(first_last)
  totals = outcome_totals(result.history)
  if totals:
    console.print(outcome_table(totals))
  if all(r.get("reward", 0.0) == 0.0 for r in result.history):
    console.print(zero_reward_note(totals, result.run_dir), highlight=False)


def append_speedups(run_dir: str, step: int, speedups: Iterable[float]) -> None:
  """Adds one step's speedups to `<run_dir>/speedups.jsonl` (written by the primary process)."""
  with open(os.path.join(run_dir, SPEEDUPS_FILE), "a", encoding="utf-8") as f:
    f.write(json.dumps({"step": int(step), "speedups": [float(s) for s in speedups]}) + "\n")
