"""One task per key, shared by every caller that asks for the same key while it runs.

Two requests for the same candidate compile it once; a resent request id joins the run already
under way. Cancellation is reference-counted: a caller whose deadline expires stops waiting, and
the shared task itself is cancelled (killing its compiler processes) only when no caller is left.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
  """Deduplicates concurrent coroutines by key."""

  def __init__(self) -> None:
    self._tasks: dict[Hashable, asyncio.Task[T]] = {}
    self._waiters: dict[Hashable, int] = {}

  def __len__(self) -> int:
    return len(self._tasks)

  def __contains__(self, key: Hashable) -> bool:
    return key in self._tasks

  async def run(self, key: Hashable, factory: Callable[[], Awaitable[T]]) -> T:
    """Awaits the task for `key`, starting it with `factory()` if none is running."""
    task = self._tasks.get(key)
    if task is None:
      task = asyncio.ensure_future(factory())
      self._tasks[key] = task
      self._waiters[key] = 0
      task.add_done_callback(functools.partial(self._forget, key))
    self._waiters[key] += 1
    try:
      return await asyncio.shield(task)
    finally:
      if self._tasks.get(key) is task:
        self._waiters[key] -= 1
        if self._waiters[key] == 0 and not task.done():
          task.cancel()

  def _forget(self, key: Hashable, task: asyncio.Task[Any]) -> None:
    if self._tasks.get(key) is task:
      del self._tasks[key]
      self._waiters.pop(key, None)
    if not task.cancelled():
      task.exception()  # mark retrieved: every waiter already saw it
