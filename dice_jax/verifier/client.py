"""Async streaming client for a farm of verifier servers (`dice.verifier.v1.Verifier`).

`AsyncVerifierClient.verify(items)` returns one `Verdict` per item, in item order. Underneath:
- One *lane* per (target, stream slot) keeps a `VerifyStream` open with at most
  `max_in_flight_per_stream` requests outstanding. A request waits for a lane of its problem's
  home target (routing.py: rendezvous hashing of the reference, so a problem's group stays on
  the box that holds its caches); a lane with room whose own target has nothing waiting takes the
  requests of a target whose lanes are full, or whose lanes are down, so load still goes to
  whichever server has room and a slow or dead server simply stops taking work.
- A lane whose target is unreachable does not take work: it waits for the channel to become ready
  (bounded by `connect_timeout_s`) and backs off exponentially between tries.
- When a stream breaks (server died, UNAVAILABLE, ...), its outstanding requests go back to the
  queue; so does a request whose verdict is late by `request_timeout_s`, and one answered
  INFRA_ERROR (the server's own failure; ARCHITECTURE.md, "The verifier's trust boundary"). Each
  is re-sent after a backoff, at most `max_attempts` sends in all; then the caller gets an
  INFRA_ERROR verdict that says why. Request ids stay the same across re-sends, so a re-sent
  request the server already finished is answered from its cache, and whichever answer arrives
  first is taken.
- If no target has been reachable for `max_attempts` connection tries, pending requests end with
  INFRA_ERROR ("no verifier reachable") instead of waiting forever.
- Requests go out round-robin over a call's problems (`interleaved`), so that a server's window
  holds many problems at once: its compiler batches one member per problem.
- Verdicts are cached by a content hash of (reference, candidate, options): a repeat, in the same
  batch, a concurrent batch or a later one, never reaches a server. INFRA_ERROR is never cached.
Targets are `HOST:PORT` or any gRPC target URI; `dns:///name:port` targets use round-robin load
balancing over the resolved addresses (give them several `streams_per_target`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import itertools
import logging
import uuid
from collections.abc import Sequence

import grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.verifier import channels
from dice_jax.verifier import routing
from dice_jax.verifier.channels import ClientConfig

Verdict = pb.Verdict
VerifyOptions = pb.VerifyOptions
_log = logging.getLogger(__name__)
# Errors after which a lane stops for good: retrying the same server cannot help.
_FATAL_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.UNIMPLEMENTED)


@dataclasses.dataclass(frozen=True)
class VerifyItem:
  """One (reference, candidate) pair to verify; `options=None` uses the client's defaults."""

  reference_source: str
  candidate_source: str
  options: VerifyOptions | None = None


def interleaved(items: Sequence[VerifyItem]) -> list[int]:
  """The order `verify` sends `items` in: round-robin over their problems (each problem's items
  in their own order). An RL step lists its completions group by group; sent so, a server's
  window holds the first few problems only, and its compiler batches at most one member per
  problem (verifier_service/compile/batch.py); round-robin, it holds every problem of the step
  that fits (64 requests: 16 problems x 4 samples, against 8 x 8)."""
  groups: dict[str, list[int]] = {}
  for i, item in enumerate(items):
    groups.setdefault(item.reference_source, []).append(i)
  return [i for row in itertools.zip_longest(*groups.values()) for i in row if i is not None]


def cache_key(item: VerifyItem, options: VerifyOptions) -> str:
  """sha256 over the reference, the candidate and the options (deterministic serialisation)."""
  h = hashlib.sha256()
  for part in (item.reference_source.encode("utf-8"), item.candidate_source.encode("utf-8"),
               options.SerializeToString(deterministic=True)):
    h.update(len(part).to_bytes(8, "little"))
    h.update(part)
  return h.hexdigest()


def infra_verdict(request_id: str, message: str, stage: pb.Stage = pb.STAGE_QUEUE) -> Verdict:
  """An INFRA_ERROR verdict made on the client (the verifier could not be asked or did not answer)."""
  return Verdict(request_id=request_id, outcome=pb.INFRA_ERROR, stage=stage, message=message)


def _unsendable(item: VerifyItem) -> Verdict | None:
  """A verdict made here for input that cannot go on the wire (protobuf needs valid UTF-8)."""
  for field, outcome in (("reference_source", pb.BAD_REFERENCE), ("candidate_source", pb.REJECTED)):
    text = getattr(item, field)
    if not isinstance(text, str):
      raise TypeError(f"VerifyItem.{field} must be str, got {type(text).__name__}")
    if not text.strip():
      return Verdict(outcome=outcome, stage=pb.STAGE_PARSE, message=f"{field} is empty")
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as e:
      return Verdict(outcome=outcome, stage=pb.STAGE_PARSE,
                     message=f"{field} is not valid UTF-8 text (position {e.start}: {e.reason})")
  return None


