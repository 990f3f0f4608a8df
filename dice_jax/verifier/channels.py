"""How the client reaches verifier targets: its settings, TLS or plaintext channels, bearer-token
metadata, load-balancing policy and reconnect timing. The retry/spreading logic is in client.py.
ClientConfig's timeouts and in-flight window default to those of training (defaults.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import pathlib
import grpc

from dice.verifier.v1 import verifier_pb2_grpc as pb_grpc
from dice_jax.verifier.defaults import TRAINING

_log = logging.getLogger(__name__)
_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
# Candidates can be large; the verifier bounds them itself (ServerInfo.max_source_bytes).
_MAX_MESSAGE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class ClientConfig:
  """Verifier client settings (a config section: scalars only)."""

  targets: tuple[str, ...] = ("127.0.0.1:50051",)
  request_timeout_s: float = TRAINING.request_timeout_s  # per send: from write to verdict
  connect_timeout_s: float = TRAINING.connect_timeout_s  # per connection try
  max_attempts: int = 3               # sends per request (and connection tries before giving up)
  backoff_initial_s: float = 0.5
  backoff_max_s: float = 10.0
  max_in_flight_per_stream: int = TRAINING.max_in_flight_per_stream
  streams_per_target: int = 1
  cache_entries: int = 100_000
  auth_token_file: str | None = None  # file holding a bearer token, sent as `authorization`
  tls: bool = False                   # TLS with the system roots, or with tls_root_certs_file
  tls_root_certs_file: str | None = None
  tls_client_cert_file: str | None = None   # mTLS: client certificate chain (PEM)
  tls_client_key_file: str | None = None    # mTLS: its private key (PEM)
  tls_server_name: str | None = None        # override the name checked against the certificate

  def __post_init__(self):
    checks = [
        (bool(self.targets) and all(isinstance(t, str) and t.strip() for t in self.targets),
         "targets", "must list at least one HOST:PORT or gRPC target"),
        (self.request_timeout_s > 0, "request_timeout_s", "must be > 0"),
        (self.connect_timeout_s > 0, "connect_timeout_s", "must be > 0"),
        (self.max_attempts >= 1, "max_attempts", "must be >= 1"),
        (0 < self.backoff_initial_s <= self.backoff_max_s, "backoff_initial_s",
         "must be > 0 and <= backoff_max_s"),
        (self.max_in_flight_per_stream >= 1, "max_in_flight_per_stream", "must be >= 1"),
        (self.streams_per_target >= 1, "streams_per_target", "must be >= 1"),
        (self.cache_entries >= 0, "cache_entries", "must be >= 0"),
        ((self.tls_client_cert_file is None) == (self.tls_client_key_file is None),
         "tls_client_cert_file", "and tls_client_key_file must be given together"),
    ]
    for ok, key, message in checks:
      if not ok:
        raise ValueError(f"verifier client config: {key} {message}")

  def backoff_s(self, failures: int) -> float:
    return min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, failures - 1))


def _read(path: str, what: str) -> bytes:
  try:
    return pathlib.Path(path).expanduser().read_bytes()
  except OSError as e:
    raise ValueError(f"verifier client: cannot read {what} {path!r}: {e.strerror}") from None


def auth_metadata(config: ClientConfig, token: str | None = None) -> tuple[tuple[str, str], ...]:
  """`(("authorization", "Bearer <token>"),)` from `token` or `auth_token_file`, or no metadata."""
  if token is None:
    if config.auth_token_file is None:
      return ()
    token = _read(config.auth_token_file, "auth token file").decode("utf-8", "replace")
  token = token.strip()
  if not token:
    raise ValueError("verifier client: the auth token is empty")
  if not config.tls and not all(_is_loopback(t) for t in config.targets):
    _log.warning("sending a bearer token to a non-loopback verifier without TLS: set tls=true")
  return (("authorization", f"Bearer {token}"),)


def _is_loopback(target: str) -> bool:
  host = target.split("///")[-1].rsplit(":", 1)[0].strip("[]")
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def _credentials(config: ClientConfig) -> grpc.ChannelCredentials | None:
  if not config.tls:
    return None
  def read(path: str | None, what: str) -> bytes | None:
    return _read(path, what) if path else None
  root = read(config.tls_root_certs_file, "TLS root certificates")
  key = read(config.tls_client_key_file, "TLS client key")
  chain = read(config.tls_client_cert_file, "TLS client certificate")
  return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)


class Target:
  """One verifier target: its channel, stub and readiness check."""

  def __init__(self, address: str, config: ClientConfig):
    self.address = address
    backoff_ms = int(config.backoff_max_s * 1000)
    options: list[tuple[str, int | str]] = [
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        # Notice a restarted server within our own backoff, not gRPC's default of up to 120 s.
        ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(1000, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    ]
    if address.startswith("dns:"):
      options.append(("grpc.service_config", _ROUND_ROBIN))
    if config.tls_server_name:
      options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    credentials = _credentials(config)
    if credentials is None:
      self.channel = grpc.aio.insecure_channel(address, options=options)
    else:
      self.channel = grpc.aio.secure_channel(address, credentials, options=options)
    self.stub = pb_grpc.VerifierStub(self.channel)

  async def ready(self, timeout_s: float) -> bool:
    """Whether the channel connects within `timeout_s` (it keeps trying in the background)."""
    try:
      await asyncio.wait_for(self.channel.channel_ready(), timeout_s)
      return True
    except asyncio.TimeoutError:
      return False

  async def close(self) -> None:
    await self.channel.close()
