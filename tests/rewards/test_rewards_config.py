"""RewardConfig is the one reward-settings type: the library's argument and dice train's `rewards`
section; the `auto` preset has one rule (defaults.resolve_preset)."""

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.cli.train import load
from dice_jax.config import ConfigError
from dice_jax.rewards import defaults as D


def test_the_train_config_section_is_the_library_type():
  cfg = load(None, ["rewards.weights.kernel_share=0.3", "rewards.normalize.correct=group"])
  assert isinstance(cfg.rewards, D.RewardConfig) and cfg.rewards.preset == "auto"
  shaper = D.make_shaper(cfg.rewards, has_gpu=True)
  weights = {c.name: c.weight for c in shaper.components}
  assert weights == {"format": 0.1, "compile": 0.2, "correct": 1.0, "speedup": 0.5, "kernel_share": 0.3}
  assert {c.name: c.normalize for c in shaper.components}["correct"] == "group"


def test_auto_is_resolved_against_the_verifier_by_one_rule():
  assert D.resolve_preset("auto", has_gpu=False) == "compile_only"
  assert D.resolve_preset("auto", has_gpu=True) == "default"
  assert D.resolve_preset("dice_binary", has_gpu=False) == "dice_binary"
  no_gpu = D.make_shaper(D.RewardConfig(preset="auto"), has_gpu=False)
  assert [c.name for c in no_gpu.components] == ["format", "compile"] and pb.NO_GPU not in no_gpu.exclude
  with pytest.raises(ValueError, match="'auto' depends on the verifier"):
    D.make_shaper(D.RewardConfig(preset="auto"))


@pytest.mark.parametrize("override, message", [
    ("rewards.weights.nope=1", r"rewards.weights: unknown components \['nope'\]"),
    ("rewards.normalize.format=softmax", "rewards.normalize.format: must be none, batch or group"),
    ("rewards.weights.format=.inf", "rewards.weights.format: must be finite"),
    ("rewards.custom={format: {fn: 'm:f'}}", r"rewards.custom: names \['format'\] are taken"),
])
def test_bad_reward_settings_fail_when_the_config_loads(override, message):
  with pytest.raises(ConfigError, match=message):
    load(None, [override])
