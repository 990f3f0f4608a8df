"""Reward composition math, normalisation, exclusion, hack policy and the shipped presets."""

import math

import numpy as np
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.rewards import defaults as D
from dice_jax.rewards.shaping import HackPolicy, RewardComponent, RewardShaper, zscore
from dice_jax.verifier.connect import Connection

MODEL_NEW = "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass\n```"
MIDDLE = '```python\nsource = """\n__global__ void k() {}\n"""\n```'


def ok(speedup=None):
  v = pb.Verdict(outcome=pb.OK, stage=pb.STAGE_DONE, compile=pb.CompileResult(compiled=True))
  if speedup is not None:
    v.timing.speedup = speedup
  return v


def verdict(outcome, stage=pb.STAGE_DONE, compiled=False, exploits=()):
  v = pb.Verdict(outcome=outcome, stage=stage, compile=pb.CompileResult(compiled=compiled))
  for kind in exploits:
    v.exploits.add(kind=kind, evidence="seen")
  return v


def const(values):
  return lambda prompts, completions, verdicts, **_: list(values)


def shaper_call(shaper, verdicts, completions=None, **columns):
  n = len(verdicts)
  completions = completions or [MODEL_NEW] * n
  columns.setdefault("phase", [2] * n)
  return shaper([""] * n, completions, verdicts, **columns)


def test_weighted_sum_and_per_component_metrics():
  shaper = RewardShaper([RewardComponent("a", const([1, 0, 2]), 0.5),
                         RewardComponent("b", const([4, 4, 1]), -1.0)])
  result = shaper_call(shaper, [ok(), ok(), ok()])
  np.testing.assert_allclose(result.total, [0.5 - 4, -4, 1 - 1])
  np.testing.assert_allclose(result.components["a"], [1, 0, 2])
  assert result.metrics["reward/a"] == pytest.approx(1.0)
  assert result.metrics["reward/b"] == pytest.approx(3.0)
  assert result.metrics["reward/total"] == pytest.approx((-3.5 - 4 + 0) / 3)
  assert result.metrics["verdict/ok_frac"] == 1.0
  assert result.total.dtype == np.float32


def test_batch_and_group_zscore_by_hand():
  x = np.array([1.0, 3.0, 5.0, 5.0, 2.0, 4.0])
  mask = np.ones(6, dtype=bool)
  # Batch: mean 10/3, population std sqrt(((7/3)^2+(1/3)^2+(5/3)^2*2+(4/3)^2+(2/3)^2)/6).
  mean = 20 / 6
  std = math.sqrt(sum((v - mean) ** 2 for v in x) / 6)
  np.testing.assert_allclose(zscore(x, mask), (x - mean) / std)
  groups = np.array([0, 0, 1, 1, 2, 2])
  # Group 0: [1, 3] -> [-1, 1]; group 1: [5, 5] has no spread -> [0, 0]; group 2: [2, 4] -> [-1, 1].
  np.testing.assert_allclose(zscore(x, mask, groups), [-1, 1, 0, 0, -1, 1])
  masked = np.array([True, True, True, False, True, True])
  # Masked-out entries are 0 and do not enter the statistics: group 1 is [5] alone -> 0.
  np.testing.assert_allclose(zscore(x, masked, groups), [-1, 1, 0, 0, -1, 1])


def test_components_normalise_on_their_own_before_the_weighted_sum():
  shaper = RewardShaper([RewardComponent("g", const([1, 3, 2, 4]), 2.0, normalize="group"),
                         RewardComponent("raw", const([10, 10, 10, 10]), 0.1)])
  result = shaper_call(shaper, [ok()] * 4, group_ids=["p", "p", "q", "q"])
  np.testing.assert_allclose(result.normalized["g"], [-1, 1, -1, 1])
  np.testing.assert_allclose(result.total, [-2 + 1, 2 + 1, -2 + 1, 2 + 1])
  with pytest.raises(ValueError, match="normalises per group: pass group_ids"):
    shaper_call(shaper, [ok()] * 4)


def test_excluded_outcomes_are_flagged_not_scored_as_incorrect():
  verdicts = [ok(), verdict(pb.INFRA_ERROR), verdict(pb.NO_GPU, compiled=True),
              verdict(pb.BAD_REFERENCE), verdict(pb.INCORRECT, compiled=True)]
  result = shaper_call(D.preset("default"), verdicts)
  assert result.valid.tolist() == [True, False, False, False, True]
  np.testing.assert_allclose(result.total, [0.1 + 0.2 + 1.0, 0, 0, 0, 0.1 + 0.2])
  assert result.metrics["reward/excluded_frac"] == pytest.approx(0.6)
  assert result.metrics["reward/correct"] == pytest.approx(0.5)  # over valid samples only
  assert result.metrics["verdict/infra_error_frac"] == pytest.approx(0.2)


