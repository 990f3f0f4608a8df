"""What an evaluation leaves under --out: summary.json, per-problem JSON, Markdown and console tables.

summary.json (schema "dice-eval/1"):
  {"schema", "run": {settings and verifier facts}, "overall": metrics, "levels": {name: metrics},
   "notes": [plain sentences a reader must see, e.g. that correctness is unavailable]}
with metrics as in dice_jax.eval.metrics.group_metrics. problems/<id>.json holds every sample of a
problem: its file, its outcome row and the complete verdict.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from dice_jax.eval import generations as gen_lib
from dice_jax.eval import metrics as metrics_lib
from dice_jax.eval import records
from dice_jax.eval.runner import ProblemResult

SCHEMA = "dice-eval/1"
NA = "n/a"


def write_json(path: pathlib.Path, data: Any) -> None:
  """Atomic JSON write (a reader never sees half a file)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text(json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
  os.replace(tmp, path)


def problem_record(result: ProblemResult) -> dict[str, Any]:
  p = result.problem
  scores = result.scores()
  return {
      "id": p.id, "level": p.level, "origin": p.origin,
      "metrics": metrics_lib.group_metrics([scores], curve=False),
      "samples": [{"sample": s.sample, "path": s.path, "key": s.key, **records.compact(s.verdict),
                   "verdict": records.to_dict(s.verdict)} for s in result.samples],
  }


def notes(summary: Mapping[str, Any]) -> list[str]:
  """Plain statements about what the numbers do and do not say."""
  overall, out = summary["overall"], []
  if not overall["correctness_available"]:
    out.append(f"{overall['no_gpu']} verdict(s) are NO_GPU: the verifier has no GPU, so those "
               "candidates were parsed, statically checked and compiled only. Correctness and "
               "speed are unavailable (n/a); nothing in this report shows that a kernel is correct.")
  if overall["infra_errors"]:
    out.append(f"{overall['infra_errors']} verdict(s) are INFRA_ERROR (the verifier failed, not the "
               "candidate). They count as failures above; rerun the same command to retry only them.")
  if overall["bad_reference"]:
    out.append(f"{overall['bad_reference']} verdict(s) are BAD_REFERENCE: the problem's PyTorch "
               "reference itself is unusable. They count as failures above.")
  flagged = overall["outcomes"].get(records.FLAGGED, 0)
  if flagged:
    out.append(f"{flagged} sample(s) passed but carry exploit findings (FLAGGED); they are not "
               "counted as correct. See the per-problem files for the evidence.")
  return out


def measured_on(results: Sequence[ProblemResult]) -> list[str]:
  """Where the verdicts were produced (from the verdicts themselves, not from today's verifier:
  a resumed run may reuse verdicts another server made)."""
  seen: collections.Counter[str] = collections.Counter()
  for result in results:
    for s in result.samples:
      if s.verdict.HasField("environment"):
        env = s.verdict.environment
        seen[f"{env.gpu_name or 'no GPU'} ({env.gpu_arch or '?'}), nvcc {env.nvcc_version or '?'}, "
             f"torch {env.torch_version or '?'}"] += 1
  return [f"{where}: {n} verdict(s)" for where, n in seen.most_common()]


def build_summary(results: Sequence[ProblemResult], run: Mapping[str, Any]) -> dict[str, Any]:
  run = dict(run, measured_on=measured_on(results))
  summary = {"schema": SCHEMA, "run": run,
             **metrics_lib.summarize([r.scores() for r in results])}
  summary["notes"] = notes(summary)
  return summary


def write_outputs(out: pathlib.Path, results: Sequence[ProblemResult],
                  run: Mapping[str, Any]) -> dict[str, Any]:
  """problems/*.json, summary.json and summary.md; returns the summary."""
  for result in results:
    write_json(out / "problems" / f"{gen_lib.folder_name(result.problem.id)}.json",
               problem_record(result))
  summary = build_summary(results, run)
  write_json(out / "summary.json", summary)
  (out / "summary.md").write_text(markdown(summary), encoding="utf-8")
  return summary


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
  path = pathlib.Path(run_dir) / "summary.json"
  try:
    summary = json.loads(path.read_text(encoding="utf-8"))
  except OSError as e:
    raise ValueError(f"{path}: cannot read ({e.strerror}); is {run_dir} a `dice eval --out` "
                     "directory?") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON ({e.msg})") from None
  if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
    raise ValueError(f"{path}: not a {SCHEMA} summary")
  return summary


# ---------------------------------------------------------------------------------- tables


def pct(value: float | None) -> str:
  return NA if value is None else f"{100 * value:.1f}%"


def num(value: float | None, suffix: str = "x") -> str:
  return NA if value is None else f"{value:.2f}{suffix}"


def table_columns(summary: Mapping[str, Any]) -> list[str]:
  ks = summary["overall"].get("pass_at_k") or {}
  extra = [f"pass@{k}" for k in ks if k != "1"]
  return (["group", "problems", "samples", "compiled", "correct", "fast_1", "fast_2",
           "speedup gmean", "speedup mean", "warm gmean"] + extra)


def table_rows(summary: Mapping[str, Any]) -> list[list[str]]:
  ks = [k for k in (summary["overall"].get("pass_at_k") or {}) if k != "1"]
  rows = []
  for name, m in metrics_lib.groups(summary):
    pass_k = m.get("pass_at_k") or {}
    rows.append([name, str(m["problems"]), str(m["samples"]), pct(m["compile_rate"]),
                 pct(m["correct_rate"]), pct(m["fast_1"]), pct(m["fast_2"]),
                 num(m["speedup_geomean"]), num(m["speedup_mean"]),
                 num(m.get("speedup_warm_geomean"))]
                + [pct(pass_k.get(k)) for k in ks])
  return rows


def outcome_columns(summary: Mapping[str, Any]) -> list[str]:
  return sorted({o for _, m in metrics_lib.groups(summary) for o in m["outcomes"]})


def _md_table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def markdown(summary: Mapping[str, Any]) -> str:
  run = summary["run"]
  parts = [f"# dice eval: {run.get('name', '')}".rstrip(), ""]
  for key in ("problems_source", "generations", "model", "mode", "sampling", "verifier", "date"):
    if run.get(key):
      parts.append(f"- {key.replace('_', ' ')}: {run[key]}")
  for where in run.get("measured_on") or ():
    parts.append(f"- measured on {where}")
  parts += [""] + [f"> **Note.** {n}" for n in summary["notes"]] + [""]
  parts += ["## Metrics per level", "", _md_table(table_columns(summary), table_rows(summary)), ""]
  columns = outcome_columns(summary)
  rows = [[name] + [str(m["outcomes"].get(c, 0)) for c in columns]
          for name, m in metrics_lib.groups(summary)]
  parts += ["## Outcomes per level (samples)", "", _md_table(["group"] + columns, rows), ""]
  parts += ["compiled, correct and fast_p are fractions of all samples (averaged per problem); "
            "speedups are over correct, timed kernels, cold calls (L2 flushed) but for warm gmean "
            "(no flush, KernelBench's condition); n/a means the verifier could not measure it.",
            ""]
  return "\n".join(parts)


def stdout_console() -> Console:
  """The console for result tables: as wide as the terminal, or 140 columns into a file or pipe."""
  return Console() if sys.stdout.isatty() else Console(width=140)


def console_table(summary: Mapping[str, Any]) -> Table:
  table = Table(title=f"dice eval {summary['run'].get('name', '')}".rstrip())
  for column in table_columns(summary):
    table.add_column(column, justify="left" if column == "group" else "right")
  for row in table_rows(summary):
    table.add_row(*row)
  return table
