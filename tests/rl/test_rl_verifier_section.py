"""The trainer's `verifier` section reaches the client: TLS files, streams per target, what requests ask."""

from __future__ import annotations

import pytest

from dice.verifier.v1 import verifier_pb2 as pb

from dice_jax.config import ConfigError
from dice_jax.rl import setup
from dice_jax.rl.config import VerifierSection


def test_tls_settings_reach_the_client(tmp_path):
  section = VerifierSection(targets=("127.0.0.1:9",), tls=True, tls_root_certs_file=str(tmp_path / "missing.pem"),
                            connect_timeout_s=0.5)
  with pytest.raises(ConfigError, match="verifier: verifier client: cannot read TLS root certificates"):
    setup.connect_verifier(section, str(tmp_path))


def test_bad_client_settings_are_config_errors():
  with pytest.raises(ConfigError, match="tls_client_key_file must be given together"):
    VerifierSection(tls_client_cert_file="client.pem")
  with pytest.raises(ConfigError, match="streams_per_target"):
    VerifierSection(streams_per_target=0)
  with pytest.raises(ConfigError, match="num_timing_trials"):
    VerifierSection(num_timing_trials=-1)


def test_trials_and_timing_reach_every_request():
  """What a run's requests ask the verifier for: zeros leave the server's defaults, set values go as set."""
  assert VerifierSection().options() == pb.VerifyOptions(precision=pb.FP32)
  options = VerifierSection(num_correctness_trials=3, num_timing_trials=30, precision="bf16").options()
  assert (options.num_correctness_trials, options.num_timing_trials, options.precision) == (3, 30, pb.BF16)
