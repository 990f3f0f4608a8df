"""benchmarks/verifier_rl_burst.py at toy size on CPU: the step plan's mix, and the whole script
through the trainer's client to a served verifier (`--dry`: every candidate ends at the static
checks, since one compile takes 20-40 s on the CI machine)."""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rl_burst_mix as mix_lib  # noqa: E402

from dice_jax.data import extract  # noqa: E402
from dice_jax.data import problems as problems_lib  # noqa: E402
from verifier_service.compile import checks  # noqa: E402


def _problems(n: int) -> list[mix_lib.Problem]:
  return [mix_lib.Problem(p.id, p.reference_source, p.prefix, p.middle, p.suffix)
          for p in problems_lib.load_problems(f"synthetic:all?split=train&limit={n}")]


def test_every_kind_is_the_candidate_it_claims_to_be():
  """Fresh kinds are distinct texts that the trainer's extraction accepts; duplicates are the
  same text, reformatted ones the same CUDA but for layout; the static checks pass them all
  (each is decided by compiling or running, as in RL), and `dry` stops every one of them there."""
  problem = _problems(1)[0]
  mix = {kind: 1.0 for kind in mix_lib.KINDS}
  history: dict[str, list[str]] = {}
  step0 = mix_lib.plan_step([problem], 40, 1, mix, random.Random(1), 0, history)
  step1 = mix_lib.plan_step([problem], 40, 2, mix, random.Random(2), 1, history)
  assert {s.kind for s in step0 + step1} == set(mix_lib.KINDS)
  for phase, step in ((1, step0), (2, step1)):
    fresh = [s.middle for s in step if s.kind not in ("duplicate", "near_duplicate", "repeat")]
    assert len(set(fresh)) == len(fresh)
    for sample in step:
      found = extract.extract_candidate(sample.completion, phase=phase, prefix=problem.prefix,
                                        suffix=problem.suffix)
      assert found.ok, (sample.kind, found.failure)
      assert found.candidate == problem.prefix + sample.middle + problem.suffix
      assert checks.check_sources(problem.reference, found.candidate).outcome is None, sample.kind
  middles = [s.middle for s in step0]
  for sample in step0:
    if sample.kind == "duplicate":
      assert sample.middle in middles[:middles.index(sample.middle) + 1]
    if sample.kind == "near_duplicate":  # the layout of another sample, changed
      bare = lambda m: " ".join(m.replace("// one thread per element", "").split())
      assert any(m != sample.middle and bare(m) == bare(sample.middle) for m in middles)
  assert any(s.kind == "repeat" and s.middle in history[problem.id] for s in step1)
  dry = mix_lib.plan_step([problem], 10, 1, mix, random.Random(3), 2, {}, dry=True)
  assert {checks.check_sources(problem.reference, problem.prefix + s.middle + problem.suffix)
          .outcome for s in dry} == {"REJECTED"}


def test_mix_refuses_unknown_kinds_and_copies_alone():
  with pytest.raises(ValueError, match="unknown sample kind 'corect'"):
    mix_lib.parse_mix("corect=1")
  with pytest.raises(ValueError, match="needs a kind that is not a copy"):
    mix_lib.parse_mix("duplicate=1")


def _dry_burst(tmp_path, steps: int, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
  """A dry run of the benchmark (2 problems x 4 samples a step): its output and its JSON."""
  out = tmp_path / "burst.json"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "benchmarks" / "verifier_rl_burst.py"), "--dry", "--no-gpu",
       "--synthetic-share", "1", "--problems-per-step", "2", "--samples", "4", "--steps",
       str(steps), "--compile-workers", "1", *flags, "--json", str(out)],
      capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc, json.loads(out.read_text())


def test_the_benchmark_runs_end_to_end_and_writes_its_figures(tmp_path):
  proc, report = _dry_burst(tmp_path, 3)
  for key in ("verdicts_per_s", "step_p50_s", "step_p90_s", "cold_step_s", "date", "hardware",
              "cpu_s_per_compile", "gpu_s_per_job", "outcomes"):
    assert key in report, key
  assert report["mode"] == "dry" and report["steps_run"] == 3
  assert [s["completions"] for s in report["steps"]] == [8, 8, 8]
  assert report["outcomes"] == {"REJECTED": 24}
  assert all(s["compiles"] == 0 and s["slot_parts_s_per_job"] == {} for s in report["steps"])
  assert "step 2: 8 completions" in proc.stdout and "targets (one 16-core H200 box)" in proc.stdout


def test_near_duplicates_are_counted_as_the_servers_program_cache_hits(tmp_path):
  """A near duplicate (the same program laid out otherwise) reaches the server and is answered by
  its program cache (text_key.py); the step reports those answers apart from the verdict cache's."""
  proc, report = _dry_burst(tmp_path, 2, "--mix", "correct=0.5,near_duplicate=0.5")
  steps = report["steps"]
  for step in steps:
    near = sum(step["outcomes_by_kind"].get("near_duplicate", {}).values())
    answered = step["server_program_cache_hits"] + step["client_cache_hits"]
    assert near and answered >= near, step
    assert step["server_verdict_cache_hits"] == 0
  assert sum(s["server_program_cache_hits"] for s in steps) > 0
  assert "by its program cache" in proc.stdout


def test_a_steps_slot_parts_are_means_over_its_jobs_largest_first():
  import verifier_rl_burst as burst  # pylint: disable=import-outside-toplevel
  delta = {"slot_part_s:exit": 1.5, "slot_part_n:exit": 3.0, "slot_part_s:fork": 0.0,
           "slot_part_n:fork": 0.0, "slot_part_s:judge_run": 3.0, "slot_part_n:judge_run": 2.0}
  assert list(burst._slot_parts(delta).items()) == [("judge_run", 1.5), ("exit", 0.5)]


def test_a_steps_gpu_slots_are_measured_from_its_jobs_intervals():
  import verifier_rl_burst as burst  # pylint: disable=import-outside-toplevel
  # Two slots over a 10 s step: idle until 2 s, one job 2-5 s, both 3-4 s, idle 6-10 s.
  got = burst.occupancy([(2.0, 5.0), (3.0, 4.0), (5.0, 6.0)], 10.0, 2)
  assert got == {"first_job_s": 2.0, "busy": 5.0 / 20.0, "idle_s": 6.0, "all_busy_s": 1.0}
  assert burst.occupancy([], 10.0, 2) == {"first_job_s": None, "busy": 0.0, "idle_s": 10.0,
                                          "all_busy_s": 0.0}
  # A job that ends after the step's last verdict (its processes' exit) still counts.
  assert burst.occupancy([(0.0, 11.0)], 10.0, 1)["all_busy_s"] == 11.0
