"""Two evaluation runs side by side (before and after RL): metrics, deltas, and problems that changed.

Runs are compared by their --out directories (summary.json and problems/*.json). Groups (levels)
present in only one run are shown with n/a on the other side. Runs with different sample counts
per problem get a warning (in the result, the console and compare.md): per-sample rates stay
comparable, "solved" problems do not. Per problem, "solved" means at least
one correct sample; when either run has no correctness (NO_GPU), "compiled" is compared instead
and the table says so.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from dice_jax.eval import report

METRICS = (("compile_rate", "compiled", report.pct), ("correct_rate", "correct", report.pct),
           ("fast_1", "fast_1", report.pct), ("fast_2", "fast_2", report.pct),
           ("speedup_geomean", "geomean speedup", report.num))


def _problem_records(run_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
  out = {}
  for path in sorted((run_dir / "problems").glob("*.json")):
    record = json.loads(path.read_text(encoding="utf-8"))
    out[str(record["id"])] = record
  return out


def _flags(records: Mapping[str, Mapping[str, Any]], key: str) -> dict[str, bool]:
  """problem id -> whether any sample has `key` (correct / compiled) true."""
  return {pid: any(s.get(key) for s in record["samples"]) for pid, record in records.items()}


def _sample_counts(records: Mapping[str, Mapping[str, Any]]) -> str:
  """Samples per problem, e.g. "8" or "1-8" (empty when there are no problems)."""
  counts = sorted({len(r["samples"]) for r in records.values()})
  if not counts:
    return ""
  return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _warnings(records_a, records_b) -> list[str]:
  na, nb = _sample_counts(records_a), _sample_counts(records_b)
  if na == nb:
    return []
  return [f"the runs have different sample counts per problem (A: {na}, B: {nb}): rates are per-sample "
          "means and stay comparable, but a problem 'solved' by any of several samples is not the same as "
          "by one, so gained/lost problems and pass@k favour the run with more samples. Compare runs made "
          "with the same --samples."]


def compare(run_a: str, run_b: str) -> dict[str, Any]:
  """{"a", "b": run facts, "groups": {name: {metric: [a, b, b - a]}}, "problems": changes}."""
  dirs = [pathlib.Path(run_a), pathlib.Path(run_b)]
  sa, sb = (report.read_summary(d) for d in dirs)
  names = list(dict.fromkeys(list(sa["levels"]) + list(sb["levels"]))) + ["overall"]

  def group(summary, name):
    return summary["overall"] if name == "overall" else summary["levels"].get(name)

  groups = {}
  for name in names:
    ga, gb = group(sa, name), group(sb, name)
    row = {}
    for key, _, _ in METRICS:
      a = ga.get(key) if ga else None
      b = gb.get(key) if gb else None
      row[key] = [a, b, None if a is None or b is None else b - a]
    groups[name] = row
  key = ("correct" if sa["overall"]["correctness_available"] and
         sb["overall"]["correctness_available"] else "compiled")
  ra, rb = (_problem_records(d) for d in dirs)
  fa, fb = _flags(ra, key), _flags(rb, key)
  common = sorted(set(fa) & set(fb))
  problems = {"compared_on": key, "common": len(common),
              "gained": [p for p in common if fb[p] and not fa[p]],
              "lost": [p for p in common if fa[p] and not fb[p]],
              "only_in_a": sorted(set(fa) - set(fb)), "only_in_b": sorted(set(fb) - set(fa))}
  return {"a": {"dir": str(dirs[0]), **sa["run"]}, "b": {"dir": str(dirs[1]), **sb["run"]},
          "groups": groups, "problems": problems, "warnings": _warnings(ra, rb),
          "curves": {"A overall": sa["overall"].get("fast_p_curve"),
                     "B overall": sb["overall"].get("fast_p_curve")}}


def _fmt(fmt, value) -> str:
  return report.NA if value is None else fmt(value)


def _delta(fmt, value) -> str:
  if value is None:
    return report.NA
  text = fmt(value) if fmt is report.num else f"{100 * value:.1f} pt"
  return text if value < 0 else "+" + text


def rows(result: Mapping[str, Any]) -> list[list[str]]:
  out = []
  for name, row in result["groups"].items():
    for key, label, fmt in METRICS:
      a, b, d = row[key]
      out.append([name, label, _fmt(fmt, a), _fmt(fmt, b), _delta(fmt, d)])
  return out


def changes_line(result: Mapping[str, Any]) -> str:
  p = result["problems"]
  word = "solved" if p["compared_on"] == "correct" else "compiled (no correctness available)"
  return (f"problems {word}: {len(p['gained'])} gained, {len(p['lost'])} lost, of {p['common']} "
          f"in both runs ({len(p['only_in_a'])} only in A, {len(p['only_in_b'])} only in B)")


def console_table(result: Mapping[str, Any]) -> Table:
  table = Table(title=f"A = {result['a']['dir']}   B = {result['b']['dir']}",
                caption=changes_line(result))
  for column in ("group", "metric", "A", "B", "B - A"):
    table.add_column(column, justify="left" if column in ("group", "metric") else "right")
  for row in rows(result):
    table.add_row(*row)
  return table


def markdown(result: Mapping[str, Any]) -> str:
  lines = ["# dice eval --compare", "", f"- A: {result['a']['dir']}", f"- B: {result['b']['dir']}",
           "", "| group | metric | A | B | B - A |", "|---|---|---|---|---|"]
  lines += ["| " + " | ".join(r) + " |" for r in rows(result)]
  p = result["problems"]
  lines += ["", changes_line(result), ""]
  lines += [f"**Warning.** {w}\n" for w in result.get("warnings", [])]
  for name in ("gained", "lost"):
    if p[name]:
      lines.append(f"- {name}: {', '.join(p[name])}")
  return "\n".join(lines) + "\n"


def write_outputs(out: pathlib.Path, result: Mapping[str, Any]) -> None:
  report.write_json(out / "compare.json", dict(result))
  (out / "compare.md").write_text(markdown(result), encoding="utf-8")
  from dice_jax.eval import plots  # pylint: disable=import-outside-toplevel  (matplotlib: optional)
  plots.fast_p_curves(result["curves"], out / "compare_fast_p.png", title="fast_p: A vs B")