def test_exclusion_keeps_batch_statistics_clean():
  shaper = RewardShaper([RewardComponent("c", D.correctness_reward, 1.0, normalize="batch")])
  result = shaper_call(shaper, [ok(), verdict(pb.INCORRECT), verdict(pb.INFRA_ERROR)])
  np.testing.assert_allclose(result.total, [1, -1, 0])  # the INFRA_ERROR is neither 0 nor in the mean


def test_hack_flags_zero_or_penalise_the_total():
  hacked = verdict(pb.OK, compiled=True, exploits=[pb.OUTPUT_CACHING])
  hacked.timing.speedup = 50.0
  rejected = verdict(pb.REJECTED, stage=pb.STAGE_CORRECTNESS, compiled=True, exploits=[pb.TORCH_FALLBACK])
  static_reject = verdict(pb.REJECTED, stage=pb.STAGE_STATIC_CHECK)  # not an exploit: no findings
  verdicts = [ok(2.0), hacked, rejected, static_reject]

  zero = shaper_call(D.preset("default"), verdicts)
  # The static rejection is no hack, but REJECTED earns no format credit either.
  np.testing.assert_allclose(zero.total, [0.1 + 0.2 + 1.0 + 0.5 * 1.0, 0, 0, 0])
  assert zero.hacked.tolist() == [False, True, True, False]
  assert zero.metrics["reward/hacked_frac"] == pytest.approx(0.5)

  penalty = shaper_call(D.make_shaper(D.RewardConfig(hack_mode="penalty", hack_penalty=2.0)), verdicts)
  np.testing.assert_allclose(penalty.total, [1.8, -2.0, -2.0, 0.0])

  only_caching = RewardShaper([RewardComponent("c", D.correctness_reward)],
                              hack=HackPolicy(exploits=frozenset({pb.OUTPUT_CACHING})))
  np.testing.assert_allclose(shaper_call(only_caching, verdicts).total, [1, 0, 0, 0])
  ignore = shaper_call(D.make_shaper(D.RewardConfig(preset="dice_binary", hack_mode="ignore")), verdicts)
  np.testing.assert_allclose(ignore.total, [1, 1, 0, 0])


def test_dice_binary_preset_is_compiles_and_correct():
  verdicts = [ok(3.0), verdict(pb.INCORRECT, compiled=True),
              verdict(pb.COMPILE_ERROR, pb.STAGE_COMPILE),
              verdict(pb.RUNTIME_ERROR, pb.STAGE_LOAD, compiled=True),
              verdict(pb.TIMEOUT, pb.STAGE_CORRECTNESS), verdict(pb.REJECTED, pb.STAGE_PARSE)]
  result = shaper_call(D.preset("dice_binary"), verdicts)
  np.testing.assert_allclose(result.total, [1, 0, 0, 0, 0, 0])  # no speedup term
  assert list(result.components) == ["correct"]


def test_compile_only_preset_credits_no_gpu():
  verdicts = [verdict(pb.NO_GPU, pb.STAGE_LOAD, compiled=True),
              verdict(pb.COMPILE_ERROR, pb.STAGE_COMPILE), verdict(pb.INFRA_ERROR)]
  completions = [MIDDLE, MIDDLE, MIDDLE]
  result = shaper_call(D.preset("compile_only"), verdicts, completions, phase=[1, 1, 1])
  np.testing.assert_allclose(result.total, [0.2 + 1.0, 0.2, 0])
  assert result.valid.tolist() == [True, True, False]
  # `auto` as the trainer resolves it: from what the verifiers that answered said (Connection.info).
  no_gpu = Connection(client=None, info={"a": pb.ServerInfo()})
  assert D.resolve_preset("auto", no_gpu.has_gpu) == "compile_only"
  with_gpu = Connection(client=None, info={"a": pb.ServerInfo(),
                                           "b": pb.ServerInfo(gpus=[pb.GpuInfo(name="H200")])})
  assert D.resolve_preset("auto", with_gpu.has_gpu) == "default"


