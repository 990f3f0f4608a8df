"""The learning experiment's figures, from its `dice eval`-layout folders (benchmarks/rl_learning.py).

Per held-out problem and arm: greedy execution accuracy (sample 0 of the greedy, static-decoding
evaluation is correct), fast_1 (that sample is correct and faster than the reference), pass@8 (any
of 8 samples at temperature 1 is correct) and the unbiased pass@1 of those 8. Arm differences are
paired over problems (every arm answers the same problems), with a percentile bootstrap 95%
interval (scipy.stats.bootstrap, 10,000 resamples of problems, a fixed seed): in points.

`figures(out)` gathers what exists; `results_json` is the issue's table (benchmarks/results/
rl_learning.json: `arms` with exec_greedy, pass_at_8, fast_1 in %, `c_minus_a` and `c_minus_b` as
{diff, ci_low, ci_high} in points, `date`, `hardware`), `markdown` the same for BENCHMARKS.md.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
from collections.abc import Mapping

import numpy as np
import scipy.stats

ARMS = {"a": ("sft", "(a) no RL"), "b": ("rl_b", "(b) end-to-end RL"), "c": ("rl_c", "(c) bi-phase RL")}
BOOTSTRAP_RESAMPLES = 10_000


def samples_by_problem(folder: pathlib.Path) -> dict[str, list[dict]]:
  """problem id -> its samples (outcome, compiled, correct, speedup), in sample order."""
  out = {}
  for path in sorted((folder / "problems").glob("*.json")):
    record = json.loads(path.read_text(encoding="utf-8"))
    out[record["id"]] = sorted(record["samples"], key=lambda s: s["sample"])
  return out


def _fast(sample: Mapping) -> bool:
  return bool(sample["correct"]) and sample.get("speedup") is not None and sample["speedup"] > 1.0


def read_problems(folder: pathlib.Path, ids: list[str]) -> dict[str, np.ndarray] | None:
  """Arrays over `ids` (in that order): `correct` and `fast_1` of sample 0, `pass_at_k` (any
  correct), `pass_at_1` (share correct), `compiled` (share compiled); None if a problem is missing
  or correctness was not available (a verifier without a GPU)."""
  found = samples_by_problem(folder)
  if not ids or any(i not in found for i in ids):
    return None
  rows = [found[i] for i in ids]
  if any(s["outcome"] == "NO_GPU" for r in rows for s in r):
    return None
  return {"correct": np.array([float(r[0]["correct"]) for r in rows]),
          "fast_1": np.array([float(_fast(r[0])) for r in rows]),
          "pass_at_k": np.array([float(any(s["correct"] for s in r)) for r in rows]),
          "pass_at_1": np.array([float(np.mean([s["correct"] for s in r])) for r in rows]),
          "compiled": np.array([float(np.mean([s["compiled"] for s in r])) for r in rows])}


def paired_difference(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
  """mean(x) - mean(y) over paired problems with its bootstrap 95% interval, in points."""
  diff = float(np.mean(x) - np.mean(y))
  ci = scipy.stats.bootstrap((x, y), lambda a, b, axis: np.mean(a, axis=axis) - np.mean(b, axis=axis),
                             paired=True, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=0.95,
                             method="percentile", rng=np.random.default_rng(0)).confidence_interval
  return {"diff": round(100 * diff, 2), "ci_low": round(100 * float(ci.low), 2), "ci_high": round(100 * float(ci.high), 2)}


def hardware() -> str:
  try:
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=20, check=True).stdout.split("\n")
    gpus = [g.strip() for g in gpus if g.strip()]
  except (OSError, subprocess.SubprocessError):
    gpus = []
  where = f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU"
  return f"{where}, {os.cpu_count()} CPU cores, {platform.machine()}"


def _pct(x: np.ndarray | None, key: str) -> float | None:
  return None if x is None else round(100 * float(np.mean(x[key])), 2)


def figures(out: pathlib.Path, heldout_ids: list[str], unseen_ids: list[str], curve_steps: list[int], *,
            correctness: bool = True) -> dict:
  """Every figure of the finished (or partly finished) evaluations under out/eval; none at all
  without `correctness` (a verifier with no GPU: a sample without code would read as wrong)."""
  ev = out / "eval"

  def per_problem(folder, ids):
    return read_problems(folder, ids) if correctness else None

  greedy = {arm: per_problem(ev / f"{arm}_greedy", heldout_ids) for arm in ARMS}
  sampled = {arm: per_problem(ev / f"{arm}_sampled", heldout_ids) for arm in ARMS}
  unseen = {arm: per_problem(ev / f"{arm}_unseen_greedy", unseen_ids) for arm in ARMS}
  arms = {}
  for arm, (_, label) in ARMS.items():
    arms[arm] = {"label": label, "exec_greedy": _pct(greedy[arm], "correct"), "fast_1": _pct(greedy[arm], "fast_1"),
                 "pass_at_8": _pct(sampled[arm], "pass_at_k"), "pass_at_1_sampled": _pct(sampled[arm], "pass_at_1"),
                 "compile_greedy": _pct(greedy[arm], "compiled"), "compile_sampled": _pct(sampled[arm], "compiled"),
                 "unseen_op_exec_greedy": _pct(unseen[arm], "correct")}
  diffs = {}
  for name, (x, y) in {"c_minus_a": ("c", "a"), "c_minus_b": ("c", "b"), "b_minus_a": ("b", "a")}.items():
    if greedy[x] is not None and greedy[y] is not None:
      diffs[name] = paired_difference(greedy[x]["correct"], greedy[y]["correct"])
  curve = {}
  for arm in ("b", "c"):
    points = {0: arms["a"]["exec_greedy"]}
    for step in curve_steps:
      folder = ev / (f"{arm}_greedy" if step == curve_steps[-1] else f"{arm}_step{step}_greedy")
      points[step] = _pct(per_problem(folder, heldout_ids), "correct")
    curve[arm] = points
  known = per_problem(ev / "known_good", heldout_ids)
  return {"arms": arms, **diffs, "curve_exec_greedy": curve, "known_good_exec": _pct(known, "correct"),
          "heldout_problems": len(heldout_ids), "unseen_op_problems": len(unseen_ids), "correctness": correctness}


def results_json(fig: Mapping, extra: Mapping) -> dict:
  """The issue's JSON: arms, c_minus_a, c_minus_b, date, hardware (and what else was measured)."""
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  return {"date": now, "hardware": hardware(), "arms": fig["arms"], "c_minus_a": fig.get("c_minus_a"),
          "c_minus_b": fig.get("c_minus_b"), **{k: v for k, v in fig.items() if k not in ("arms",)}, **extra}


