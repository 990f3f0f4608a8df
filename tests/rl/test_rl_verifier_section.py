"""The trainer's `verifier` section reaches the client: TLS files and streams per target."""

from __future__ import annotations

import pytest

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