def test_speedup_is_log2_and_clipped():
  fn = D.speedup_reward(min_log2=-1.0, max_log2=2.0)
  verdicts = [ok(2.0), ok(0.5), ok(64.0), ok(0.01), ok(), verdict(pb.INCORRECT), ok(0.0)]
  assert fn(None, None, verdicts) == [1.0, -1.0, 2.0, -1.0, 0.0, 0.0, 0.0]
  with pytest.raises(ValueError, match="min_log2 < max_log2"):
    D.speedup_reward(1.0, 1.0)


def test_format_reward_per_phase():
  completions = [MODEL_NEW, "no code at all", MIDDLE, MODEL_NEW, MODEL_NEW]
  verdicts = [verdict(pb.COMPILE_ERROR, pb.STAGE_COMPILE)] * 4
  verdicts.append(verdict(pb.REJECTED, pb.STAGE_STATIC_CHECK))
  assert D.format_reward(None, completions, verdicts, phase=[2, 2, 1, 1, 2]) == [1.0, 0.0, 1.0, 0.0, 0.0]
  with pytest.raises(ValueError, match="needs the `phase` item column"):
    D.format_reward(None, completions, verdicts)


def test_per_phase_metrics():
  result = shaper_call(D.preset("dice_binary"), [ok(), verdict(pb.INCORRECT), ok(), ok()],
                       phase=[1, 1, 2, 2])
  assert result.metrics["phase1/reward/correct"] == 0.5 and result.metrics["phase2/reward/correct"] == 1.0
  assert result.metrics["phase1/verdict/incorrect_frac"] == 0.5


def test_user_components_and_bad_inputs():
  def length_penalty(prompts, completions, verdicts, *, level, **_):
    return [-len(c) / 1000 - lv for c, lv in zip(completions, level)]
  shaper = D.make_shaper(D.RewardConfig(preset="dice_binary"),
                         extra=[RewardComponent("short", length_penalty, 1.0)])
  result = shaper_call(shaper, [ok()], ["x" * 500], level=[1])
  np.testing.assert_allclose(result.total, [1 - 0.5 - 1])

  with pytest.raises(ValueError, match="'bad' returned nan at index 1"):
    shaper_call(RewardShaper([RewardComponent("bad", const([0, float("nan")]))]), [ok(), ok()])
  with pytest.raises(ValueError, match=r"'short' returned shape \(2,\), expected \(1,\)"):
    shaper_call(RewardShaper([RewardComponent("short", const([0, 1]))]), [ok()])
  with pytest.raises(ValueError, match="must return numbers"):
    shaper_call(RewardShaper([RewardComponent("s", const(["x"]))]), [ok()])
  with pytest.raises(ValueError, match="level has 2 entries for 1 completions"):
    shaper_call(D.preset("dice_binary"), [ok()], level=[1, 2])
  with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
    RewardShaper([RewardComponent("a", const([])), RewardComponent("a", const([]))])
  with pytest.raises(ValueError, match="normalize must be"):
    RewardComponent("a", const([]), normalize="softmax")
  with pytest.raises(ValueError, match=r"unknown components \['nope'\]"):
    D.RewardConfig(weights={"nope": 1.0})
  with pytest.raises(ValueError, match="reward preset must be one of"):
    D.RewardConfig(preset="dice")
  with pytest.raises(ValueError, match="hack policy mode"):
    HackPolicy(mode="drop")


def test_config_overrides_weights_and_normalisation():
  config = D.RewardConfig(weights={"speedup": 0.0, "format": 1.0}, normalize={"correct": "batch"})
  shaper = D.make_shaper(config)
  weights = {c.name: (c.weight, c.normalize) for c in shaper.components}
  assert weights == {"format": (1.0, "none"), "compile": (0.2, "none"), "correct": (1.0, "batch"),
                     "speedup": (0.0, "none")}


def test_kernel_share_is_an_optional_component_of_ok_verdicts():
  partial, own, wrong = ok(2.0), ok(2.0), verdict(pb.INCORRECT, compiled=True)
  partial.custom_kernel_time_fraction, own.custom_kernel_time_fraction = 0.25, 1.0
  wrong.custom_kernel_time_fraction = 0.9
  assert D.kernel_share_reward(None, None, [partial, own, wrong]) == [0.25, 1.0, 0.0]
  assert "kernel_share" not in {c.name for c in D.preset("default").components}
  shaper = D.make_shaper(D.RewardConfig(preset="dice_binary", weights={"kernel_share": 0.4}))
  result = shaper_call(shaper, [partial, own, wrong])
  np.testing.assert_allclose(result.total, [1 + 0.1, 1 + 0.4, 0])
  assert result.metrics["reward/kernel_share"] == pytest.approx((0.25 + 1.0) / 3)