def _cell(value) -> str:
  return "n/a" if value is None else f"{value:.1f}%"


def _interval(d: Mapping | None) -> str:
  return "n/a" if d is None else f"{d['diff']:+.1f} [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}]"


def markdown(res: Mapping) -> str:
  if not res.get("correctness", True):
    return ("No figures: the verifier had no GPU, so no sample was checked for correctness (a sample "
            "without code would otherwise read as wrong).\n")
  lines = [f"{res['heldout_problems']} held-out problems (new op chains and bias+activation pairs whose ops and "
           "adjacent op pairs all occur in SFT data); greedy = static decoding, top-k 1; pass@8 at temperature 1 "
           "(static decoding); unseen-op problems apart.", "",
           "| arm | exec. acc. (greedy) | fast_1 (greedy) | pass@8 | pass@1 (T=1) | compiled (greedy) | "
           f"unseen-op exec. acc. ({res['unseen_op_problems']}) |", "|---|---|---|---|---|---|---|"]
  for arm in res["arms"].values():
    lines.append(f"| {arm['label']} | {_cell(arm['exec_greedy'])} | {_cell(arm['fast_1'])} | "
                 f"{_cell(arm['pass_at_8'])} | {_cell(arm['pass_at_1_sampled'])} | {_cell(arm['compile_greedy'])} | "
                 f"{_cell(arm['unseen_op_exec_greedy'])} |")
  lines += ["", f"(c) - (a): {_interval(res.get('c_minus_a'))} points; (c) - (b): {_interval(res.get('c_minus_b'))}; "
            f"(b) - (a): {_interval(res.get('b_minus_a'))} (paired bootstrap 95% intervals over problems). "
            f"Known-good answers: {_cell(res.get('known_good_exec'))} correct."]
  curve = res.get("curve_exec_greedy", {})
  if curve:
    steps = sorted({int(s) for pts in curve.values() for s in pts})
    lines += ["", "| greedy exec. acc. at RL step | " + " | ".join(map(str, steps)) + " |",
              "|---|" + "---|" * len(steps)]
    for arm, pts in curve.items():
      lines.append(f"| {ARMS[arm][1]} | " + " | ".join(_cell(pts.get(s, pts.get(str(s)))) for s in steps) + " |")
  return "\n".join(lines) + "\n"
