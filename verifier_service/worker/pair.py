"""A job's two processes, the judge and the candidate's, from fork to reaping (worker/process.py drives them).

Both are forked from the worker (torch imported, no CUDA) and share only one socket. Each waits
on its start pipe (worker/job_process.py): `s` makes its trusted setup, `g` starts the job the worker
wrote into its folder; end of file on the pipe ends a pair that was never used.

Decision: a pair is forked ahead of its job (the worker's standby), and the worker tells it to set
up when the running job's timing is over, so the next job finds both processes with their CUDA
contexts made (about 0.3 s each on an H200) without a context being created while a judge times.
A pair forked for its job at once (`start` sends `s` and `g` together) runs exactly as before.

A job is over for the slot when both processes have reported (`serve`): their exits (a CUDA
context's teardown, ~0.27 s on an H200) are then off the critical path. (Until 2026-12-06 they
were not: the candidate's seccomp listener hangs up as its process exits and stays readable, and
`serve` answered it in a loop until the process was reaped; now a hung-up listener is let go:
`exit` went from 0.21-0.41 s to 0.001-0.003 s of a slot's job on an H100, BENCHMARKS.md run 24.)
The worker kills both process groups and reaps them later (`retire`, `reap`), so nothing of the
finished job runs beside the next one but the kernel's teardown. A process that has not reported
is waited for, and killed after a grace once the other is done, as before: its exit status
decides its verdict.

What bounds a slot's jobs now (run 24): one GPU makes and tears down about 5 CUDA contexts a
second however many processes ask at once, and a pair makes two, so a GPU runs at most ~2.6 jobs a
second through pairs; a judge that outlives its job would halve that cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import secrets
import select
import shutil
import signal
import socket
import tempfile
import time
from typing import Any, Callable, TextIO

from verifier_service import enums
from verifier_service.run import envelope
from verifier_service.run import job as job_lib
from verifier_service.worker import job_process
from verifier_service.run import sandbox

LOG_TAIL_BYTES = 4096
_EXIT_GRACE_S = 2.0
JUDGE, CANDIDATE = job_process.JUDGE, job_process.CANDIDATE
JOB_FILE = job_process.JOB_FILE
write_line = job_process.write_line


def send(out: TextIO, message: dict[str, Any]) -> None:
  out.write(json.dumps(message) + "\n")
  out.flush()


def status(wait_status: int) -> dict[str, Any]:
  if os.WIFSIGNALED(wait_status):
    sig = os.WTERMSIG(wait_status)
    return {"signal": sig, "signal_name": signal.Signals(sig).name}
  return {"exit_code": os.WEXITSTATUS(wait_status)}


def tail(path: str) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return ""


def _clock(value: Any) -> float:
  """A time.monotonic() reading a child sent, or 0.0 where it is none."""
  return value if isinstance(value, float) and math.isfinite(value) else 0.0


class Process:
  """The worker's side of one child: its pipes, its seccomp listener, its report, its exit."""

  def __init__(self, role: str, pid: int, report_fd: int, start_fd: int,
               notify: socket.socket | None, nonce: str, job_dir: str):
    self.role, self.pid, self.report_fd, self.start_fd = role, pid, report_fd, start_fd
    self.notify, self.nonce, self.job_dir = notify, nonce, job_dir
    self.pidfd = os.pidfd_open(pid)
    self.result: envelope.JudgeReport | envelope.CandidateReport | None = None
    self.refused = ""  # why its report, nonce and all, did not fit the role's report type
    self.forged: list[dict[str, str]] = []
    self.supervisor: sandbox.Supervisor | None = None
    self.phase = enums.STAGE_LOAD
    self.loading = False  # the candidate's process is about to execute candidate code
    self.timed = False  # the judge's timing is over
    self.exited = self.drained = self.killed = False
    self.wait_status: int | None = None
    self.cpu_s = 0.0  # user + system CPU of the process and what it reaped (wait4), once exited
    self.first_line_at = self.result_at = self.exited_at = 0.0  # time.monotonic(); 0: not yet
    # When the judge says it read its job (after its set-up) and began its run (its first message's
    # `job_read_at` and `at`, the same clock): the worker reads that line only once it serves the
    # pair, after forking the next one (process.run_job).
    self.job_read_at = self.began_at = 0.0
    # When it wrote its result line and, for the candidate's, when it answered the judge's
    # `finish` (its own clock): timings only, never a verdict's input (the candidate's process
    # runs candidate code, which may write anything on that pipe).
    self.written_at = self.finished_at = 0.0
    self._buffer = b""

  def line(self, line: bytes, out: TextIO, job_id: str) -> None:
    self.first_line_at = self.first_line_at or time.monotonic()
    try:
      message = json.loads(line)
    except ValueError:
      return
    if not isinstance(message, dict):
      return
    if message.get("type") == "phase" and isinstance(message.get("phase"), str):
      at, read = _clock(message.get("at")), _clock(message.get("job_read_at"))
      if self.role == JUDGE and not self.began_at and at:
        self.began_at = min(at, self.first_line_at)
        self.job_read_at = min(read, self.began_at) if read else 0.0
      if message["phase"] == "CANDIDATE_LOADING" and self.role == CANDIDATE:
        self.loading = True
      elif message["phase"] == "CANDIDATE_FINISHED" and self.role == CANDIDATE:
        self.finished_at = self.finished_at or at
      elif message["phase"] == job_lib.PHASE_TIMED and self.role == JUDGE:
        self.timed = True
      elif self.role == JUDGE and message["phase"].startswith("STAGE_"):
        self.phase = message["phase"]
        send(out, {"type": "phase", "job_id": job_id, "phase": message["phase"]})
    elif message.get("type") == "budget" and self.role == JUDGE:
      # The next stretch's time budget (run/budget.py): only the judge may set one.
      seconds = message.get("seconds")
      if isinstance(seconds, (int, float)) and 0 < seconds < float("inf"):
        send(out, {"type": "budget", "job_id": job_id, "seconds": float(seconds),
                   "why": str(message.get("why", ""))[:400]})
    elif message.get("type") == "result":
      if message.get("nonce") != self.nonce or not isinstance(message.get("result"), dict):
        self.forged.append({"kind": enums.MONKEY_PATCH,
                            "evidence": "wrote a forged result to the verifier's report pipe"})
      elif self.result is None and not self.refused:
        kind = envelope.JudgeReport if self.role == JUDGE else envelope.CandidateReport
        try:
          self.result = kind.from_json(message["result"])
        except ValueError as e:  # counted as no report; the verdict says why
          self.refused = str(e)[:500]
        self.result_at = time.monotonic()
        self.written_at = _clock(message.get("at"))

  def read(self, out: TextIO, job_id: str) -> None:
    data = os.read(self.report_fd, 1 << 16)
    if not data:
      self.drained = True
      return
    self._buffer += data
    *lines, self._buffer = self._buffer.split(b"\n")
    for line in lines:
      self.line(line, out, job_id)

  def kill(self) -> None:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(self.pid, signal.SIGKILL)

  def reap(self, block: bool = True) -> bool:
    """Waits for the exit (or only looks, `block=False`); True once it has exited."""
    if self.wait_status is None:
      pid, wait_status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
      if pid == 0:
        return False
      self.wait_status, self.exited = wait_status, True
      self.cpu_s = usage.ru_utime + usage.ru_stime
    return True

  def close_start(self) -> None:
    """Closes the start pipe (a process still waiting on it sees end of file and exits)."""
    if self.start_fd >= 0:
      os.close(self.start_fd)
      self.start_fd = -1

  def close(self) -> None:
    self.close_start()
    os.close(self.pidfd)
    os.close(self.report_fd)
    if self.supervisor is not None:
      self.supervisor.close()
      self.supervisor = None
    if self.notify is not None:
      self.notify.close()
      self.notify = None

  @property
  def status(self) -> dict[str, Any]:
    if self.wait_status is None:
      return {"reported": True, **({"killed_by_worker": True} if self.killed else {})}
    return dict(status(self.wait_status), **({"killed_by_worker": True} if self.killed else {}))

  @property
  def violations(self) -> list[dict[str, str]]:
    return (self.supervisor.violations if self.supervisor else []) + self.forged


