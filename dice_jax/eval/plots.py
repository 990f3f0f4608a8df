"""PNG plots of an evaluation (matplotlib, Agg backend: no display needed).

- speedup_distribution.png: histogram of log2 speedups of correct, timed kernels, per level;
- fast_p.png: fast_p as p varies, per level and overall (KernelBench's curve);
- levels.png: compile rate, execution accuracy, fast_1 and fast_2 per level.
Where the verifier could not measure correctness or speed (NO_GPU), the first two say so in the
figure instead of drawing an empty or zero plot, and the bars show only the compile rate (the
legend lists only series that have a bar; the others are marked n/a). Y tick labels are plain
numbers, never an offset.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position

from dice_jax.eval import metrics as metrics_lib  # noqa: E402

UNAVAILABLE = "unavailable: the verifier has no GPU,\nso correctness and speed were not measured"
_BARS = (("compile_rate", "compiled"), ("correct_rate", "correct"), ("fast_1", "fast_1"),
         ("fast_2", "fast_2"))


def _save(fig, path: pathlib.Path) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _unavailable(ax, title: str) -> None:
  ax.set_title(title)
  ax.text(0.5, 0.5, UNAVAILABLE, ha="center", va="center", transform=ax.transAxes)
  ax.set_xticks([])
  ax.set_yticks([])


def speedup_distribution(summary: Mapping[str, Any], problems: Sequence[metrics_lib.ProblemScores],
                         path: pathlib.Path) -> pathlib.Path:
  fig, ax = plt.subplots(figsize=(7, 4))
  title = "speedup of correct kernels (reference time / kernel time)"
  if not summary["overall"]["correctness_available"]:
    _unavailable(ax, title)
    return _save(fig, path)
  by_level: dict[str, list[float]] = {}
  for p in problems:
    values = [math.log2(s.speedup) for s in p.samples if s.speedup is not None]
    by_level.setdefault(metrics_lib.level_key(p.level), []).extend(values)
  data = {k: v for k, v in by_level.items() if v}
  if data:
    ax.hist(list(data.values()), bins=30, stacked=True, label=list(data))
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1, label="1x (as fast as PyTorch)")
    ax.legend()
  else:
    ax.text(0.5, 0.5, "no correct, timed kernels", ha="center", va="center", transform=ax.transAxes)
  ax.set_xlabel("log2 speedup")
  ax.set_ylabel("kernels")
  ax.set_title(title)
  return _save(fig, path)


def fast_p_curves(curves: Mapping[str, Mapping[str, Any] | None], path: pathlib.Path,
                  title: str = "fast_p: correct and faster than p x PyTorch") -> pathlib.Path:
  """One line per named curve ({"p": [...], "fast_p": [...]}); None curves mean unavailable."""
  fig, ax = plt.subplots(figsize=(7, 4))
  if any(c is None for c in curves.values()):
    _unavailable(ax, title)
    return _save(fig, path)
  for name, curve in curves.items():
    ax.step(curve["p"], curve["fast_p"], where="post", label=name,
            linewidth=2.5 if name.endswith("overall") else 1.5)
  for p in metrics_lib.FAST_P:
    ax.axvline(p, color="grey", linestyle=":", linewidth=1)
  ax.set_xlabel("speedup threshold p")
  ax.ticklabel_format(axis="y", useOffset=False)
  ax.set_ylabel("fast_p")
  ax.set_ylim(0, 1.02)
  ax.set_title(title)
  ax.legend()
  return _save(fig, path)


def level_bars(summary: Mapping[str, Any], path: pathlib.Path) -> pathlib.Path:
  groups = metrics_lib.groups(summary)
  fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4))
  width = 0.8 / len(_BARS)
  for j, (key, label) in enumerate(_BARS):
    xs = [i + (j - (len(_BARS) - 1) / 2) * width for i in range(len(groups))]
    values = [m[key] for _, m in groups]
    present = any(v is not None for v in values)  # a series with no bar gets no legend entry
    ax.bar([x for x, v in zip(xs, values) if v is not None],
           [v for v in values if v is not None], width, label=label if present else None, color=f"C{j}")
    for x, v in zip(xs, values):
      if v is None:
        ax.text(x, 0.01, "n/a", ha="center", va="bottom", rotation=90, fontsize=8)
  ax.set_xticks(range(len(groups)), [name for name, _ in groups])
  ax.set_ylim(0, 1.05)
  ax.ticklabel_format(axis="y", useOffset=False)
  ax.set_ylabel("fraction of samples")
  ax.set_title("per level")
  ax.legend(fontsize=8)
  return _save(fig, path)


def write_plots(out: pathlib.Path, summary: Mapping[str, Any],
                problems: Sequence[metrics_lib.ProblemScores]) -> list[pathlib.Path]:
  curves = {name: m.get("fast_p_curve") for name, m in metrics_lib.groups(summary)}
  return [speedup_distribution(summary, problems, out / "speedup_distribution.png"),
          fast_p_curves(curves, out / "fast_p.png"),
          level_bars(summary, out / "levels.png")]
