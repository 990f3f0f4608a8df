"""Which verifier target gets a request: its problem's home box first, the least loaded when that is full.

A verifier box keeps per-problem state warm: the compile cache of the problem's scaffold, its
verdicts by program (comments and layout aside), and, as the farm grows, the problem's reference
work. So every request of one problem goes to one *home* target, picked by rendezvous hashing of
the problem's reference over the target list: every trainer host computes the same home, a
problem's group never splits across boxes while its home keeps up, and adding or removing one
target moves only the problems whose home it was.

Spill: a lane (one stream to one target, client.py) with room takes, in order,
  1. requests whose home target is down (none of its lanes connected after trying),
  2. requests of its own target,
  3. requests waiting for the busiest other target whose lanes are connected and all full (each
     has its window of requests in flight): the box with room is the less loaded one.
So a step whose problems hash unevenly still uses every box, and a dead box's problems move at
once. A request that failed on its home is re-homed to the next target in its rendezvous order.

Decision: rendezvous (highest random weight) hashing, not a ring: no virtual nodes to tune for the
handful of boxes a farm has, and the order of the remaining targets is the re-homing order.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Callable, Iterable, Set as AbstractSet
from typing import Generic, Protocol, TypeVar


class Routed(Protocol):
  home: str
  problem: str
  failed_on: set[str]


J = TypeVar("J", bound=Routed)


def rendezvous(problem: str, targets: Iterable[str]) -> list[str]:
  """`targets` in the order a problem prefers them (highest sha256 of target + problem first)."""
  score = lambda t: hashlib.sha256(f"{t}\0{problem}".encode()).digest()
  return sorted(targets, key=score, reverse=True)


def problem_key(reference_source: str) -> str:
  return hashlib.sha256(reference_source.encode("utf-8")).hexdigest()


class Router(Generic[J]):
  """Per-target queues of requests waiting for a lane, and the rule lanes take them by."""

  def __init__(self, targets: Iterable[str], live: Callable[[str], bool],
               full: Callable[[str], bool]):
    """`live(target)`: it has a connected lane or is still connecting for the first time;
    `full(target)`: its lanes are connected and each has its window in flight. The lanes call
    `wake` when either may have changed."""
    self._queues: dict[str, collections.deque[J]] = {t: collections.deque() for t in targets}
    self._live, self._full = live, full
    self._signal: asyncio.Future | None = None
    self.spilled = 0

  def __len__(self) -> int:
    return sum(len(q) for q in self._queues.values())

  def home(self, problem: str, avoid: AbstractSet[str] = frozenset()) -> str:
    """The first target of the problem's order that is live and not in `avoid` (else the first
    not in `avoid`, else the first)."""
    order = rendezvous(problem, self._queues)
    for ok in (lambda t: t not in avoid and self._live(t), lambda t: t not in avoid,
               lambda t: True):
      for target in order:
        if ok(target):
          return target
    raise ValueError("no targets")

  def put(self, job: J) -> None:
    """Queues `job` at its home (re-homed first when it already failed there)."""
    if job.home in job.failed_on:
      job.home = self.home(job.problem, job.failed_on)
    self._queues[job.home].append(job)
    self.wake()

  def wake(self) -> None:
    """Lets waiting lanes look again: work arrived, or a target's state changed (connected,
    failed, full: what decides where a request may go)."""
    if self._signal is not None and not self._signal.done():
      self._signal.set_result(None)
    self._signal = None

  def _pop(self, target: str) -> J | None:
    down = [t for t, q in self._queues.items() if q and t != target and not self._live(t)]
    if down:
      return self._queues[down[0]].popleft()
    if self._queues[target]:
      return self._queues[target].popleft()
    full = [t for t, q in self._queues.items() if q and t != target and self._full(t)]
    if full:
      self.spilled += 1
      return self._queues[max(full, key=lambda t: len(self._queues[t]))].popleft()
    return None

  async def take(self, target: str) -> J:
    """The next request for a lane of `target` (waits until there is one)."""
    while True:
      job = self._pop(target)
      if job is not None:
        return job
      if self._signal is None:
        self._signal = asyncio.get_running_loop().create_future()
      await asyncio.shield(self._signal)