class Pair:
  """A judge and a candidate's process, forked together, for one job."""

  def __init__(self, judge: Process, candidate: Process, judge_dir: str, cand_dir: str):
    self.judge, self.candidate = judge, candidate
    self.judge_dir, self.cand_dir = judge_dir, cand_dir
    self.processes = [judge, candidate]
    self.set_up = False
    self.set_up_at = 0.0  # when `setup` was called
    self.forked_at = time.monotonic()
    self.job_id = ""  # the job it was handed (start); "" for a pair that never got one

  @classmethod
  def fork(cls, device: str, spec: dict[str, Any]) -> Pair:
    """Forks the judge, then the candidate's process; both wait on their start pipes. An OSError
    kills whichever was forked."""
    nonce = secrets.token_hex(16)
    tag = spec.get("folder_tag") or ""  # the pool's, per worker
    judge_dir = tempfile.mkdtemp(prefix=job_process.folder_prefix(JUDGE, tag))
    cand_dir = tempfile.mkdtemp(prefix=job_process.folder_prefix(CANDIDATE, tag))
    judge_end, cand_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    forked: list[Process] = []
    try:
      for role, job_dir, boundary in ((JUDGE, judge_dir, judge_end),
                                      (CANDIDATE, cand_dir, cand_end)):
        report_r, report_w = os.pipe()
        start_r, start_w = os.pipe()
        notify_parent = notify_child = None
        if role == CANDIDATE:
          notify_parent, notify_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
          job_process.main(role, device, spec, job_dir, nonce, report_w, start_r, boundary,
                           notify_child)
        os.close(report_w)
        os.close(start_r)
        if notify_child is not None:
          notify_child.close()
        forked.append(Process(role, pid, report_r, start_w, notify_parent, nonce, job_dir))
    except OSError:
      for process in forked:
        process.kill()
        process.close()
      shutil.rmtree(judge_dir, ignore_errors=True)
      shutil.rmtree(cand_dir, ignore_errors=True)
      raise
    finally:
      judge_end.close()
      cand_end.close()
    return cls(forked[0], forked[1], judge_dir, cand_dir)

  def alive(self) -> bool:
    """Both processes still wait for their job (neither died in the meantime)."""
    return not any(select.select([p.pidfd], [], [], 0)[0] for p in self.processes)

  def setup(self) -> None:
    """Lets both processes make their trusted setup now (once)."""
    if not self.set_up:
      self.set_up, self.set_up_at = True, time.monotonic()
      for process in self.processes:
        with contextlib.suppress(OSError):
          os.write(process.start_fd, b"s")

  def start(self, job: envelope.Envelope) -> None:
    """Hands `job` to both processes (its modules copied into the candidate's folder first)."""
    self.job_id = job.job.job_id
    job = dataclasses.replace(job, job=dataclasses.replace(
        job.job, modules=self._stage_modules(job.job.modules)))
    text = job.dumps()
    for process in self.processes:
      path = os.path.join(process.job_dir, JOB_FILE)
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    self.setup()
    for process in self.processes:
      os.write(process.start_fd, b"g")

  def _stage_modules(self, modules: dict[str, str] | None) -> dict[str, str] | None:
    """Copies the job's built modules out of the compile cache into the candidate's folder: the
    children never need to see the cache."""
    if not modules:
      return modules
    staged = {}
    for i, (fingerprint, path) in enumerate(sorted(modules.items())):
      folder = os.path.join(self.cand_dir, "ext", str(i))
      os.makedirs(folder)
      staged[fingerprint] = shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))
      os.chmod(staged[fingerprint], 0o555)
    return staged

  def serve(self, out: TextIO, job_id: str, on_timed: Callable[[], None] | None = None) -> None:
    """Serves both processes until both have reported, or, where one has not, until both exited
    and their pipes are drained (a process that lingers after the other is done is killed after a
    grace period). `on_timed` is called once the judge says its timing is over."""
    poller = select.poll()
    owner: dict[int, tuple[Process, str]] = {}

    def watch(process: Process, fd: int, what: str) -> None:
      poller.register(fd, select.POLLIN)
      owner[fd] = (process, what)

    for process in self.processes:
      watch(process, process.pidfd, "exit")
      watch(process, process.report_fd, "report")
      if process.notify is not None:
        watch(process, process.notify.fileno(), "notify")
    deadline, timed = None, False
    while not all(p.drained and p.exited for p in self.processes):
      if all(p.result is not None or p.refused for p in self.processes):
        events = poller.poll(0)  # what is already there (a last refused call), then done
        if not events:
          return
      else:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        events = poller.poll(None if timeout is None else int(timeout * 1000))
      if not events and deadline is not None:
        for process in self.processes:
          if not process.exited:
            process.kill()
            process.killed = True
          elif not process.drained:  # exited, but a grandchild still holds the pipe open
            process.drained = True
            poller.unregister(process.report_fd)
        deadline = time.monotonic() + _EXIT_GRACE_S
        continue
      for fd, revents in events:
        process, what = owner[fd]
        if what == "exit":
          process.exited_at = time.monotonic()
          poller.unregister(fd)
          process.reap()
          deadline = time.monotonic() + _EXIT_GRACE_S
        elif what == "report":
          process.read(out, job_id)
          if process.drained:
            poller.unregister(fd)
        elif what == "notify":
          poller.unregister(fd)
          try:
            _, fds, _, _ = socket.recv_fds(process.notify, 1, 1)
          except OSError:
            fds = []
          if fds:
            process.supervisor = sandbox.Supervisor(fds[0])
            watch(process, fds[0], "seccomp")
        elif what == "seccomp":
          process.supervisor.handle()
          if revents & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            # No task is left under its filter (the process is exiting): nothing more can come,
            # and a hung-up listener stays readable, which would keep this loop from returning
            # until the exit (a CUDA context's teardown) is over.
            poller.unregister(fd)
      if not timed and self.judge.timed and on_timed is not None:
        timed = True
        on_timed()

  def kill(self) -> None:
    for process in self.processes:
      process.kill()

  def retire(self) -> None:
    """After the job: both process groups killed (what is left is the kernel's teardown), the
    descriptors closed; `reap` collects the exits and removes both folders."""
    for process in self.processes:
      if not process.exited:
        process.kill()
      if process.supervisor is not None:
        process.supervisor.close()
        process.supervisor = None

  def reap(self, block: bool = False) -> bool:
    """Collects the exits (without waiting unless `block`); True, with the folders removed and
    every descriptor closed, once both have exited."""
    if not all(p.reap(block) for p in self.processes):
      return False
    for process in self.processes:
      process.close()
    shutil.rmtree(self.cand_dir, ignore_errors=True)
    shutil.rmtree(self.judge_dir, ignore_errors=True)
    return True

  def cpu_report(self) -> dict[str, Any] | None:
    """Once both have exited: the "reaped" message, the CPU seconds the job's processes used from
    their fork to their exit (the kernel's count, wait4), the judge's split at its report (its own
    count, trusted: the judge's code); None for a pair that never got a job."""
    if not self.job_id or not all(p.exited for p in self.processes):
      return None
    parts = {"judge": self.judge.cpu_s, "candidate": self.candidate.cpu_s}
    if isinstance(self.judge.result, envelope.JudgeReport) and self.judge.result.cpu_s > 0:
      until = min(self.judge.result.cpu_s, self.judge.cpu_s)
      parts.update(judge_until_report=until, judge_after_report=self.judge.cpu_s - until)
    return {"type": "reaped", "job_id": self.job_id,
            "cpu_s": {k: round(v, 4) for k, v in parts.items()}}

  def discard(self) -> None:
    """A pair that never got a job: end of file on its start pipes, then it is reaped."""
    for process in self.processes:
      process.close_start()
    self.reap(block=True)
