"""`dice plot`'s panels (dice_jax.rl.plots) from hand-made metric records: what the legends and
axes show, and the PNGs a run directory gets."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest

from dice_jax.rl import plots


def _records(steps: int = 5) -> list[dict]:
  """A ratio that stays within 1e-6 of 1 and an entropy near 5.5: offset-label territory."""
  return [{"step": s, "ratio_min": 1.0 - 1e-6 * s, "ratio_mean": 1.0 + 1e-7 * s, "ratio_max": 1.0 + 1e-6 * s,
           "entropy": 5.5 + 1e-5 * s, "loss": float("nan")} for s in range(1, steps + 1)]


def test_curves_draw_plain_tick_labels_and_list_only_present_series():
  fig, (ratio, entropy, missing) = plt.subplots(1, 3)
  try:
    curves = plots._curves  # pylint: disable=protected-access
    curves(ratio, _records(), ["ratio_min", "ratio_mean", "ratio_max", "ratio_absent"], "ratio")
    curves(entropy, _records(), ["entropy"], "entropy")
    curves(missing, _records(), ["loss"], "loss")  # all NaN: nothing to draw
    fig.canvas.draw()
    assert [t.get_text() for t in ratio.get_legend().get_texts()] == ["ratio_min", "ratio_mean", "ratio_max"]
    assert entropy.get_legend() is not None and missing.get_legend() is None
    assert "not logged in this run" in [t.get_text() for t in missing.texts]
    for ax in (ratio, entropy):
      assert ax.yaxis.get_offset_text().get_text() == ""
      labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
      assert labels and all(label.replace("\u2212", "-").startswith(("0.99", "1.0", "5.5")) for label in labels), labels
  finally:
    plt.close(fig)


def test_plot_run_writes_every_png(tmp_path):
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
  written = plots.plot_run(str(tmp_path))
  assert sorted(p.name for p in written) == ["entropy.png", "kl.png", "phase_rates.png", "rewards.png",
                                             "speedup.png", "training.png"]
  assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
  with pytest.raises(plots.PlotError, match="not found"):
    plots.plot_run(str(tmp_path / "absent"))
