"""A real verifier server on loopback, run on its own event loop in a background thread."""

from __future__ import annotations

import asyncio
import os
import threading

import grpc

from dice.verifier.v1 import verifier_pb2_grpc

from verifier_service.compile import toolchain as toolchain_lib
from verifier_service.service import config as config_lib
from verifier_service.service import scheduler as scheduler_lib


def make_config(cache_dir, **overrides) -> config_lib.ServerConfig:
  """Small, test-sized settings on a free loopback port. The program cache is off (tests send the
  same candidate under new ids to run it again); test_verifier_text_key.py turns it on.
  DICE_VERIFIER_COMPILE_SPLIT=1 runs a suite with the compile stage's split path on (its servers
  then start serving once the split is ready), to check verdicts through it;
  DICE_VERIFIER_JUDGE_JOBS=N with judges kept for N jobs (worker/process.py; 1: a judge per
  job)."""
  base = dict(listen="127.0.0.1:0", cache_dir=cache_dir, compile_workers=2, queue_capacity=64,
              run_timeout_s=60.0, compile_timeout_s=600.0, timing_trials=5, program_cache_size=0,
              compile_split=os.environ.get("DICE_VERIFIER_COMPILE_SPLIT") == "1")
  if os.environ.get("DICE_VERIFIER_JUDGE_JOBS"):  # else the server's default
    base["judge_jobs"] = int(os.environ["DICE_VERIFIER_JUDGE_JOBS"])
  base.update(overrides)
  return config_lib.ServerConfig(**base)


class ServerThread:
  """Starts `server.start_server` on 127.0.0.1:<free port>; `stop()` shuts it down.

  With `grpc_server=False` only the scheduler runs (GPU tests call `verify` directly; the GPU
  image has no grpcio-health-checking unless carried).
  """

  def __init__(self, config: config_lib.ServerConfig, toolchain: toolchain_lib.Toolchain,
               grpc_server: bool = True):
    self.config = config
    self.server = None
    self._grpc_server = grpc_server
    self.loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self._thread.start()
    self.scheduler = scheduler_lib.Scheduler.create(config, toolchain)
    self.port = self.call(self._start(), timeout=600)
    self.target = f"127.0.0.1:{self.port}"

  async def _start(self) -> int:
    await self.scheduler.start()
    if self.config.compile_split:
      if not await self.scheduler.compiler.split_ready():
        raise RuntimeError("DICE_VERIFIER_COMPILE_SPLIT=1, but the split path cannot serve here")
    if not self._grpc_server:
      return 0
    from verifier_service.service import server as server_lib  # pylint: disable=import-outside-toplevel
    self.server, port, _ = await server_lib.start_server(self.scheduler)
    return port

  def verify(self, request, timeout: float = 3600):
    """Runs one request through the scheduler (no gRPC)."""
    return self.call(self.scheduler.verify(request), timeout)

  def call(self, coro, timeout: float = 600):
    return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

  def channel(self, **options) -> grpc.Channel:
    return grpc.insecure_channel(self.target, options=list(options.items()))

  def stub(self) -> verifier_pb2_grpc.VerifierStub:
    return verifier_pb2_grpc.VerifierStub(self.channel())

  def stop(self) -> None:
    async def _stop():
      if self.server is not None:
        await self.server.stop(grace=1)
      await self.scheduler.stop()
    self.call(_stop(), timeout=60)
    self.loop.call_soon_threadsafe(self.loop.stop)
    self._thread.join(timeout=10)
