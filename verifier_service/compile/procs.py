"""Compiler processes for the compile stage: a bounded pool that serves the earliest request first.

Every compiler process (g++, nvcc, or one of nvcc's steps) takes a slot; at most `max_jobs` run at
once. A freed slot goes to the waiting process of the request that arrived first (its build's
priority), not to whichever asked first: with many candidates in flight, each one finishes as
early as it can instead of all of them crawling forward together, so latency under load stays
close to the queueing delay plus one build, at the same throughput.

Processes run in their own process group; a cancelled request (deadline, client gone) kills it.
With a `confine.Confinement` (the compiler always has one), each runs through its exec wrapper:
sandboxed (unless the server is unconfined) and bounded (limits.py), in a cgroup of its own where
the host has them, and its output is read back up to `Limits.output_bytes`. A command that went
over a bound raises `LimitExceeded`; one the wrapper could not confine raises
`confine.ConfinementError`. Output is returned as the tool printed it (dry runs, include traces
and macro lists are read by our code); what becomes a build's log is cleaned where the log is
made (objects.py, diagnostics.py).

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

from verifier_service.compile import confine as confine_lib
from verifier_service.compile import limits as limits_lib

# Priority of the build the current task works for: lower runs first. Shared artefacts that every
# build waits for (precompiled header, header environment) run at -1.
PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar("compile_priority", default=0)


@dataclasses.dataclass
class Trace:
  """The processes one build ran: `steps` holds {step, start_s, queued_s, wall_s, cpu_s, what}
  dicts, times in seconds from `start`; `cpu_s` is the process tree's user + system time as the
  exec wrapper measured it (absent where there is no wrapper, or it was killed); `what` is WHAT's
  value (absent when empty); `cancelled` is True for a process stopped because its result was no
  longer needed (a concurrent chain's, after the other failed)."""
  start: float = dataclasses.field(default_factory=time.monotonic)
  steps: list[dict] = dataclasses.field(default_factory=list)

  def add(self, step: str, asked: float, began: float, ended: float,
          cpu_s: float | None = None, cancelled: bool = False) -> None:
    self.steps.append({"step": step, "start_s": round(began - self.start, 3),
                       "queued_s": round(began - asked, 3), "wall_s": round(ended - began, 3),
                       **({"cpu_s": round(cpu_s, 3)} if cpu_s is not None else {}),
                       **({"what": WHAT.get()} if WHAT.get() else {}),
                       **({"cancelled": True} if cancelled else {})})


# What the processes the current task runs compile, when not the build's own translation unit
# ("batch": a batch's), recorded with each step.
WHAT: contextvars.ContextVar[str] = contextvars.ContextVar("compile_what", default="")

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


class LimitExceeded(ProcessFailed):
  """A compiler process went over a bound (`limit`): the source's doing, final for its build
  (no lighter tier, batch or split compile changes what the source asks of the compiler)."""

  def __init__(self, limit: limits_lib.Limit, log_text: str):
    super().__init__(log_text)
    self.limit = limit


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

  def __init__(self, max_jobs: int, env: dict[str, str], nice: int = 10,
               confinement: confine_lib.Confinement | None = None):
    self.max_jobs = max_jobs
    self.confinement = confinement
    self._env = confinement.env if confinement is not None else env
    self._slots = Slots(max_jobs)
    self._nice = nice
    wrapped = confinement is not None and confinement.wrapper is not None
    self._prefix = [] if wrapped else nice_prefix(nice, env)

  @property
  def env(self) -> dict[str, str]:
    """The environment compiler processes get (the allow-list when confined)."""
    return self._env

  def slot(self) -> contextlib.AbstractAsyncContextManager[None]:
    """One compiler slot, held for a process run elsewhere (a warm front end's child)."""
    return self._slots.hold(PRIORITY.get())

  async def run(self, argv: list[str], cwd: pathlib.Path, echo: bool = True,
                step: str = "", reads: tuple[str, ...] = (), shared: bool = False
                ) -> tuple[int, str]:
    """Return code and combined output; a failure's output starts with the command (`echo`). `step` names the process in the build's trace (default: `step_name`); `reads`:
    files outside `cwd` it may read; `shared`: a build of the server's own headers. Raises
    LimitExceeded (over a bound) and confine.ConfinementError (not confined)."""
    asked = time.monotonic()
    async with self._slots.hold(PRIORITY.get()):
      began = time.monotonic()
      trace = STEPS.get()
      try:
        rc, text, limit, cpu_s = await self._spawn(argv, cwd, reads, shared)
      except asyncio.CancelledError:  # stopped (killed) once it was not needed: it still ran
        if trace is not None:
          trace.add(step or step_name(argv), asked, began, time.monotonic(), cancelled=True)
        raise
      if trace is not None:
        trace.add(step or step_name(argv), asked, began, time.monotonic(), cpu_s)
    if rc != 0 and echo:
      text = f"$ {shlex.join(argv)}\n{text}"
    if limit is not None:
      limits = self.confinement.limits.shared() if shared else self.confinement.limits
      raise LimitExceeded(limit, f"{limits.message(limit)}\n{text}")
    return rc, text

  async def _spawn(self, argv: list[str], cwd: pathlib.Path, reads: tuple[str, ...],
                   shared: bool) -> tuple[int, str, limits_lib.Limit | None, float | None]:
    """Runs one command to its end: (return code, raw output, the bound it went over, the CPU
    seconds the wrapper measured or None)."""
    confinement = self.confinement
    wrapped = confinement is not None and confinement.wrapper is not None
    cap = confinement.limits.output_bytes if confinement is not None else None  # never raised
    report_r, report_w = os.pipe() if wrapped else (-1, -1)
    limits = None if confinement is None else (
        confinement.limits.shared() if shared else confinement.limits)
    groups: contextlib.AbstractAsyncContextManager[list] = (
        confinement.cgroups.group(limits) if wrapped and confinement.cgroups is not None
        else contextlib.nullcontext([]))
    try:
      async with groups as folders:
        full = (confinement.argv(argv, rw=cwd, reads=reads, nice=self._nice,
                                 report_fd=report_w, cgroups=folders, shared=shared)
                if wrapped else [*self._prefix, *argv])
        # Shielded: a cancel that lands while the process is being created still reaps it.
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *full, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, env=self._env, start_new_session=True,
            pass_fds=(report_w,) if wrapped else ()))
        try:
          proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
          await _reap(spawn)
          raise
        finally:
          if wrapped:
            os.close(report_w)
            report_w = -1
        try:
          output, over = await _read_capped(proc, cap)
        except asyncio.CancelledError:
          await _reap(spawn)
          raise
        events = (confinement.cgroups.exceeded(folders)
                  if wrapped and confinement.cgroups is not None and folders else None)
      usage = limits_lib.Usage.parse(_read_report(report_r)) if wrapped else None
    finally:
      for fd in (report_r, report_w):
        if fd >= 0:
          os.close(fd)
    text = output.decode("utf-8", "replace")
    if usage is not None and usage.setup:
      raise confine_lib.ConfinementError(f"could not confine {step_name(argv)}: {usage.setup}")
    limit = None
    if over:
      limit = limits_lib.Limit.OUTPUT
    elif proc.returncode != 0 and confinement is not None:
      limit = limits_lib.exceeded(usage, text, limits, events)
    return proc.returncode, text, limit, (usage.cpu_s if usage is not None else None)


