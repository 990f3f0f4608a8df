"""`VerifierClient`: the verifier client for ordinary (non-async) code, such as the training loop.

The async client runs on a process-wide event loop in a daemon thread. `submit` returns a
`concurrent.futures.Future` at once, which is how the trainer overlaps verification of step k
with the rollout of step k+1 (ARCHITECTURE.md, "From prompt to gradient"); `verify_batch` is
submit-and-wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.verifier.client import AsyncVerifierClient, ClientConfig, Verdict, VerifyItem, VerifyOptions


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
  """The process-wide event loop, on a daemon thread, that every `VerifierClient` runs on.

  Started on first use and never closed: grpc.aio keeps process-global state tied to the loops it
  has served, and a closed loop makes later calls fail. Other grpc.aio objects that must coexist
  with the facade (an in-process server in a test, say) can run here too.
  """
  global _loop
  with _loop_lock:
    if _loop is None:
      _loop = asyncio.new_event_loop()
      threading.Thread(target=_loop.run_forever, name="dice-grpc-loop", daemon=True).start()
    return _loop


class VerifierClient:
  """Thread-safe, blocking-or-future facade over `AsyncVerifierClient`. Close it (or use `with`)."""

  def __init__(self, config: ClientConfig = ClientConfig(), *, options: VerifyOptions | None = None,
               auth_token: str | None = None):
    self.config = config
    self._loop = background_loop()

    async def make() -> AsyncVerifierClient:  # grpc.aio channels belong to the loop they are made in
      return AsyncVerifierClient(config, options=options, auth_token=auth_token)

    self._client = asyncio.run_coroutine_threadsafe(make(), self._loop).result()
    self._closed = False

  def submit(self, items: Sequence[VerifyItem]) -> concurrent.futures.Future[list[Verdict]]:
    """Starts verifying `items` and returns a future of their verdicts (in item order)."""
    if self._closed:
      raise RuntimeError("VerifierClient is closed")
    return asyncio.run_coroutine_threadsafe(self._client.verify(list(items)), self._loop)

  def verify_batch(self, items: Sequence[VerifyItem], timeout_s: float | None = None) -> list[Verdict]:
    """The verdicts of `items`, in order; waits at most `timeout_s` (None: as long as it takes)."""
    return self.submit(items).result(timeout=timeout_s)

  def info(self) -> dict[str, pb.ServerInfo | str]:
    """Each target's ServerInfo, or the error that kept us from getting it."""
    return asyncio.run_coroutine_threadsafe(self._client.info(), self._loop).result()

  def stats(self) -> dict[str, int]:
    """The client's counters (see `AsyncVerifierClient.stats_snapshot`)."""
    async def snapshot() -> dict[str, int]:
      return self._client.stats_snapshot()
    return asyncio.run_coroutine_threadsafe(snapshot(), self._loop).result()

  def close(self) -> None:
    """Cancels outstanding work (its futures get INFRA_ERROR verdicts) and closes the channels."""
    if self._closed:
      return
    self._closed = True
    asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result()

  def __enter__(self) -> VerifierClient:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
