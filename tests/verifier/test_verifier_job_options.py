"""The options a job runs with (run/job.JobOptions): resolved from a request, carried as JSON to the
worker, read back by the judge and the candidate's process; a slip is refused where it is made."""

from __future__ import annotations

import pytest

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service import enums
from verifier_service.run.job import JobOptions
from verifier_service.service import config as config_lib


def test_a_request_resolves_to_options_with_defaults_and_clamps():
  config = config_lib.ServerConfig(timing_trials=100, max_timing_trials=1000, strict_min_fraction=0.5)
  options = config_lib.resolve_options(pb.VerifyOptions(
      precision=pb.BF16, num_timing_trials=5000, policy=pb.POLICY_STRICT), config)
  assert options.precision == enums.BF16 and options.policy == enums.POLICY_STRICT
  assert options.num_timing_trials == 1000  # clamped to the server's maximum
  assert options.num_correctness_trials == config.correctness_trials  # 0: the server's default
  assert options.min_custom_kernel_fraction == 0.5
  assert config_lib.resolve_options(pb.VerifyOptions(), config).precision == enums.FP32


def test_json_round_trip_and_refusals():
  options = config_lib.resolve_options(pb.VerifyOptions(seed=7), config_lib.ServerConfig())
  data = options.to_json()
  assert JobOptions.from_json(data) == options and data["seed"] == 7
  with pytest.raises(ValueError, match=r"missing \['seed'\]"):
    JobOptions.from_json({k: v for k, v in data.items() if k != "seed"})
  with pytest.raises(ValueError, match=r"unknown \['sede'\]"):
    JobOptions.from_json(dict(data, sede=1))
  with pytest.raises(ValueError, match="precision 'FP8'"):
    JobOptions.from_json(dict(data, precision="FP8"))
  with pytest.raises(ValueError, match="policy 'POLICY_LAX'"):
    JobOptions.from_json(dict(data, policy="POLICY_LAX"))
