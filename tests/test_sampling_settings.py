"""One sampling-settings type: SamplerConfig is dice train's rollout section and the source of the
sampling flags of dice eval and dice generate (dice_jax/cli/sampling.py)."""

from __future__ import annotations

import dataclasses

import pytest

from dice_jax.cli import main, sampling
from dice_jax.config import ConfigError, to_dict
from dice_jax.rl.config import RLConfig
from dice_jax.sampler.config import DICE_SAMPLING, SamplerConfig

FROM_CHECKPOINT = {"eos_ids", "pad_id", "max_length"}  # no flag: the checkpoint says


def _parser(command: str):
  parser = main.build_parser()
  sub = next(a for a in parser._actions if a.dest == "command")  # pylint: disable=protected-access
  return sub.choices[command]


def test_every_sampler_field_is_a_rollout_key_of_dice_train():
  fields = [f.name for f in dataclasses.fields(SamplerConfig)]
  assert isinstance(RLConfig().rollout, SamplerConfig)
  assert set(fields) <= set(to_dict(RLConfig())["rollout"])


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_every_sampler_field_is_a_flag_of_eval_and_generate(command):
  parser = _parser(command)
  args = parser.parse_args(["--model", "m", "ref.py"] if command == "generate" else [])
  settings = sampling.from_args(args)
  assert settings == DICE_SAMPLING  # the flags' defaults are DICE's rollout settings
  flags = {opt for action in parser._actions for opt in action.option_strings}  # pylint: disable=protected-access
  for field in dataclasses.fields(SamplerConfig):
    if field.name in FROM_CHECKPOINT:
      continue
    flag = "--decode-mode" if field.name == "mode" else "--" + field.name.replace("_", "-")
    assert flag in flags, (command, field.name)


def test_flags_build_the_sampler_config_and_old_spellings_still_work():
  parser = _parser("generate")
  base = ["ref.py", "--model", "m"]
  args = parser.parse_args([*base, "--max-new-tokens", "64", "--top-k", "5", "--temperature", "0.7",
                            "--decode-mode", "static", "--no-kv-cache", "--steps-per-block", "2"])
  assert sampling.from_args(args) == SamplerConfig(gen_length=64, top_k=5, temperature=0.7, mode="static",
                                                   kv_cache=False, steps_per_block=2, threshold=0.9)
  assert sampling.from_args(parser.parse_args([*base, "--gen-length", "64"])).gen_length == 64
  greedy = sampling.from_args(parser.parse_args([*base, "--temperature", "0", "--top-p", "0.5"]))
  assert (greedy.top_k, greedy.temperature, greedy.top_p, greedy.greedy) == (1, 1.0, 1.0, True)
  assert sampling.from_args(parser.parse_args(base), greedy=True).greedy
  with pytest.raises(ConfigError, match="top_p must be in"):
    sampling.from_args(parser.parse_args([*base, "--top-p", "0"]))