@dataclasses.dataclass(eq=False)
class _Job:
  key: str
  request: pb.VerifyRequest
  future: asyncio.Future
  problem: str  # routing.problem_key of the reference
  home: str  # the target it waits for (routing.Router)
  attempts: int = 0
  errors: list[str] = dataclasses.field(default_factory=list)
  failed_on: set[str] = dataclasses.field(default_factory=set)  # targets it failed on


class _Lane:
  """One stream to one target: takes jobs while it has room, matches verdicts by request id."""

  def __init__(self, client: AsyncVerifierClient, target: channels.Target, index: int):
    self.client, self.target, self.name = client, target, f"{target.address}#{index}"
    self.in_flight: dict[str, tuple[_Job, asyncio.TimerHandle]] = {}
    self.connected = False
    self.disabled: str | None = None   # why the lane stopped for good
    self.failures = 0                  # consecutive connection/stream/deadline failures
    self.paused_until = 0.0            # loop time before which the lane takes no new work
    self.last_error = ""

  async def run(self) -> None:
    cfg = self.client.config
    while True:
      if await self.target.ready(cfg.connect_timeout_s):
        code = await self._stream()
        if code in _FATAL_CODES:
          self.disabled = self.last_error
          _log.error("verifier lane %s stopped: %s", self.name, self.disabled)
          self.client._note_failure(self.disabled)
          return
      else:
        self.last_error = f"{self.target.address}: not reachable within {cfg.connect_timeout_s:g}s"
      _log.warning("verifier lane %s: %s", self.name, self.last_error)
      self.failures += 1
      self.client._note_failure(self.last_error)
      self.client._router.wake()  # its target may be down now: others take its problems
      await asyncio.sleep(cfg.backoff_s(self.failures))

  async def _stream(self) -> grpc.StatusCode | None:
    """Serves jobs over one stream until it ends; returns its final status (None: unknown)."""
    call = self.target.stub.VerifyStream(metadata=self.client.metadata)
    slots = asyncio.Semaphore(self.client.config.max_in_flight_per_stream)
    reader = asyncio.create_task(self._read(call, slots))
    writer = asyncio.create_task(self._write(call, slots))
    self.connected = True
    self.client._router.wake()
    code = details = None
    try:
      done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
      # The call's own status is the authority: a failed write or read may report a race
      # (INTERNAL) where the server said UNAUTHENTICATED or UNAVAILABLE.
      code, details = await asyncio.wait_for(asyncio.gather(call.code(), call.details()), 1.0)
    except asyncio.TimeoutError:
      pass
    finally:  # also on cancellation (client closing): nothing is left in flight
      self.connected = False
      self.client._router.wake()
      for task in (writer, reader):
        task.cancel()
      call.cancel()
      await asyncio.gather(writer, reader, return_exceptions=True)
      if code is None:
        errors = [t.exception() for t in (reader, writer) if t.done() and not t.cancelled()]
        other = next((e for e in errors if e is not None), None)
        reason = f"stream failed: {type(other).__name__}: {other}" if other else "stream ended"
      elif code == grpc.StatusCode.OK:
        reason = "stream ended"
      else:
        reason = f"stream failed: {code.name}: {details}"
      self.last_error = f"{self.target.address}: {reason}"
      self._requeue_all(self.last_error)
    return code

  async def _write(self, call, slots: asyncio.Semaphore) -> None:
    cfg, loop = self.client.config, asyncio.get_running_loop()
    while True:
      await slots.acquire()
      if (pause := self.paused_until - loop.time()) > 0:  # requests timed out here: let it recover
        await asyncio.sleep(pause)
      job = await self.client._router.take(self.target.address)
      if job.future.done():  # answered meanwhile (a re-send raced the first answer)
        slots.release()
        continue
      if self.client._better_lane_exists(job, self):  # failed here before: leave it to another target
        self.client._router.put(job)
        slots.release()
        await asyncio.sleep(min(cfg.backoff_initial_s, 0.05))
        continue
      job.attempts += 1
      timer = loop.call_later(cfg.request_timeout_s, self._expire, job, slots)
      self.in_flight[job.request.request_id] = (job, timer)
      self.client._router.wake()  # this lane may be full now: others may take its requests
      self.client.stats["sent"] += 1
      self.client.stats_by_target[self.target.address] += 1
      await call.write(job.request)

  async def _read(self, call, slots: asyncio.Semaphore) -> None:
    while True:
      verdict = await call.read()
      if verdict is grpc.aio.EOF:
        return
      self.failures = 0
      entry = self.in_flight.pop(verdict.request_id, None)
      if entry is not None:
        entry[1].cancel()
        slots.release()
      self.client._on_verdict(verdict, self.target.address)

  def _expire(self, job: _Job, slots: asyncio.Semaphore) -> None:
    if self.in_flight.pop(job.request.request_id, None) is None:
      return
    slots.release()
    cfg = self.client.config
    self.failures += 1
    self.paused_until = asyncio.get_running_loop().time() + cfg.backoff_s(self.failures)
    self.client._retry(job, f"{self.target.address}: no verdict within {cfg.request_timeout_s:g}s",
                      failed_on=self.target.address)

  def _requeue_all(self, reason: str) -> None:
    for job, timer in self.in_flight.values():
      timer.cancel()
      self.client._retry(job, reason, failed_on=self.target.address)
    self.in_flight.clear()


