"""Metric math against hand-computed cases, and the verdict -> score mapping."""

import math

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.eval import metrics as m
from dice_jax.eval import records
from dice_jax.rewards.candidates import format_verdict


def ok(speedup=None):
  return m.SampleScore("OK", compiled=True, correct=True, speedup=speedup)


FAIL_COMPILE = m.SampleScore("COMPILE_ERROR")
INCORRECT = m.SampleScore("INCORRECT", compiled=True)
FORMAT = m.SampleScore("FORMAT")


def hand_case():
  # P1: two correct (1.5x, 0.8x); P2: one wrong, one correct 2.5x; P3: nothing compiles.
  return [m.ProblemScores("p1", 1, (ok(1.5), ok(0.8))),
          m.ProblemScores("p2", 1, (INCORRECT, ok(2.5))),
          m.ProblemScores("p3", 2, (FAIL_COMPILE, FORMAT))]


def test_pass_at_k_by_hand_and_against_exact_binomials():
  assert m.pass_at_k(5, 2, 1) == pytest.approx(0.4)
  assert m.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)   # 1 - C(3,2)/C(5,2)
  assert m.pass_at_k(5, 2, 4) == 1.0                         # n - c < k: every draw has a hit
  assert m.pass_at_k(10, 0, 3) == 0.0
  assert m.pass_at_k(1, 1, 1) == 1.0
  n, c, k = 200, 3, 100  # binomials of ~1e58: the product form stays exact enough
  exact = 1 - math.comb(n - c, k) / math.comb(n, k)
  assert m.pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
  for bad in ((5, 6, 1), (5, 2, 0), (5, 2, 6)):
    with pytest.raises(ValueError):
      m.pass_at_k(*bad)


def test_geometric_mean_by_hand():
  assert m.geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
  assert m.geometric_mean([2.0, 8.0, 0.5]) == pytest.approx(2.0)  # (2*8*0.5)^(1/3) = 8^(1/3)
  assert m.geometric_mean([]) is None
  with pytest.raises(ValueError):
    m.geometric_mean([1.0, 0.0])


