"""`dice-verifier check --server HOST:PORT`: the same verdicts, from a running server over gRPC.

One unary `Verify` call per candidate (all in flight at once; the server queues them), after a
`GetInfo` preflight that turns an unreachable server, a wrong token or a refused certificate into
one clear error before anything is sent. Authentication as the trainer's client does it: a bearer
token (`authorization: Bearer <token>` metadata), TLS with the system roots or a given CA, and a
client certificate for mTLS.

Decision: generated stubs directly, not dice_jax's reward client: verifier_service does not import
the trainer's package (ARCHITECTURE.md, "Layers"), and a command-line check needs neither the client's streams nor
its cache; a failed call becomes a verdict here (INVALID_ARGUMENT: REJECTED as the server worded it;
anything else: INFRA_ERROR naming the server and the status).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import pathlib

import grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
_MAX_MESSAGE_BYTES = 64 << 20


class RemoteError(RuntimeError):
  """The server cannot be used: unreachable, or it refused our credentials."""


@dataclasses.dataclass(frozen=True)
class RemoteSettings:
  """How to reach the server (the `check --server` flags)."""

  target: str
  auth_token_file: pathlib.Path | None = None
  tls: bool = False  # TLS with the system's root certificates, unless tls_ca is given
  tls_ca: pathlib.Path | None = None  # CA certificate(s) that signed the server's certificate
  tls_cert: pathlib.Path | None = None  # mTLS: our certificate chain
  tls_key: pathlib.Path | None = None  # mTLS: its private key
  tls_server_name: str | None = None  # the name checked against the server's certificate
  connect_timeout_s: float = 10.0
  request_timeout_s: float = 1800.0

  @property
  def uses_tls(self) -> bool:
    return self.tls or any((self.tls_ca, self.tls_cert, self.tls_key))


def _read(path: pathlib.Path, flag: str) -> bytes:
  try:
    return pathlib.Path(path).expanduser().read_bytes()
  except OSError as e:
    raise ValueError(f"cannot read {flag} {path}: {e.strerror}") from None


def is_loopback(address: str) -> bool:
  """Whether a gRPC target or listen address (host:port, [v6]:port, dns:///host:port) is on
  loopback. The server's exposure check uses it too."""
  host = address.split("///")[-1].rsplit(":", 1)[0].strip("[]")
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def describe(target: str, info: pb.ServerInfo) -> str:
  """One line about the server, e.g. for stderr before the verdicts."""
  gpus = ", ".join(f"{g.name} ({g.arch}) x{g.slots}" for g in info.gpus) or "no GPU (compile-only)"
  env = info.environment
  return (f"server {target}: {gpus}; nvcc {env.nvcc_version or '?'}, torch {env.torch_version or '?'}, "
          f"dice-verifier {info.server_version or '?'}; queue {info.queue_depth}/{info.queue_capacity}")


class RemoteVerifier:
  """An open channel to one server; use `async with`, then `verify(request)`."""

  def __init__(self, settings: RemoteSettings):
    if (settings.tls_cert is None) != (settings.tls_key is None):
      raise ValueError("mTLS needs both --tls-cert and --tls-key")
    self.settings = settings
    self.metadata: tuple[tuple[str, str], ...] = ()
    if settings.auth_token_file is not None:
      token = _read(settings.auth_token_file, "--auth-token-file").decode("utf-8", "replace").strip()
      if not token:
        raise ValueError(f"--auth-token-file {settings.auth_token_file} is empty")
      if not settings.uses_tls and not is_loopback(settings.target):
        log.warning("sending a bearer token to %s without TLS (add --tls or --tls-ca)", settings.target)
      self.metadata = (("authorization", f"Bearer {token}"),)
    self._credentials = None
    if settings.uses_tls:
      self._credentials = grpc.ssl_channel_credentials(
          root_certificates=_read(settings.tls_ca, "--tls-ca") if settings.tls_ca else None,
          private_key=_read(settings.tls_key, "--tls-key") if settings.tls_key else None,
          certificate_chain=_read(settings.tls_cert, "--tls-cert") if settings.tls_cert else None)
    self.channel: grpc.aio.Channel | None = None
    self.stub: pb_grpc.VerifierStub | None = None
    self.info: pb.ServerInfo | None = None

  async def __aenter__(self) -> RemoteVerifier:
    options: list[tuple[str, int | str]] = [("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)]
    if self.settings.tls_server_name:
      options.append(("grpc.ssl_target_name_override", self.settings.tls_server_name))
    if self._credentials is None:
      self.channel = grpc.aio.insecure_channel(self.settings.target, options=options)
    else:
      self.channel = grpc.aio.secure_channel(self.settings.target, self._credentials, options=options)
    self.stub = pb_grpc.VerifierStub(self.channel)
    try:
      self.info = await self.stub.GetInfo(pb.GetInfoRequest(), metadata=self.metadata, wait_for_ready=True,
                                          timeout=self.settings.connect_timeout_s)
    except grpc.aio.AioRpcError as e:
      await self.channel.close()
      raise RemoteError(self._explain(e)) from None
    return self

  async def __aexit__(self, *exc) -> None:
    if self.channel is not None:
      await self.channel.close()

  def _explain(self, error: grpc.aio.AioRpcError) -> str:
    target, code = self.settings.target, error.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
      how = "TLS" if self.settings.uses_tls else "plaintext"
      return (f"cannot reach the verifier at {target} within {self.settings.connect_timeout_s:g} s ({how}): "
              "is `dice-verifier serve` running there, and does it speak " + how + "?")
    if code == grpc.StatusCode.UNAUTHENTICATED:
      return f"{target} refused the call: {error.details()} (give the server's token with --auth-token-file)"
    return f"{target}: {code.name}: {error.details()}"

  async def verify(self, request: pb.VerifyRequest) -> pb.Verdict:
    """The server's verdict; a failed call becomes a verdict that says why (never raises RpcError)."""
    try:
      return await self.stub.Verify(request, metadata=self.metadata, timeout=self.settings.request_timeout_s)
    except grpc.aio.AioRpcError as e:
      if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return pb.Verdict(request_id=request.request_id, outcome=pb.REJECTED, stage=pb.STAGE_PARSE,
                          message=e.details() or "invalid request")
      if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        message = f"no verdict from {self.settings.target} within {self.settings.request_timeout_s:g} s (--timeout)"
      else:
        message = f"server {self.settings.target}: {e.code().name}: {e.details()}"
      return pb.Verdict(request_id=request.request_id, outcome=pb.INFRA_ERROR, stage=pb.STAGE_QUEUE,
                        message=message)
