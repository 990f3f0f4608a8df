"""Fault-injecting verifier servers for the client's unit tests (a test double of the network).

They speak the real `dice.verifier.v1` wire protocol on loopback but decide verdicts by trivial
rules, so a test can make a server slow, flaky (INFRA_ERROR), dying mid-batch or strict about its
bearer token. The real server is exercised in test_rewards_verifier_integration.py.
"""

from __future__ import annotations

import asyncio
import collections
import socket

import grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc as pb_grpc
from dice_jax.verifier.sync_client import background_loop


class FakeVerifier(pb_grpc.VerifierServicer):
  """Answers OK (INCORRECT when the candidate contains "INCORRECT"), with `message` = its name.

  delay_s: wait before each answer.  infra_first: answer INFRA_ERROR the first N times an id is
  seen.  die_after: on the N-th request, stop the whole server without answering.
  require_token: reject streams without `authorization: Bearer <token>`.
  """

  def __init__(self, name: str, *, delay_s: float = 0.0, infra_first: int = 0,
               die_after: int | None = None, require_token: str | None = None):
    self.name, self.delay_s, self.infra_first = name, delay_s, infra_first
    self.die_after, self.require_token = die_after, require_token
    self.seen: collections.Counter[str] = collections.Counter()
    self.metadata: list[dict[str, str]] = []
    self.server: grpc.aio.Server | None = None
    self.port = 0

  def _verdict(self, request: pb.VerifyRequest) -> pb.Verdict:
    if self.seen[request.request_id] <= self.infra_first:
      return pb.Verdict(request_id=request.request_id, outcome=pb.INFRA_ERROR, stage=pb.STAGE_LOAD,
                        message=f"{self.name}: worker died")
    outcome = pb.INCORRECT if "INCORRECT" in request.candidate_source else pb.OK
    return pb.Verdict(request_id=request.request_id, outcome=outcome, stage=pb.STAGE_DONE,
                      message=self.name, compile=pb.CompileResult(compiled=True),
                      attempts=self.seen[request.request_id])

  async def VerifyStream(self, request_iterator, context):
    self.metadata.append(dict(context.invocation_metadata()))
    if self.require_token and self.metadata[-1].get("authorization") != f"Bearer {self.require_token}":
      await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
    lock, tasks = asyncio.Lock(), set()

    async def answer(request):
      await asyncio.sleep(self.delay_s)
      async with lock:
        await context.write(self._verdict(request))

    async for request in request_iterator:
      self.seen[request.request_id] += 1
      if self.die_after is not None and sum(self.seen.values()) >= self.die_after:
        asyncio.get_running_loop().create_task(self.server.stop(0))
        await asyncio.sleep(3600)
      tasks.add(asyncio.create_task(answer(request)))
    await asyncio.gather(*tasks)

  async def GetInfo(self, request, context):
    return pb.ServerInfo(server_version=self.name)

  async def start(self, credentials: grpc.ServerCredentials | None = None) -> str:
    self.server = grpc.aio.server()
    pb_grpc.add_VerifierServicer_to_server(self, self.server)
    if credentials is None:
      self.port = self.server.add_insecure_port("127.0.0.1:0")
    else:
      self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
    await self.server.start()
    return f"127.0.0.1:{self.port}"

  async def stop(self) -> None:
    if self.server is not None:
      await self.server.stop(0)


def free_port() -> int:
  """A loopback port nothing listens on (bound and released)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run(coro, timeout_s: float = 60.0):
  """Runs `coro` on the loop the sync client uses (one loop per process: see background_loop)."""
  return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout_s), background_loop()).result()