class AsyncVerifierClient:
  """The verifier client for asyncio code. Create and use it inside one event loop."""

  def __init__(self, config: ClientConfig = ClientConfig(), *,
               options: VerifyOptions | None = None, auth_token: str | None = None):
    """`options`: defaults for items without their own; `auth_token` overrides auth_token_file."""
    self.config = config
    self.options = options or VerifyOptions()
    self.metadata = channels.auth_metadata(config, auth_token)
    self._targets = [channels.Target(address, config) for address in config.targets]
    self._router: routing.Router[_Job] = routing.Router(  # jobs waiting for a lane
        [t.address for t in self._targets], self._target_live, self._target_full)
    self._pending: dict[str, _Job] = {}            # cache key -> job being verified
    self._by_id: dict[str, _Job] = {}              # request id -> job being verified
    self._cache: collections.OrderedDict[str, Verdict] = collections.OrderedDict()
    self._session = uuid.uuid4().hex[:12]
    self._ids = itertools.count()
    self._lanes: list[_Lane] = []
    self._tasks: list[asyncio.Task] = []
    self._unreachable_reason = ""
    self._closed = False
    self.stats: collections.Counter[str] = collections.Counter()
    self.stats_by_target: collections.Counter[str] = collections.Counter()

  async def verify(self, items: Sequence[VerifyItem]) -> list[Verdict]:
    """One verdict per item, in order. Never raises for verifier trouble: see INFRA_ERROR."""
    if self._closed:
      raise RuntimeError("the verifier client is closed")
    self._start()
    answers: list[Verdict | asyncio.Future | None] = [None] * len(items)
    for i in interleaved(items):
      item = items[i]
      self.stats["requests"] += 1
      local = _unsendable(item)
      if local is not None:
        answers[i] = local
        continue
      options = item.options if item.options is not None else self.options
      key = cache_key(item, options)
      if key in self._cache:
        self._cache.move_to_end(key)
        self.stats["cache_hits"] += 1
        answers[i] = self._cache[key]
      elif key in self._pending:
        self.stats["deduplicated"] += 1
        answers[i] = self._pending[key].future
      else:
        answers[i] = self._submit(key, item, options).future
    waiting = {a for a in answers if isinstance(a, asyncio.Future) and not a.done()}
    while waiting:
      _, waiting = await asyncio.wait(waiting, timeout=self.config.connect_timeout_s)
      if waiting and self._all_unreachable():
        for job in list(self._by_id.values()):
          if job.future in waiting:
            self._finish(job, infra_verdict(job.request.request_id,
                                            f"no verifier reachable: {self._unreachable_reason}"))
    out = []
    for answer in answers:
      assert answer is not None
      verdict = Verdict()
      verdict.CopyFrom(answer.result() if isinstance(answer, asyncio.Future) else answer)
      out.append(verdict)
    return out

  def stats_snapshot(self) -> dict[str, int]:
    """Counters for logging: requests, cache_hits, deduplicated, sent, retries, infra_errors,
    lane_failures, spilled (taken by a target other than the problem's home because the home's
    lanes were full), and sent/<target> per target."""
    return dict(self.stats, spilled=self._router.spilled) | {
        f"sent/{t}": n for t, n in self.stats_by_target.items()}

  async def info(self) -> dict[str, pb.ServerInfo | str]:
    """Each target's ServerInfo, or the error that kept us from getting it."""
    async def one(target: channels.Target) -> pb.ServerInfo | str:
      try:
        return await target.stub.GetInfo(pb.GetInfoRequest(), metadata=self.metadata,
                                          timeout=self.config.connect_timeout_s)
      except grpc.aio.AioRpcError as e:
        return f"{e.code().name}: {e.details()}"
    results = await asyncio.gather(*(one(t) for t in self._targets))
    return {t.address: r for t, r in zip(self._targets, results)}

  async def close(self) -> None:
    """Stops the lanes; requests still waiting get INFRA_ERROR ("verifier client closed")."""
    self._closed = True
    for task in self._tasks:
      task.cancel()
    await asyncio.gather(*self._tasks, return_exceptions=True)
    self._tasks.clear()
    for job in list(self._by_id.values()):
      self._finish(job, infra_verdict(job.request.request_id, "verifier client closed"))
    await asyncio.gather(*(t.close() for t in self._targets))

  # -- called by the lanes (same module) ------------------------------------------------------

  def _on_verdict(self, verdict: Verdict, target: str) -> None:
    job = self._by_id.get(verdict.request_id)
    if job is None or job.future.done():
      return  # a late answer to a request that was already settled
    if verdict.outcome == pb.INFRA_ERROR:
      self._retry(job, f"verifier INFRA_ERROR: {verdict.message}", verdict, failed_on=target)
    else:
      self._finish(job, verdict)

  def _retry(self, job: _Job, reason: str, verdict: Verdict | None = None,
            failed_on: str | None = None) -> None:
    """Re-queues `job` after a backoff, or settles it as INFRA_ERROR once its sends are used up."""
    if job.future.done():
      return
    job.errors.append(reason)
    if failed_on is not None:
      job.failed_on.add(failed_on)
    if job.attempts >= self.config.max_attempts:
      final = Verdict()
      if verdict is not None:
        final.CopyFrom(verdict)
      else:
        final.CopyFrom(infra_verdict(job.request.request_id, ""))
      final.message = f"after {job.attempts} attempt(s): {'; '.join(job.errors)}"
      self.stats["infra_errors"] += 1
      self._finish(job, final)
      return
    self.stats["retries"] += 1
    delay = self.config.backoff_s(job.attempts)
    asyncio.get_running_loop().call_later(delay, self._router.put, job)

  def _better_lane_exists(self, job: _Job, lane: _Lane) -> bool:
    """Whether `job` failed on `lane`'s target while a connected lane to another target has not."""
    if lane.target.address not in job.failed_on:
      return False
    return any(other.connected and other.disabled is None and other.target.address not in job.failed_on
               for other in self._lanes)

  def _target_live(self, address: str) -> bool:
    """A target with a connected lane, or whose lanes have not failed yet (still connecting)."""
    lanes = [lane for lane in self._lanes if lane.target.address == address]
    return not lanes or any(lane.connected for lane in lanes) or all(
        lane.failures == 0 and lane.disabled is None for lane in lanes)

  def _target_full(self, address: str) -> bool:
    """Every lane of the target connected, with its whole window in flight."""
    lanes = [lane for lane in self._lanes if lane.target.address == address]
    return bool(lanes) and all(
        lane.connected and len(lane.in_flight) >= self.config.max_in_flight_per_stream
        for lane in lanes)

  def _note_failure(self, reason: str) -> None:
    """A lane could not connect or its stream broke."""
    self._unreachable_reason = reason
    self.stats["lane_failures"] += 1

  # -- internals ------------------------------------------------------------------------------

  def _start(self) -> None:
    if self._tasks:
      return
    for target in self._targets:
      for i in range(self.config.streams_per_target):
        lane = _Lane(self, target, i)
        self._lanes.append(lane)
        self._tasks.append(asyncio.create_task(lane.run(), name=f"verifier-lane-{lane.name}"))

  def _submit(self, key: str, item: VerifyItem, options: VerifyOptions) -> _Job:
    request_id = f"{self._session}-{next(self._ids)}"
    request = pb.VerifyRequest(request_id=request_id, reference_source=item.reference_source,
                               candidate_source=item.candidate_source, options=options)
    problem = routing.problem_key(item.reference_source)
    job = _Job(key=key, request=request, future=asyncio.get_running_loop().create_future(),
               problem=problem, home=self._router.home(problem))
    self._pending[key] = job
    self._by_id[request_id] = job
    self._router.put(job)
    return job

  def _finish(self, job: _Job, verdict: Verdict) -> None:
    if job.future.done():
      return
    self._pending.pop(job.key, None)
    self._by_id.pop(job.request.request_id, None)
    if verdict.outcome != pb.INFRA_ERROR and self.config.cache_entries:
      self._cache[job.key] = verdict
      while len(self._cache) > self.config.cache_entries:
        self._cache.popitem(last=False)
    job.future.set_result(verdict)

  def _all_unreachable(self) -> bool:
    return all(lane.disabled is not None
               or (not lane.connected and lane.failures >= self.config.max_attempts)
               for lane in self._lanes)
