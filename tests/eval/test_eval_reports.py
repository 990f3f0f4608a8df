"""Reports from hand-made verdicts: summary.json, per-problem files, Markdown, plots, --compare."""

import json

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data.problems import Problem
from dice_jax.eval import compare, plots, report
from dice_jax.eval.runner import ProblemResult, SampleResult

PNG = b"\x89PNG\r\n\x1a\n"
REF = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"


STAGES = {pb.COMPILE_ERROR: pb.STAGE_COMPILE, pb.NO_GPU: pb.STAGE_LOAD, pb.INFRA_ERROR: pb.STAGE_QUEUE,
          pb.INCORRECT: pb.STAGE_CORRECTNESS, pb.RUNTIME_ERROR: pb.STAGE_LOAD}


def verdict(outcome, speedup=None):
  v = pb.Verdict(request_id="r", outcome=outcome, stage=STAGES.get(outcome, pb.STAGE_DONE),
                 message=pb.Outcome.Name(outcome))
  if outcome in (pb.OK, pb.INCORRECT, pb.NO_GPU):
    v.compile.compiled = True
  if speedup is not None:
    v.timing.speedup = speedup
  return v


def results(spec):
  """spec: {(id, level): [verdicts]} -> ProblemResults."""
  out = []
  for (pid, level), verdicts in spec.items():
    problem = Problem(id=pid, reference_source=REF, level=level, origin=f"test:{pid}")
    out.append(ProblemResult(problem, [SampleResult(i, f"{pid}/{i}.py", v, f"k{pid}{i}")
                                       for i, v in enumerate(verdicts)]))
  return out


BEFORE = {("a", 1): [verdict(pb.OK, 1.5)], ("b", 1): [verdict(pb.INCORRECT)],
          ("c", 2): [verdict(pb.COMPILE_ERROR)], ("d", 2): [verdict(pb.OK, 0.5)]}
AFTER = {("a", 1): [verdict(pb.OK, 3.0)], ("b", 1): [verdict(pb.OK, 1.2)],
         ("c", 2): [verdict(pb.COMPILE_ERROR)], ("d", 2): [verdict(pb.RUNTIME_ERROR)]}


def write_run(out, spec, name):
  res = results(spec)
  summary = report.write_outputs(out, res, {"name": name, "problems_source": "test"})
  paths = plots.write_plots(out, summary, [r.scores() for r in res])
  return summary, paths


def test_outputs_hold_the_numbers_and_every_verdict(tmp_path):
  summary, paths = write_run(tmp_path, BEFORE, "before")
  on_disk = json.loads((tmp_path / "summary.json").read_text())
  assert on_disk == json.loads(json.dumps(summary)) and on_disk["schema"] == report.SCHEMA
  assert on_disk["overall"]["correct_rate"] == 0.5
  assert on_disk["overall"]["fast_1"] == 0.25
  assert on_disk["levels"]["level_2"]["speedup_geomean"] == pytest.approx(0.5)
  assert on_disk["notes"] == []
  record = json.loads((tmp_path / "problems" / "a.json").read_text())
  assert record["samples"][0]["outcome"] == "OK" and record["samples"][0]["speedup"] == 1.5
  assert record["samples"][0]["verdict"]["timing"]["speedup"] == 1.5
  md = (tmp_path / "summary.md").read_text()
  assert "| level_1 | 2 | 2 | 100.0% | 50.0% | 50.0% | 0.0% | 1.50x | 1.50x |" in md
  assert "| overall | 4 | 4 | 75.0% | 50.0% | 25.0% | 0.0% |" in md
  assert [p.name for p in paths] == ["speedup_distribution.png", "fast_p.png", "levels.png"]
  for p in paths:
    assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5000


def test_compile_only_report_says_so_plainly(tmp_path):
  summary, paths = write_run(tmp_path, {("a", 1): [verdict(pb.NO_GPU)], ("b", 1): [verdict(pb.INFRA_ERROR)]},
                             "nogpu")
  assert summary["overall"]["correct_rate"] is None
  assert any("no GPU" in n and "nothing in this report shows that a kernel is correct" in n
             for n in summary["notes"])
  assert any("INFRA_ERROR" in n and "rerun" in n for n in summary["notes"])
  md = (tmp_path / "summary.md").read_text()
  assert "| overall | 2 | 2 | 50.0% | n/a | n/a | n/a | n/a | n/a |" in md and "**Note.**" in md
  assert all(p.read_bytes()[:8] == PNG for p in paths)


def _drawn_figures(monkeypatch) -> list:
  """Keeps each figure the plots module saves (the real _save still writes it)."""
  figures, save = [], plots._save  # pylint: disable=protected-access
  monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), save(fig, path))[1])
  return figures


def test_plot_legends_list_only_drawn_series_and_ticks_have_no_offset(tmp_path, monkeypatch):
  figures = _drawn_figures(monkeypatch)
  write_run(tmp_path / "nogpu", {("a", 1): [verdict(pb.NO_GPU)], ("b", 1): [verdict(pb.COMPILE_ERROR)]}, "nogpu")
  bars = figures[-1].axes[0]
  assert [t.get_text() for t in bars.get_legend().get_texts()] == ["compiled"]  # correct/fast_*: n/a, no colour
  write_run(tmp_path / "gpu", BEFORE, "gpu")
  bars = figures[-1].axes[0]
  assert [t.get_text() for t in bars.get_legend().get_texts()] == ["compiled", "correct", "fast_1", "fast_2"]
  for fig in figures:
    fig.canvas.draw()
    for ax in fig.axes:
      assert ax.yaxis.get_offset_text().get_text() == "", ax.get_title()


def test_compare_shows_deltas_and_changed_problems(tmp_path):
  write_run(tmp_path / "a", BEFORE, "before")
  write_run(tmp_path / "b", AFTER, "after")
  result = compare.compare(str(tmp_path / "a"), str(tmp_path / "b"))
  assert result["groups"]["overall"]["correct_rate"] == [0.5, 0.5, 0.0]
  assert result["groups"]["level_1"]["fast_1"] == [0.5, 1.0, 0.5]
  assert result["problems"]["gained"] == ["b"] and result["problems"]["lost"] == ["d"]
  assert result["problems"]["compared_on"] == "correct"
  compare.write_outputs(tmp_path / "cmp", result)
  md = (tmp_path / "cmp" / "compare.md").read_text()
  assert "| level_1 | fast_1 | 50.0% | 100.0% | +50.0 pt |" in md and "- gained: b" in md
  assert (tmp_path / "cmp" / "compare_fast_p.png").read_bytes()[:8] == PNG
  assert result["warnings"] == []  # one sample per problem on both sides
  with pytest.raises(ValueError, match="dice eval --out"):
    compare.compare(str(tmp_path / "a"), str(tmp_path / "nowhere"))


def test_compare_warns_when_sample_counts_differ(tmp_path):
  write_run(tmp_path / "a", BEFORE, "one sample")
  write_run(tmp_path / "b", {key: verdicts * 4 for key, verdicts in AFTER.items()}, "four samples")
  result = compare.compare(str(tmp_path / "a"), str(tmp_path / "b"))
  [warning] = result["warnings"]
  assert "different sample counts per problem (A: 1, B: 4)" in warning and "same --samples" in warning
  compare.write_outputs(tmp_path / "cmp", result)
  assert "**Warning.** the runs have different sample counts" in (tmp_path / "cmp" / "compare.md").read_text()