async def _reap(spawn: asyncio.Future) -> None:
  """Kills a spawned process's group and waits for it (a cancelled run)."""
  try:
    proc = await spawn
  except Exception:  # pylint: disable=broad-except  (it never started)
    return
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  # Read to EOF, then wait (as in _read_capped).
  with contextlib.suppress(asyncio.TimeoutError):
    await asyncio.wait_for(proc.stdout.read(), 5)
  await proc.wait()


async def _read_capped(proc: asyncio.subprocess.Process, cap: int | None) -> tuple[bytes, bool]:
  """The process's output up to `cap` bytes, and whether it printed more (then its group is
  killed: a compiler printing without end is bounded here, not in the server's memory)."""
  chunks, size = [], 0
  while True:
    chunk = await proc.stdout.read(1 << 16)
    if not chunk:
      break
    size += len(chunk)
    if cap is not None and size > cap:
      chunks.append(chunk[:len(chunk) - (size - cap)])
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
      # To EOF, then wait: asyncio (3.11) answers wait() only once every pipe of the process
      # has closed, and stops reading a pipe whose unread data passed the stream's limit, so
      # waiting first on a process that filled its pipe never returns.
      with contextlib.suppress(asyncio.TimeoutError):
        while await asyncio.wait_for(proc.stdout.read(1 << 16), 5):
          pass
      await proc.wait()
      return b"".join(chunks), True
    chunks.append(chunk)
  await proc.wait()
  return b"".join(chunks), False


def _read_report(fd: int) -> str:
  """The wrapper's report line (written before it exited; empty if it was killed)."""
  try:
    os.set_blocking(fd, False)
    return os.read(fd, 4096).decode("utf-8", "replace")
  except OSError:
    return ""


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