def test_group_metrics_by_hand():
  g = m.group_metrics(hand_case())
  assert g["problems"] == 3 and g["samples"] == 6 and g["samples_per_problem"] == 2
  assert g["compile_rate"] == pytest.approx((1 + 1 + 0) / 3)
  assert g["correct_rate"] == pytest.approx((1 + 0.5 + 0) / 3)
  assert g["fast_1"] == pytest.approx((0.5 + 0.5 + 0) / 3)   # 1.5x and 2.5x
  assert g["fast_2"] == pytest.approx((0 + 0.5 + 0) / 3)     # only 2.5x
  assert g["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(2 / 3)}
  assert g["timed_correct"] == 3
  assert g["speedup_mean"] == pytest.approx((1.5 + 0.8 + 2.5) / 3)
  assert g["speedup_geomean"] == pytest.approx((1.5 * 0.8 * 2.5) ** (1 / 3))
  assert g["speedup_median"] == pytest.approx(1.5)
  assert g["outcomes"] == {"COMPILE_ERROR": 1, "FORMAT": 1, "INCORRECT": 1, "OK": 3}
  assert g["correctness_available"] is True


def test_fast_p_is_strict_and_counts_untimed_correct_as_not_fast():
  problems = [m.ProblemScores("a", 1, (ok(1.0),)), m.ProblemScores("b", 1, (ok(None),))]
  assert m.fast_p(problems, 1.0) == 0.0        # speedup == p is not faster than p
  assert m.fast_p(problems, 0.99) == 0.5
  assert m.group_metrics(problems)["correct_rate"] == 1.0


def test_fast_p_curve_is_monotone_and_meets_fast_1_and_fast_2():
  g = m.group_metrics(hand_case())
  curve = g["fast_p_curve"]
  assert curve["p"][0] == 0.0 and curve["p"][-1] >= 2.5
  assert all(a >= b for a, b in zip(curve["fast_p"], curve["fast_p"][1:]))
  assert curve["fast_p"][0] == pytest.approx(g["correct_rate"])
  assert curve["fast_p"][curve["p"].index(1.0)] == pytest.approx(g["fast_1"])
  assert curve["fast_p"][curve["p"].index(2.0)] == pytest.approx(g["fast_2"])


def test_every_problem_weighs_the_same_whatever_its_sample_count():
  problems = [m.ProblemScores("a", 1, (ok(3.0),)), m.ProblemScores("b", 1, (INCORRECT,) * 4)]
  g = m.group_metrics(problems)
  assert g["correct_rate"] == pytest.approx(0.5) and g["samples_per_problem"] is None
  assert list(g["pass_at_k"]) == ["1"]  # k is bounded by the smallest problem's n
  with pytest.raises(ValueError, match="pass@2"):
    m.group_metrics(problems, ks=(2,))


def test_no_gpu_gives_compile_only_numbers_and_never_zero_correct():
  problems = [m.ProblemScores("a", 1, (m.SampleScore("NO_GPU", compiled=True), FAIL_COMPILE))]
  g = m.group_metrics(problems)
  assert g["correctness_available"] is False and g["no_gpu"] == 1
  assert g["compile_rate"] == 0.5
  for key in ("correct_rate", "fast_1", "fast_2", "pass_at_k", "speedup_geomean", "fast_p_curve"):
    assert g[key] is None


def test_summarize_groups_by_level_with_unleveled_last():
  problems = hand_case() + [m.ProblemScores("x", None, (ok(4.0),))]
  s = m.summarize(problems)
  assert list(s["levels"]) == ["level_1", "level_2", "unleveled"]
  assert s["levels"]["level_1"]["correct_rate"] == pytest.approx(0.75)
  assert s["levels"]["level_2"]["compile_rate"] == 0.0
  assert s["overall"]["problems"] == 4
  assert [name for name, _ in m.groups(s)] == ["level_1", "level_2", "unleveled", "overall"]


def test_sample_score_invariants():
  with pytest.raises(ValueError):
    m.SampleScore("OK", compiled=False, correct=True)
  with pytest.raises(ValueError):
    m.SampleScore("INCORRECT", compiled=True, speedup=2.0)
  with pytest.raises(ValueError):
    m.ProblemScores("empty", 1, ())


def _timed_ok(speedup, exploits=(), warm=None):
  v = pb.Verdict(request_id="r", outcome=pb.OK, stage=pb.STAGE_DONE)
  v.compile.compiled = True
  v.timing.speedup = speedup
  if warm is not None:
    v.timing.speedup_warm = warm
  v.trials.add(seed=1, passed=True, max_abs_error=3e-5)
  v.trials.add(seed=2, passed=True, max_abs_error=7e-5)
  for kind in exploits:
    v.exploits.add(kind=kind, evidence="x")
  return v


def test_verdicts_map_to_scores_and_rows():
  s = records.score(_timed_ok(1.7))
  assert (s.outcome, s.compiled, s.correct, s.speedup) == ("OK", True, True, 1.7)
  assert records.max_abs_error(_timed_ok(1.7)) == pytest.approx(7e-5)
  flagged = records.score(_timed_ok(500.0, [pb.IMPLAUSIBLE_SPEEDUP]))
  assert (flagged.outcome, flagged.correct, flagged.speedup) == (records.FLAGGED, False, None)
  no_gpu = records.score(pb.Verdict(request_id="r", outcome=pb.NO_GPU, stage=pb.STAGE_LOAD))
  assert (no_gpu.compiled, no_gpu.correct) == (True, False)
  rejected = records.score(pb.Verdict(request_id="r", outcome=pb.REJECTED, stage=pb.STAGE_STATIC_CHECK))
  assert (rejected.outcome, rejected.compiled) == ("REJECTED", False)
  fmt = format_verdict("format: no code")
  assert records.outcome_label(fmt) == records.FORMAT and not records.score(fmt).compiled
  row = records.compact(_timed_ok(1.7))
  assert row["outcome"] == "OK" and row["speedup"] == 1.7 and row["stage"] == "DONE"
  assert records.from_dict(records.to_dict(_timed_ok(1.7))) == _timed_ok(1.7)


def test_the_warm_speedup_is_kept_beside_the_cold_one_and_summarised_apart():
  """Cold calls (L2 flushed) give `speedup`, which fast_p uses; warm calls, KernelBench's
  condition, give `speedup_warm`, summarised on its own so a run can be set beside KernelBench's."""
  s = records.score(_timed_ok(1.7, warm=2.1))
  assert (s.speedup, s.speedup_warm) == (1.7, 2.1)
  assert records.compact(_timed_ok(1.7, warm=2.1))["speedup_warm"] == 2.1
  assert records.score(_timed_ok(1.7)).speedup_warm is None  # a verdict without the warm figure
  flagged = records.score(_timed_ok(500.0, [pb.IMPLAUSIBLE_SPEEDUP], warm=400.0))
  assert flagged.speedup_warm is None
  with pytest.raises(ValueError):
    m.SampleScore("INCORRECT", compiled=True, speedup_warm=2.0)
  scores = [m.ProblemScores("a", 1, (records.score(_timed_ok(1.0, warm=2.0)),
                                     records.score(_timed_ok(4.0, warm=8.0)))),
            m.ProblemScores("b", 1, (records.score(_timed_ok(3.0)),))]
  g = m.group_metrics(scores)
  assert g["speedup_geomean"] == pytest.approx((1.0 * 4.0 * 3.0) ** (1 / 3))
  assert g["speedup_warm_geomean"] == pytest.approx(4.0)  # (2 x 8)^(1/2): b has no warm figure
  assert g["speedup_warm_median"] == pytest.approx(5.0)
  assert g["fast_2"] == pytest.approx((0.5 + 1.0) / 2)  # fast_p stays on the cold figure
