"""Server side of the GPU worker processes: N slots per GPU, each one `worker/process.py` process.

A slot runs one job at a time. It enforces the run stage's time limit by killing the process
groups of the job's two children (the judge and the candidate's process; the worker stays up),
and it replaces the worker process itself when that dies or stops answering. What it returns is
the Verdict-shaped dict the worker merged from both children (trusted/verdict.py classifies how
they ended); two failures only the pool can see are classified here:

  - time limit hit                      TIMEOUT (exploit HANG) in the stage the judge was in
The time limit is the judge's latest budget for the stretch it is in (run/budget.py: scaled to the
reference's measured time and then to the candidate's own pace), never beyond `timeout_s` from
the job's start; the TIMEOUT's message says which limit it was and how it was made.
  - worker process died or hung         INFRA_ERROR; the slot restarts its worker
Exploits already found (including system calls the sandbox refused) stay on a TIMEOUT verdict,
and `exploits.apply_policy` decides its outcome.

Each slot's worker gets an allow-listed environment (no tokens or keys: its /proc/self/environ is
what candidate code could read) and, when the server runs as root, its own sandbox uid
(`sandbox_uid_base` + slot number), so concurrent candidates cannot touch each other's files.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import pathlib
import secrets
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Callable

from verifier_service import enums
from verifier_service.run import envelope
from verifier_service.trusted import exploits
from verifier_service.worker import job_process

log = logging.getLogger(__name__)
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH", "CUDA_",
             "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH_", "LD_LIBRARY_PATH", "OMP_", "OPENBLAS_",
             "MKL_", "TRITON_")

_READY_TIMEOUT_S = 300.0
_KILL_GRACE_S = 15.0
_CLOSE_GRACE_S = 5.0
_STREAM_LIMIT = 64 << 20


class WorkerDied(Exception):
  """The worker process (not just a job's child) went away."""


class WorkerSlot:
  """One worker process bound to one device."""

  def __init__(self, name: str, device: str, env: dict[str, str],
               sandbox: dict[str, Any] | None = None):
    self.name = name
    self.device = device
    self.unit = name.split("/")[0]  # the GPU (or "cpu") this slot shares with its siblings
    self._env = {k: v for k, v in env.items() if k.startswith(_ENV_KEEP)}
    self.sandbox = sandbox or {"enabled": False}
    self._proc: asyncio.subprocess.Process | None = None
    self._folder_tag = ""  # in the names of the running worker's job folders (worker/pair.py)
    self.info: dict[str, Any] = {}
    self.jobs_run = 0
    self.restarts = 0
    self.running: str | None = None  # the job id whose processes have started, until it ends
    # Called with each "reaped" message (a finished job's processes' CPU, worker/process.py): the
    # worker sends it when they exit, often after the job's "done"; it is read with the next job.
    self.on_reaped: Callable[[dict[str, Any]], None] | None = None

  async def start(self) -> None:
    self._folder_tag = secrets.token_hex(4)
    self._proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "verifier_service.worker", "--device", self.device,
        "--sandbox", json.dumps(dict(self.sandbox, folder_tag=self._folder_tag)),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=self._env,
        limit=_STREAM_LIMIT, start_new_session=True)
    try:
      message = await asyncio.wait_for(self._read(), _READY_TIMEOUT_S)
    except (asyncio.TimeoutError, WorkerDied) as e:
      await self.stop()
      raise WorkerDied(f"worker {self.name} did not start: {e}") from e
    if message.get("type") != "ready":
      await self.stop()
      raise WorkerDied(f"worker {self.name} sent {message} instead of ready")
    self.info = message
    layers = message.get("sandbox", {})
    off = {k: v for k, v in layers.items() if not str(v).startswith("on")}
    log.info("worker %s ready (pid %s, %s), sandbox %s", self.name, message["pid"], self.device,
             layers)
    if off and self.sandbox.get("enabled"):
      log.warning("worker %s runs candidates with sandbox layers off: %s", self.name, off)

  async def stop(self) -> None:
    """Kills the worker and removes the job folders it left (a worker killed at once, on a
    failure path or after the close's grace, cannot remove its pairs' folders itself)."""
    proc, self._proc = self._proc, None
    if proc is None:
      return
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
    await asyncio.to_thread(_remove_job_folders, self._env.get("TMPDIR"), self._folder_tag)

  async def close(self) -> None:
    """The server's stop: end of file on the worker's stdin, so that it discards its next job's
    pair (its processes exit, its folders go); killed after _CLOSE_GRACE_S."""
    proc = self._proc
    if proc is not None and proc.returncode is None and proc.stdin is not None:
      with contextlib.suppress(OSError, RuntimeError):
        proc.stdin.close()
      with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), _CLOSE_GRACE_S)
    await self.stop()

  async def restart(self) -> None:
    self.restarts += 1
    await self.stop()
    await self.start()

  async def _read(self) -> dict[str, Any]:
    assert self._proc is not None and self._proc.stdout is not None
    line = await self._proc.stdout.readline()
    if not line:
      raise WorkerDied(f"worker {self.name} exited (code {self._proc.returncode})")
    return json.loads(line)

  async def run(self, job: envelope.Job, timeout_s: float,
                on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs one job; always returns a Verdict-shaped dict.

    A worker that dies before it takes the job (killed between jobs, and not yet reaped when the
    job was written to it) cost the job nothing: the job goes once more to a fresh worker.
    """
    self.jobs_run += 1
    for send in range(2):
      phase, children, accepted = enums.STAGE_LOAD, [], False
      limit = _Limit(timeout_s)
      try:
        if self._proc is None or self._proc.returncode is not None:
          await self.restart()
        written = time.monotonic()
        self._proc.stdin.write((job.dumps() + "\n").encode())
        await self._proc.stdin.drain()
        limit.start()
        while True:
          remaining = (limit.grace_end or limit.deadline) - time.monotonic()
          if remaining <= 0 and not limit.killed_at:
            limit.kill()
            _kill(children)
            continue
          if remaining <= 0:
            raise WorkerDied(f"worker {self.name} did not report after killing its job")
          try:
            message = await asyncio.wait_for(self._read(), remaining)
          except asyncio.TimeoutError:
            continue
          if message.get("type") == "reaped":
            if self.on_reaped is not None:
              self.on_reaped(message)
            continue
          if message.get("job_id") != job.job_id:
            continue
          accepted = True
          kind = message["type"]
          if kind == "started":
            children = list(message.get("pids", [message["pid"]]))
            self.running = job.job_id
          elif kind == "budget":
            limit.tighten(message.get("seconds"), message.get("why", ""))
          elif kind == "phase":
            phase = message["phase"]
            if on_phase is not None:
              on_phase(phase)
          elif kind == "done":
            verdict = _classify(message, phase, limit if limit.killed_at else None)
            # where the slot's time went (worker/process._timings), plus the round trip to it
            verdict["worker_timings"] = dict(message.get("worker_timings") or {},
                                             slot=time.monotonic() - written)
            verdict["judge_job"] = message.get("judge_job")  # which of its judge's jobs
            return verdict
      except (WorkerDied, BrokenPipeError, ConnectionResetError, json.JSONDecodeError) as e:
        log.warning("worker %s failed: %s; restarting it", self.name, e)
        _kill(children)  # the job's children have their own sessions: they outlive the worker
        await self.stop()
        if not accepted and send == 0:
          continue
        return {"outcome": enums.INFRA_ERROR, "stage": phase, "message": f"worker failed: {e}"}
      except asyncio.CancelledError:
        # The request went away (deadline): kill its children so the slot is free for the next job.
        try:
          await asyncio.wait_for(self._abort(job.job_id, children), _KILL_GRACE_S)
        except (asyncio.TimeoutError, WorkerDied, json.JSONDecodeError):
          await self.stop()
        raise
      finally:
        self.running = None
    raise AssertionError("unreachable: the second send always returns")

  async def _abort(self, job_id: str, children: list[int]) -> None:
    """Kills the job's children and reads messages up to its `done`, keeping the worker."""
    while True:
      _kill(children)
      message = await self._read()
      if message.get("job_id") != job_id:
        continue
      if message["type"] == "started":
        children = list(message.get("pids", [message["pid"]]))
      elif message["type"] == "done":
        return


def _remove_job_folders(tmpdir: str | None, tag: str) -> None:
  """The job folders (worker/pair.py) of the worker whose folder tag is `tag`."""
  if not tag:
    return
  root = pathlib.Path(tmpdir or tempfile.gettempdir())
  for role in (job_process.JUDGE, job_process.CANDIDATE):
    for folder in root.glob(job_process.folder_prefix(role, tag) + "*"):
      shutil.rmtree(folder, ignore_errors=True)


def _kill(pgids: list[int]) -> None:
  for pgid in pgids:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(pgid, signal.SIGKILL)


class _Limit:
  """A job's deadline: `timeout_s` from its start, or sooner where the judge's budget says so."""

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self.started = self.ceiling = self.deadline = 0.0
    self.killed_at = self.grace_end = 0.0  # 0: not killed
    self.budget_s, self.why = 0.0, ""

  def start(self) -> None:
    self.started = time.monotonic()
    self.ceiling = self.deadline = self.started + self.timeout_s

  def tighten(self, seconds: Any, why: str) -> None:
    """The judge's budget for the stretch it starts now (replacing the one before)."""
    if isinstance(seconds, (int, float)) and seconds > 0:
      self.budget_s, self.why = float(seconds), str(why)
      self.deadline = min(self.ceiling, time.monotonic() + self.budget_s)

  def kill(self) -> None:
    """The deadline passed: the job's processes are killed now, and reported within a grace."""
    self.killed_at = time.monotonic()
    self.grace_end = self.killed_at + _KILL_GRACE_S

  def describe(self, phase: str) -> tuple[str, str]:
    """(the TIMEOUT's message, the HANG's evidence)."""
    elapsed = self.killed_at - self.started
    if self.deadline < self.ceiling:
      return (f"run stage exceeded its budget in {phase}: {self.budget_s:.1f} s for {self.why} "
              f"(scaled to the reference's measured time; the ceiling is {self.timeout_s:.1f} s)",
              f"killed after {elapsed:.1f} s in {phase}, past its {self.budget_s:.1f} s budget")
    return (f"run stage exceeded {self.timeout_s:.1f} s (in {phase})",
            f"killed after {self.timeout_s:.1f} s in {phase}")


def _classify(done: dict[str, Any], phase: str, limit: _Limit | None) -> dict[str, Any]:
  """The verdict of a finished job; `limit`: the job was killed at that limit."""
  result = done.get("result")
  if limit is not None:
    # Hacks found before the hang stay; what the kill itself caused (SIGKILL) is not evidence.
    found = [f for f in (result or {}).get("exploits", []) if f["kind"] in exploits.REJECTING]
    message, evidence = limit.describe(phase)
    verdict = {"outcome": enums.TIMEOUT, "stage": phase, "message": message,
               "exploits": [{"kind": enums.HANG, "evidence": evidence}] + found}
    for key in ("policy", "trials", "environment"):
      if result and key in result:
        verdict[key] = result[key]
  elif result is not None:
    verdict = result
  else:
    verdict = {"outcome": enums.INFRA_ERROR, "stage": phase,
               "message": f"worker could not run the job: {done.get('status')}"}
  return exploits.apply_policy(verdict)


class WorkerPool:
  """Slots for every (GPU, slot) pair; hands jobs to whichever slot is free."""

  def __init__(self, slots: list[WorkerSlot]):
    self.slots = slots
    self._idle: asyncio.Queue[WorkerSlot] = asyncio.Queue()
    self._ids = itertools.count()
    self._exclusive = asyncio.Lock()  # one job gathering a whole device's slots at a time
    self.running = 0

  @classmethod
  def for_devices(cls, gpu_indices: list[int], slots_per_gpu: int, base_env: dict[str, str],
                  cpu_test_mode: bool = False,
                  sandbox: dict[str, Any] | None = None) -> WorkerPool:
    # OpenBLAS starts a thread pool when numpy loads; the worker must fork single-threaded.
    base_env = dict(base_env, OPENBLAS_NUM_THREADS=base_env.get("OPENBLAS_NUM_THREADS", "1"))
    sandbox = sandbox or {"enabled": False}
    devices = [("cpu", "cpu", "")] if cpu_test_mode else []
    devices += [(f"gpu{gpu}", "cuda", str(gpu)) for gpu in gpu_indices]
    slots = []
    for prefix, device, visible in devices:
      for s in range(slots_per_gpu):
        spec = dict(sandbox, uid=sandbox.get("uid_base", 61000) + len(slots))
        slots.append(WorkerSlot(f"{prefix}/{s}", device,
                                dict(base_env, CUDA_VISIBLE_DEVICES=visible), spec))
    return cls(slots)

  async def start(self) -> None:
    await asyncio.gather(*(slot.start() for slot in self.slots))
    for slot in self.slots:
      self._idle.put_nowait(slot)

  async def stop(self) -> None:
    await asyncio.gather(*(slot.close() for slot in self.slots))

  async def run(self, job: envelope.Job, timeout_s: float,
                on_phase: Callable[[str], None] | None = None,
                exclusive: bool = False) -> dict[str, Any]:
    """Runs `job` on the next free slot. `exclusive`: alone on its device instead, once every slot
    of one device is free, with the GPU memory of all of them (`memory_scale`, which the worker
    multiplies the slot's memory fractions by): for a retry after an INFRA_ERROR, such as a
    reference that needs more memory than one slot's share."""
    waited = time.monotonic()
    held = await self._take_device() if exclusive else [await self._idle.get()]
    waited = time.monotonic() - waited
    slot = held[0]
    self.running += 1
    try:
      job = dataclasses.replace(job, job_id=f"{slot.name}#{next(self._ids)}",
                                memory_scale=len(held) if exclusive else 1)
      result = await slot.run(job, timeout_s, on_phase)
      result["stage_timings"] = [{"stage": enums.STAGE_QUEUE, "duration_s": waited}] + result.get(
          "stage_timings", [])
      return result
    finally:
      self.running -= 1
      for s in held:
        self._idle.put_nowait(s)

  async def _take_device(self) -> list[WorkerSlot]:
    """Takes free slots until it holds every slot of one device; hands back the others."""
    total = collections.Counter(s.unit for s in self.slots)
    async with self._exclusive:
      held: list[WorkerSlot] = []
      try:
        while True:
          held.append(await self._idle.get())
          unit = held[-1].unit
          mine = [s for s in held if s.unit == unit]
          if len(mine) == total[unit]:
            for s in held:
              if s.unit != unit:
                self._idle.put_nowait(s)
            return mine
      except asyncio.CancelledError:
        for s in held:
          self._idle.put_nowait(s)
        raise
