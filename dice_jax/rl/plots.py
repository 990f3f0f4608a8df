"""PNG curves of an RL run from the files it writes (matplotlib, Agg: no display needed).

Reads `<run_dir>/metrics.jsonl` (one record per logged step) and `<run_dir>/speedups.jsonl` (the
speedups of correct, timed kernels per step) and writes into `<out_dir>`:
  rewards.png      the total reward and every reward component (`reward/<name>`), per step
  phase_rates.png  format, compile and correct rates of phase 1 and phase 2, and phase 2's share
  speedup.png      the distribution of speedups (log2), or a note when none was measured
  kl.png           k3 KL to the reference policy, and the clipped-token fraction
  entropy.png      mean token entropy of the policy at the scored positions
  training.png     loss, gradient norm, ratio range, and the time share spent waiting on verdicts
A curve whose metric never appears is left out (and has no legend entry); a panel with nothing to
show says so. Y tick labels are plain numbers, never an offset.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position
from matplotlib.ticker import MaxNLocator  # noqa: E402  pylint: disable=wrong-import-position

from dice_jax.metrics_log import read_jsonl  # noqa: E402
from dice_jax.rl.summary import SPEEDUPS_FILE  # noqa: E402

_NOT_REWARDS = ("reward/excluded_frac", "reward/hacked_frac")


class PlotError(ValueError):
  """The run directory has no metrics to plot."""


def _save(fig, path: pathlib.Path) -> pathlib.Path:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None and math.isfinite(r[key])]
  return [p[0] for p in points], [p[1] for p in points]


def _curves(ax, records, keys: Sequence[str], title: str, labels: Sequence[str] | None = None) -> None:
  drawn = 0
  for key, label in zip(keys, labels or keys):
    steps, values = _series(records, key)
    if steps:
      ax.plot(steps, values, marker="o", markersize=3, label=label)
      drawn += 1
  ax.set_title(title)
  ax.set_xlabel("step")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  # Plain tick labels: a ratio that stays near 1 or an entropy near 5.5 would otherwise be drawn as
  # offsets ("+1" above the axis, ticks of 1e-6), which read as the wrong numbers.
  ax.ticklabel_format(axis="y", useOffset=False)
  if drawn:
    ax.legend(fontsize=8)
  else:
    ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)


def _speedups(run_dir: pathlib.Path) -> list[float]:
  path = run_dir / SPEEDUPS_FILE
  if not path.is_file():
    return []
  return [s for record in read_jsonl(str(path)) for s in record.get("speedups", []) if s > 0]


def plot_run(run_dir: str, out_dir: str | None = None) -> list[pathlib.Path]:
  """Writes the PNGs listed in the module docstring; returns their paths."""
  run = pathlib.Path(run_dir).expanduser()
  metrics_path = run / "metrics.jsonl"
  if not metrics_path.is_file():
    raise PlotError(f"{metrics_path}: not found (is {run} a `dice train` run directory?)")
  records = read_jsonl(str(metrics_path))
  if not records:
    raise PlotError(f"{metrics_path}: no steps logged yet")
  out = pathlib.Path(out_dir).expanduser() if out_dir else run / "plots"
  out.mkdir(parents=True, exist_ok=True)
  keys = sorted({k for r in records for k in r})
  written = []

  fig, ax = plt.subplots(figsize=(7, 4))
  components = [k for k in keys if k.startswith("reward/") and k not in _NOT_REWARDS]
  _curves(ax, records, components, "reward per component (mean over judged responses)",
          [k.removeprefix("reward/") for k in components])
  written.append(_save(fig, out / "rewards.png"))

  fig, axes = plt.subplots(1, 3, figsize=(13, 4))
  for ax, phase in zip(axes[:2], (1, 2)):
    rates = [f"phase{phase}/{m}" for m in ("format", "compile", "correct")]
    _curves(ax, records, rates, f"phase {phase} ({'infilling' if phase == 1 else 'end to end'})",
            ["format", "compile", "correct"])
    ax.set_ylim(-0.05, 1.05)
  _curves(axes[2], records, ["curriculum/phase2_share"], "curriculum", ["phase-2 share of prompts"])
  written.append(_save(fig, out / "phase_rates.png"))

  fig, ax = plt.subplots(figsize=(7, 4))
  speedups = _speedups(run)
  ax.set_title("speedup of correct kernels (reference / kernel), all steps")
  if speedups:
    ax.hist([math.log2(s) for s in speedups], bins=30)
    ax.axvline(0.0, color="k", linewidth=0.8)
    ax.set_xlabel("log2 speedup")
    ax.set_ylabel("kernels")
  else:
    ax.text(0.5, 0.5, "no correct, timed kernel in this run\n(a verifier without a GPU measures no speed)",
            ha="center", va="center", transform=ax.transAxes)
  written.append(_save(fig, out / "speedup.png"))

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  _curves(axes[0], records, ["kl"], "k3 KL (per token)")
  _curves(axes[1], records, ["clip_frac"], "clipped-ratio token fraction")
  written.append(_save(fig, out / "kl.png"))

  fig, ax = plt.subplots(figsize=(7, 4))
  _curves(ax, records, ["entropy"], "policy entropy (nats per generated token)")
  written.append(_save(fig, out / "entropy.png"))

  fig, axes = plt.subplots(2, 2, figsize=(11, 7))
  _curves(axes[0, 0], records, ["loss", "pg_loss"], "loss")
  _curves(axes[0, 1], records, ["grad_norm"], "gradient norm")
  _curves(axes[1, 0], records, ["ratio_min", "ratio_mean", "ratio_max"], "importance ratio")
  _curves(axes[1, 1], records, ["wait_frac"], "share of step time waiting on verdicts")
  written.append(_save(fig, out / "training.png"))
  return written
