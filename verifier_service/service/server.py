"""The gRPC front: Verify, VerifyStream, GetInfo, plus standard health checking and reflection.

Requests are validated here, before anything is queued: empty or oversized sources, an empty or
over-long request id, and messages that do not decode (protobuf refuses non-UTF-8 in string
fields) are INVALID_ARGUMENT on the unary call. The request deserializer is ours for that reason:
grpc's default one would turn a decode error into an opaque INTERNAL. On the stream, a request
that decodes but is invalid comes back as a REJECTED verdict at STAGE_PARSE (the stream goes on);
one that does not decode ends the stream with INVALID_ARGUMENT, since its id cannot be known.

A full queue is RESOURCE_EXHAUSTED on Verify and an INFRA_ERROR verdict at STAGE_QUEUE on the
stream (the proto's contract). Deadlines: grpc.aio cancels the handler when the client's deadline
passes, and that cancellation reaches the compile processes and the worker child (reference
counted, so a request sharing the same build with another is not disturbed).

Listening beyond loopback needs authentication: a bearer token (`authorization: Bearer <token>`
metadata; the health service is exempt so probes work) and/or mutual TLS (the server presents
`tls_cert`/`tls_key` and accepts only clients whose certificate `tls_client_ca` signed). Without
either the server refuses to start on a non-loopback address unless `insecure` is set explicitly
(`--insecure-public`).

Start-up fails fast and plainly: the address is probed (`check_bindable`) before any worker or
compile process starts, so a second `serve` on a busy port is one `BindError` line, not a
traceback after a minute of warm-up. When the server accepts connections, `serve` prints one line
(`ready_line`): the address, the GPUs and worker slots (or compile-only), the authentication mode.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import pathlib
import socket
import sys
from typing import Any, AsyncIterator

import grpc
from google.protobuf import message as pb_message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service.service import config as config_lib
from verifier_service.service import remote
from verifier_service.service import scheduler as scheduler_lib

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Verifier"].full_name


class _Malformed:
  """Stands in for a request whose bytes did not decode."""

  def __init__(self, error: str):
    self.error = error


def _decode_request(data: bytes) -> pb.VerifyRequest | _Malformed:
  try:
    return pb.VerifyRequest.FromString(data)
  except pb_message.DecodeError as e:
    return _Malformed(f"request does not decode (non-UTF-8 text?): {e}")


def validate(request: pb.VerifyRequest, config: config_lib.ServerConfig) -> str:
  """Why the request is invalid, or "" when it may be queued."""
  if not request.request_id:
    return "request_id is empty"
  if len(request.request_id.encode()) > config.max_request_id_bytes:
    return f"request_id is longer than {config.max_request_id_bytes} bytes"
  for field in ("reference_source", "candidate_source"):
    text = getattr(request, field)
    if not text.strip():
      return f"{field} is empty"
    size = len(text.encode())
    if size > config.max_source_bytes:
      return f"{field} is {size} bytes; the limit is {config.max_source_bytes}"
  return ""


class VerifierService:
  """Implements dice.verifier.v1.Verifier over a Scheduler."""

  def __init__(self, scheduler: scheduler_lib.Scheduler):
    self.scheduler = scheduler
    self.config = scheduler.config

  async def Verify(self, request: Any, context: grpc.aio.ServicerContext) -> pb.Verdict:  # pylint: disable=invalid-name
    if isinstance(request, _Malformed):
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
    error = validate(request, self.config)
    if error:
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
    try:
      return await self.scheduler.verify(request)
    except scheduler_lib.QueueFull as e:
      await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"queue full: {e}; retry later")
      raise AssertionError("unreachable: abort raises") from e  # grpc's types do not say so

  async def VerifyStream(self, request_iterator: AsyncIterator[Any],  # pylint: disable=invalid-name
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Verdict]:
    out: asyncio.Queue[pb.Verdict | BaseException | None] = asyncio.Queue()
    pending: set[asyncio.Task] = set()

    async def handle(request: pb.VerifyRequest) -> None:
      try:
        verdict = await self.scheduler.verify(request)
      except scheduler_lib.QueueFull as e:
        verdict = pb.Verdict(request_id=request.request_id, outcome=pb.INFRA_ERROR,
                             stage=pb.STAGE_QUEUE, message=f"queue full: {e}; retry later")
      except Exception as e:  # pylint: disable=broad-except
        # Ours: the stream still answers this request (a task's exception alone would leave the
        # client waiting on it until its deadline).
        log.exception("verify failed for %s", request.request_id)
        verdict = pb.Verdict(request_id=request.request_id, outcome=pb.INFRA_ERROR,
                             message=f"verifier error: {type(e).__name__}: {e}")
      await out.put(verdict)

    async def read() -> None:
      try:
        async for request in request_iterator:
          if isinstance(request, _Malformed):
            raise ValueError(request.error)
          error = validate(request, self.config)
          if error:
            await out.put(pb.Verdict(request_id=request.request_id, outcome=pb.REJECTED,
                                     stage=pb.STAGE_PARSE, message=f"invalid request: {error}"))
            continue
          task = asyncio.ensure_future(handle(request))
          pending.add(task)
          task.add_done_callback(pending.discard)
        while pending:
          await asyncio.gather(*list(pending))
        await out.put(None)
      except Exception as e:  # pylint: disable=broad-except
        await out.put(e)

    reader = asyncio.ensure_future(read())
    try:
      while True:
        item = await out.get()
        if item is None:
          break
        if isinstance(item, BaseException):
          await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(item))  # raises
        else:
          yield item
    finally:
      reader.cancel()
      for task in list(pending):
        task.cancel()

  async def GetInfo(self, request: pb.GetInfoRequest,  # pylint: disable=invalid-name
                    context: grpc.aio.ServicerContext) -> pb.ServerInfo:
    del request, context
    return await asyncio.get_running_loop().run_in_executor(None, self.scheduler.info)


class _TokenAuth(grpc.aio.ServerInterceptor):
  """Requires `authorization: Bearer <token>` on every call except health checks."""

  def __init__(self, token: str):
    self._expected = f"Bearer {token}"

  async def intercept_service(self, continuation, handler_call_details):
    if handler_call_details.method.startswith("/grpc.health.v1.Health/"):
      return await continuation(handler_call_details)
    metadata = dict(handler_call_details.invocation_metadata or ())
    if metadata.get("authorization") == self._expected:
      return await continuation(handler_call_details)

    async def deny(request, context):
      del request
      await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    handler = await continuation(handler_call_details)
    if handler is not None and handler.request_streaming:
      return grpc.stream_stream_rpc_method_handler(deny) if handler.response_streaming else (
          grpc.stream_unary_rpc_method_handler(deny))
    return grpc.unary_stream_rpc_method_handler(deny) if (
        handler is not None and handler.response_streaming) else grpc.unary_unary_rpc_method_handler(deny)


def check_exposure(config: config_lib.ServerConfig, insecure: bool) -> None:
  """Refuses a non-loopback address without a token or mTLS: the verifier runs submitted code."""
  tls_parts = (config.tls_cert, config.tls_key, config.tls_client_ca)
  if any(tls_parts) and not all(tls_parts):
    raise ValueError("mTLS needs all of --tls-cert, --tls-key and --tls-client-ca")
  if not remote.is_loopback(config.listen) and not config.auth_token and not config.tls and (
      not insecure):
    raise ValueError(f"refusing to listen on {config.listen} without --auth-token-file or mTLS "
                     "(--tls-cert/--tls-key/--tls-client-ca), or --insecure-public: the verifier "
                     "executes submitted code")


def server_credentials(config: config_lib.ServerConfig) -> grpc.ServerCredentials:
  """mTLS credentials: our certificate chain and key, clients must present a certificate."""
  def read(path: pathlib.Path, flag: str) -> bytes:
    try:
      return pathlib.Path(path).read_bytes()
    except OSError as e:
      raise ValueError(f"cannot read {flag} {path}: {e.strerror}") from None
  return grpc.ssl_server_credentials(
      [(read(config.tls_key, "--tls-key"), read(config.tls_cert, "--tls-cert"))],
      root_certificates=read(config.tls_client_ca, "--tls-client-ca"), require_client_auth=True)


class BindError(OSError):
  """The listen address cannot be bound (in use, not an address of this host, unresolvable)."""


def _split_listen(listen: str) -> tuple[str, int]:
  host, sep, port_text = listen.rpartition(":")
  try:
    port = int(port_text)
  except ValueError:
    port = -1
  if not sep or not 0 <= port <= 65535:
    raise BindError(f"cannot bind {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:50051")
  return host.strip("[]"), port


def check_bindable(listen: str, what: str = "--listen") -> None:
  """Raises BindError when no socket can bind `listen` (HOST:PORT) the way the server will.

  Decision: a probe with our own sockets before anything starts, because gRPC reports a failed
  bind only as a RuntimeError plus a C-core log line, after the workers have been started. As
  gRPC does, a host that resolves to several addresses needs only one of them; an address in use
  is always an error. Port 0 (any free port) is not probed.
  """
  host, port = _split_listen(listen)
  if port == 0:
    return
  try:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
  except socket.gaierror as e:
    raise BindError(f"cannot bind {what} {listen}: cannot resolve {host!r} ({e.strerror})") from None
  errors = []
  for family, kind, proto, _, address in infos:
    with socket.socket(family, kind, proto) as sock:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is no conflict
      try:
        sock.bind(address)
      except OSError as e:
        if e.errno == errno.EADDRINUSE:
          raise BindError(f"cannot bind {what} {listen}: address already in use (another server is "
                          "listening there; stop it or choose another port)") from None
        errors.append(e)
  if errors and len(errors) == len(infos):
    raise BindError(f"cannot bind {what} {listen}: {errors[0].strerror}") from None


def ready_line(info: pb.ServerInfo, listen: str, port: int, config: config_lib.ServerConfig,
               insecure: bool) -> str:
  """The one line `serve` prints once it accepts connections."""
  host, _ = _split_listen(listen)
  address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
  if info.gpus:
    gpus = ", ".join(f"GPU {g.index} {g.name} ({g.arch}) x{g.slots} slot{'s' * (g.slots != 1)}"
                     for g in info.gpus)
  elif config.cpu_test_mode:
    gpus = f"no GPU: CPU test mode, {info.running or config.slots_per_gpu} CPU worker slot(s)"
  else:
    gpus = "no GPU: compile-only (verdicts NO_GPU after compiling)"
  if config.tls and config.auth_token:
    auth = "mTLS + bearer token"
  elif config.tls:
    auth = "mTLS"
  elif config.auth_token:
    auth = "bearer token"
  else:
    auth = "none (loopback only)" if remote.is_loopback(listen) else "NONE (--insecure-public)"
  extra = f"; metrics http://0.0.0.0:{config.metrics_port}/metrics" if config.metrics_port else ""
  return (f"dice-verifier: serving on {address}; {gpus}; {info.compile_workers} compile workers; "
          f"auth: {auth}{extra}")


def method_handlers(service: VerifierService) -> dict[str, grpc.RpcMethodHandler]:
  return {
      "Verify": grpc.unary_unary_rpc_method_handler(
          service.Verify, request_deserializer=_decode_request,
          response_serializer=pb.Verdict.SerializeToString),
      "VerifyStream": grpc.stream_stream_rpc_method_handler(
          service.VerifyStream, request_deserializer=_decode_request,
          response_serializer=pb.Verdict.SerializeToString),
      "GetInfo": grpc.unary_unary_rpc_method_handler(
          service.GetInfo, request_deserializer=pb.GetInfoRequest.FromString,
          response_serializer=pb.ServerInfo.SerializeToString),
  }


async def start_server(scheduler: scheduler_lib.Scheduler,
                       insecure: bool = False) -> tuple[grpc.aio.Server, int,
                                                        health.aio.HealthServicer]:
  """Binds and starts the server; returns it, the bound port and its health servicer."""
  config = scheduler.config
  check_exposure(config, insecure)
  interceptors = [_TokenAuth(config.auth_token)] if config.auth_token else []
  limit = 2 * config.max_source_bytes + (256 << 10)
  server = grpc.aio.server(interceptors=interceptors, options=[
      ("grpc.max_receive_message_length", limit),
      ("grpc.max_send_message_length", 16 << 20),
      ("grpc.so_reuseport", 0),
  ])
  service = VerifierService(scheduler)
  server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
      SERVICE_NAME, method_handlers(service)),))
  health_servicer = health.aio.HealthServicer()
  health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
  reflection.enable_server_reflection(
      (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
  try:
    if config.tls:
      port = server.add_secure_port(config.listen, server_credentials(config))
    else:
      port = server.add_insecure_port(config.listen)
  except RuntimeError:  # gRPC's "Failed to bind to address ..."
    port = 0
  if port == 0:
    raise BindError(f"cannot bind --listen {config.listen} (in use, or not an address of this host)")
  await server.start()
  for name in ("", SERVICE_NAME):
    await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
  log.info("listening", extra={"fields": {"listen": config.listen, "port": port,
                                           "mtls": config.tls, "token": bool(config.auth_token)}})
  return server, port, health_servicer


def _stop_on_eof(loop: asyncio.AbstractEventLoop, fd: int, stop: asyncio.Event) -> None:
  """Sets `stop` once `fd` (a pipe whose write end the parent holds) reaches end of file.

  Whatever way the parent ends (exit, crash, SIGKILL), the kernel closes its end of the pipe, so
  a server started for one run cannot outlive it. Unlike PR_SET_PDEATHSIG this is tied to the
  parent *process*, not to the thread that happened to start the child.
  """
  def readable() -> None:
    try:
      data = os.read(fd, 4096)
    except BlockingIOError:
      return
    except OSError:
      data = b""
    if not data:
      loop.remove_reader(fd)
      log.info("standard input closed: the process that started this server is gone")
      stop.set()
  os.set_blocking(fd, False)
  loop.add_reader(fd, readable)


async def serve(config: config_lib.ServerConfig, insecure: bool = False,
                stop_on_stdin_eof: bool = False) -> None:
  """Runs the server until SIGINT/SIGTERM (or, with `stop_on_stdin_eof`, until standard input
  closes), then drains for up to 30 s."""
  import signal  # pylint: disable=import-outside-toplevel
  check_exposure(config, insecure)
  if config.tls:
    server_credentials(config)  # unreadable certificate files: an error now, not after warm-up
  check_bindable(config.listen)
  if config.metrics_port:
    check_bindable(f"0.0.0.0:{config.metrics_port}", "--metrics-port")
  scheduler = scheduler_lib.Scheduler.create(config)
  await scheduler.start()
  server = None
  try:
    server, port, health_servicer = await start_server(scheduler, insecure)
    if config.metrics_port:
      try:
        scheduler.metrics.serve_http(config.metrics_port)
      except OSError as e:
        raise BindError(f"cannot bind --metrics-port {config.metrics_port}: {e.strerror}") from None
  except BaseException:
    if server is not None:
      await server.stop(None)
    await scheduler.stop()
    raise
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGINT, signal.SIGTERM):
    loop.add_signal_handler(sig, stop.set)
  info = await loop.run_in_executor(None, scheduler.info)
  print(ready_line(info, config.listen, port, config, insecure), flush=True)
  if stop_on_stdin_eof:
    _stop_on_eof(loop, sys.stdin.fileno(), stop)
  await stop.wait()
  log.info("shutting down")
  await health_servicer.enter_graceful_shutdown()
  await server.stop(grace=30)
  await scheduler.stop()
