"""Compiler processes for the compile stage: a bounded pool that serves the earliest request first.

Every compiler process (g++, nvcc, or one of nvcc's steps) takes a slot; at most `max_jobs` run at
once. A freed slot goes to the waiting process of the request that arrived first (its build's
priority), not to whichever asked first: with many candidates in flight, each one finishes as
early as it can instead of all of them crawling forward together, so latency under load stays
close to the queueing delay plus one build, at the same throughput.

Processes run in their own process group; a cancelled request (deadline, client gone) kills it.

Each process run while a build's `STEPS` trace is set is recorded there (what ran, when it
started relative to the build, how long it waited for a slot and ran): BuildResult.steps, so a
build's critical path can be read from its record.

Decision: compilers run at a lower CPU priority (`nice`, default +10) than the server and the GPU
workers. A burst of candidates keeps every core compiling, and the run stage (a job child's
Python, its kernel launches, its timed loop) must not queue behind them for CPU: GPU slots stay
busy and timings stay undisturbed, while compilers still get every cycle nobody else wants.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import fcntl
import heapq
import itertools
import os
import pathlib
import shlex
import shutil
import signal
import time
from typing import AsyncIterator

# Priority of the build the current task works for: lower runs first. Shared artefacts that every
# build waits for (precompiled header, header environment) run at -1.
PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar("compile_priority", default=0)


@dataclasses.dataclass
class Trace:
  """The processes one build ran: `steps` holds {step, start_s, queued_s, wall_s} dicts, times in
  seconds from `start`."""
  start: float = dataclasses.field(default_factory=time.monotonic)
  steps: list[dict] = dataclasses.field(default_factory=list)

  def add(self, step: str, asked: float, began: float, ended: float) -> None:
    self.steps.append({"step": step, "start_s": round(began - self.start, 3),
                       "queued_s": round(began - asked, 3), "wall_s": round(ended - began, 3)})


# The trace of the build the current task works for (None: not traced). Tasks a build starts
# inherit it, so a build's nvcc steps, main.cpp and link all land in one list.
STEPS: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("compile_steps", default=None)


def step_name(argv: list[str]) -> str:
  """A short name for a compiler process: its tool, or the tools of a shell script's lines."""
  if len(argv) >= 3 and os.path.basename(argv[0]) == "sh" and argv[1] == "-c":
    tools = []
    for line in argv[2].splitlines():
      words = line.split()
      if words and words[0] not in ("set", "export"):
        tools.append(os.path.basename(words[0].strip('"')))
    return "+".join(tools)
  name = os.path.basename(argv[0])
  sources = [os.path.basename(a) for a in argv[1:] if a.endswith((".cpp", ".cu", ".so"))]
  return " ".join([name] + sources[-1:])


class ProcessFailed(Exception):
  """A compiler exited non-zero (or was killed); `log` is what it printed."""

  def __init__(self, log_text: str):
    super().__init__(log_text[-200:])
    self.log = log_text


class Slots:
  """A semaphore whose waiters are served lowest priority value first (FIFO among equals)."""

  def __init__(self, count: int):
    self._free = count
    self._waiting: list[tuple[int, int, asyncio.Future]] = []
    self._order = itertools.count()

  @contextlib.asynccontextmanager
  async def hold(self, priority: int) -> AsyncIterator[None]:
    if self._free > 0 and not self._waiting:
      self._free -= 1
    else:
      granted = asyncio.get_running_loop().create_future()
      heapq.heappush(self._waiting, (priority, next(self._order), granted))
      try:
        await granted
      except asyncio.CancelledError:
        if granted.done() and not granted.cancelled():
          self._release()  # granted just as we were cancelled: pass the slot on
        else:
          granted.cancel()  # skipped when popped
        raise
    try:
      yield
    finally:
      self._release()

  def _release(self) -> None:
    while self._waiting:
      _, _, granted = heapq.heappop(self._waiting)
      if not granted.done():
        granted.set_result(None)
        return
    self._free += 1


def nice_prefix(level: int, env: dict[str, str]) -> list[str]:
  """argv prefix running a command at `level` (none if 0 or `nice` is not on env's PATH)."""
  nice = shutil.which("nice", path=env.get("PATH")) if level else None
  return [nice, "-n", str(level)] if nice else []


class ProcessRunner:
  """Runs compiler processes within the slot pool."""

  def __init__(self, max_jobs: int, env: dict[str, str], nice: int = 10):
    self.max_jobs = max_jobs
    self._env = env
    self._slots = Slots(max_jobs)
    self._prefix = nice_prefix(nice, env)

  async def run(self, argv: list[str], cwd: pathlib.Path, echo: bool = True,
                step: str = "") -> tuple[int, str]:
    """Return code and combined output; a failure's output starts with the command (`echo`).
    `step` names the process in the build's trace (default: `step_name`)."""
    asked = time.monotonic()
    async with self._slots.hold(PRIORITY.get()):
      began = time.monotonic()
      # Shielded: a cancel that lands while the process is being created still reaps it.
      spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
          *self._prefix, *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE,
          stderr=asyncio.subprocess.STDOUT,
          stdin=asyncio.subprocess.DEVNULL, env=self._env, start_new_session=True))
      try:
        proc = await asyncio.shield(spawn)
        output, _ = await proc.communicate()
      except asyncio.CancelledError:
        try:
          proc = await spawn
        except Exception:  # pylint: disable=broad-except  (it never started)
          raise asyncio.CancelledError() from None
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        await proc.wait()
        # Read to EOF so the pipe transport closes now, not when collected after the loop ends.
        with contextlib.suppress(asyncio.TimeoutError):
          await asyncio.wait_for(proc.stdout.read(), 5)
        raise
      trace = STEPS.get()
      if trace is not None:
        trace.add(step or step_name(argv), asked, began, time.monotonic())
    text = output.decode("utf-8", "replace")
    if proc.returncode != 0 and echo:
      text = f"$ {shlex.join(argv)}\n{text}"
    return proc.returncode, text


@contextlib.asynccontextmanager
async def file_lock(path: pathlib.Path) -> AsyncIterator[None]:
  """An exclusive lock shared with other servers on the same cache folder (polls, never blocks
  the event loop)."""
  with open(path, "w") as handle:
    while True:
      try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        await asyncio.sleep(0.5)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)
