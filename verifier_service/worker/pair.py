"""A job's two processes, the judge and the candidate's, from fork to reaping (worker/process.py drives them).

Both are forked from the worker (torch imported, no CUDA) and share only one socket. Each waits
on its start channel (a unix socket, worker/job_process.py): `s` makes its trusted setup, `g`
starts the job the worker wrote into its folder; end of file ends a process never used. The
candidate's process gets its end of the job's socket at its fork; the judge gets its end with the
`g` of each job, with a nonce of that job's.

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
decides its verdict. A judge that reported waits for its next job instead of exiting.

What bounds a slot's jobs now (run 24): one GPU makes and tears down about 5 CUDA contexts a
second however many processes ask at once, and a pair makes two, so a GPU runs at most ~2.6 jobs a
second through pairs. Hence kept judges (`judge_jobs`, worker/process.py): after a job its judge
ran cleanly (`judge_reusable`) the judge serves the slot's next job with a new candidate's
process (`Pair.fork(with_judge=False)`, `attach`), and such a job makes one context, not two.
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
# Outcomes after which a judge may be kept for the slot's next job (`Pair.judge_reusable`): the
# candidate's process ran and reported on its own. After a TIMEOUT, a kill, INFRA_ERROR or
# BAD_REFERENCE the judge is replaced.
KEEP_JUDGE_AFTER = frozenset({enums.OK, enums.INCORRECT, enums.RUNTIME_ERROR, enums.REJECTED})
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
  """The worker's side of one child: its start channel, its pipes, its seccomp listener, its
  report, its exit. A kept judge serves several jobs: `new_job` clears what one job left."""

  def __init__(self, role: str, pid: int, report_fd: int, start: socket.socket | None,
               notify: socket.socket | None, nonce: str, job_dir: str):
    self.role, self.pid, self.report_fd, self.start = role, pid, report_fd, start
    self.notify, self.job_dir = notify, job_dir
    self.pidfd = os.pidfd_open(pid)
    self.supervisor: sandbox.Supervisor | None = None
    self.exited = self.drained = self.killed = False
    self.wait_status: int | None = None
    self.cpu_s = 0.0  # user + system CPU of the process and what it reaped (wait4), once exited
    self.exited_at = 0.0
    self.jobs = 0  # jobs handed to it (`Pair.start`): more than one for a kept judge
    self.cpu_reported = 0.0  # the judge's CPU at its previous job's report (its own count)
    self.new_job(nonce)

  def new_job(self, nonce: str) -> None:
    """What one job's reading of this process starts from (its nonce, no report yet)."""
    self.nonce = nonce
    self.result: envelope.JudgeReport | envelope.CandidateReport | None = None
    self.refused = ""  # why its report, nonce and all, did not fit the role's report type
    self.forged: list[dict[str, str]] = []
    self.phase = enums.STAGE_LOAD
    self.loading = False  # the candidate's process is about to execute candidate code
    self.timed = False  # the judge's timing is over
    self.first_line_at = self.result_at = 0.0  # time.monotonic(); 0: not yet
    # When the judge says it read its job (after its set-up) and began its run (its first message's
    # `job_read_at` and `at`, the same clock): the worker reads that line only once it serves the
    # pair, after forking the next one (process.run_job).
    self.job_read_at = self.began_at = 0.0
    # When it wrote its result line and, for the candidate's, when it answered the judge's
    # `finish` (its own clock): timings only, never a verdict's input (the candidate's process
    # runs candidate code, which may write anything on that pipe).
    self.written_at = self.finished_at = 0.0
    self._buffer = b""

  @property
  def reported(self) -> bool:
    return self.result is not None or bool(self.refused)

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

  def tell(self, message: bytes, fds: list[int] | None = None) -> None:
    """One message on the start channel (`s`, or `g` and the judge's nonce and socket)."""
    if self.start is None:
      raise OSError(f"the {self.role}'s start channel is closed")
    socket.send_fds(self.start, [message], fds or [])

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
    """Closes the start channel (a process still waiting on it sees end of file and exits)."""
    if self.start is not None:
      self.start.close()
      self.start = None

  def close(self) -> None:
    """Every descriptor closed and the folder removed (after the exit)."""
    self.close_start()
    os.close(self.pidfd)
    os.close(self.report_fd)
    if self.supervisor is not None:
      self.supervisor.close()
      self.supervisor = None
    if self.notify is not None:
      self.notify.close()
      self.notify = None
    shutil.rmtree(self.job_dir, ignore_errors=True)

  def gone(self) -> bool:
    """It exited (or was killed) without being reaped yet."""
    return bool(select.select([self.pidfd], [], [], 0)[0])

  def end(self) -> None:
    """Killed, reaped (waiting for the exit) and closed: a process no pair will reap."""
    self.kill()
    self.reap()
    self.close()

  @property
  def status(self) -> dict[str, Any]:
    if self.wait_status is None:
      return {"reported": True, **({"killed_by_worker": True} if self.killed else {})}
    return dict(status(self.wait_status), **({"killed_by_worker": True} if self.killed else {}))

  @property
  def violations(self) -> list[dict[str, str]]:
    return (self.supervisor.violations if self.supervisor else []) + self.forged


def fork(role: str, device: str, spec: dict[str, Any], nonce: str,
         boundary: socket.socket | None = None) -> Process:
  """Forks one job process (worker/job_process.py) in a folder of its own; it waits on its start
  channel. The candidate's process gets its end of the job's socket here, the judge with each job
  (`Pair.start`). An OSError leaves nothing behind."""
  job_dir = tempfile.mkdtemp(prefix=job_process.folder_prefix(role, spec.get("folder_tag") or ""))
  ends: list[Any] = []
  try:
    report_r, report_w = os.pipe()
    ends += [report_r, report_w]
    start_parent, start_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ends += [start_parent, start_child]
    notify_parent = notify_child = None
    if role == CANDIDATE:
      notify_parent, notify_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
      ends += [notify_parent, notify_child]
    pid = os.fork()
  except OSError:
    for end in ends:
      if isinstance(end, socket.socket):
        end.close()
      else:
        os.close(end)
    shutil.rmtree(job_dir, ignore_errors=True)
    raise
  if pid == 0:
    job_process.main(role, device, spec, job_dir, nonce, report_w, start_child, boundary,
                     notify_child)
  os.close(report_w)
  start_child.close()
  if notify_child is not None:
    notify_child.close()
  return Process(role, pid, report_r, start_parent, notify_parent, nonce, job_dir)


class Pair:
  """A job's judge and candidate's process. The candidate's is forked for the job (ahead of it);
  the judge too, or it is a kept judge (`attach`) that served the slot's earlier jobs."""

  def __init__(self, judge: Process | None, candidate: Process,
               boundary: socket.socket | None = None):
    self.judge: Process | None = judge
    self.candidate = candidate
    self.boundary = boundary  # the judge's end of the job's socket, handed over at `start`
    self.cand_dir = candidate.job_dir
    self.set_up = False
    self.set_up_at = 0.0  # when `setup` was called
    self.forked_at = time.monotonic()
    self.job_id = ""  # the job it was handed (start); "" for a pair that never got one
    self.keep_judge = False  # the judge serves the slot's next job (`judge_reusable`)
    self._judge_cpu = (0.0, 0.0)  # the judge's CPU before this job and at its report
    self.judge_job = 0  # which of its judge's jobs this pair's is (1: a judge's first)

  @property
  def processes(self) -> list[Process]:
    return [p for p in (self.judge, self.candidate) if p is not None]

  @classmethod
  def fork(cls, device: str, spec: dict[str, Any], with_judge: bool = True) -> Pair:
    """Forks the judge (unless `with_judge` is False: one is attached later), then the
    candidate's process; both wait on their start channels. An OSError kills whichever was
    forked."""
    nonce = secrets.token_hex(16)
    judge_end, cand_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    judge = None
    try:
      judge = fork(JUDGE, device, spec, nonce) if with_judge else None
      candidate = fork(CANDIDATE, device, spec, nonce, cand_end)
    except OSError:
      judge_end.close()
      if judge is not None:
        judge.end()
      raise
    finally:
      cand_end.close()
    return cls(judge, candidate, judge_end)

  def attach(self, judge: Process) -> None:
    """Gives a pair forked without a judge the one that runs its job (set up as the pair is)."""
    self.judge = judge
    if self.set_up:
      with contextlib.suppress(OSError):
        judge.tell(b"s")

  def alive(self) -> bool:
    """Its processes still wait for their job (none died in the meantime)."""
    return not any(p.gone() for p in self.processes)

  def setup(self) -> None:
    """Lets its processes make their trusted setup now (once; a kept judge made its own)."""
    if not self.set_up:
      self.set_up, self.set_up_at = True, time.monotonic()
      for process in self.processes:
        with contextlib.suppress(OSError):
          process.tell(b"s")

  def start(self, job: envelope.Envelope) -> None:
    """Hands `job` to both processes (its modules copied into the candidate's folder first): the
    judge gets a fresh nonce and its end of the job's socket with it."""
    assert self.judge is not None and self.boundary is not None
    self.job_id = job.job.job_id
    job = dataclasses.replace(job, job=dataclasses.replace(
        job.job, modules=self._stage_modules(job.job.modules)))
    text = job.dumps()
    for process in self.processes:
      with open(os.path.join(process.job_dir, JOB_FILE), "w", encoding="utf-8") as f:
        f.write(text)
    if self.judge.jobs:  # a kept judge: its log holds this job's lines only (opened to append)
      with contextlib.suppress(OSError):
        os.truncate(os.path.join(self.judge.job_dir, "output.log"), 0)
    self.setup()
    nonce = secrets.token_hex(16)
    self.judge.new_job(nonce)
    self._judge_cpu = (self.judge.cpu_reported, 0.0)
    for process in self.processes:
      process.jobs += 1
    self.judge_job = self.judge.jobs
    self.judge.tell(b"g" + nonce.encode(), [self.boundary.fileno()])
    self.boundary.close()
    self.boundary = None
    self.candidate.tell(b"g")

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

  def _done(self, process: Process) -> bool:
    """Nothing more to wait for from `process`: it exited and its pipe is drained, or it is the
    judge and reported (a judge waits for its next job once it reported, worker/job_process.py)."""
    return (process.drained and process.exited) or (process is self.judge and process.reported)

  def serve(self, out: TextIO, job_id: str, on_timed: Callable[[], None] | None = None) -> None:
    """Serves both processes until both have reported, or, where one has not, until each is done
    (`_done`): a process that lingers after the other is done is killed after a grace period.
    `on_timed` is called once the judge says its timing is over."""
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
    while not all(self._done(p) for p in self.processes):
      if all(p.reported for p in self.processes):
        events = poller.poll(0)  # what is already there (a last refused call), then done
        if not events:
          return
      else:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        events = poller.poll(None if timeout is None else int(timeout * 1000))
      if not events and deadline is not None:
        for process in self.processes:
          if not process.exited and not self._done(process):
            process.kill()
            process.killed = True
          elif not process.drained and process.exited:  # a grandchild still holds the pipe open
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
          elif process is self.judge and process.reported and deadline is None:
            deadline = time.monotonic() + _EXIT_GRACE_S  # the judge is done: so is the job soon
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

  def judge_reusable(self, outcome: str | None, max_jobs: int, cpu_s: float) -> bool:
    """Whether the judge may serve the slot's next job, after this one ended in `outcome`: it
    says so itself (its run ended in step with the candidate's side, and the torch globals it
    checks are as before the job: trusted/judge.py), it has served fewer than `max_jobs`, its CPU
    limit leaves `cpu_s` for another job (job_process.judge_cpu_limit), and the candidate's
    process reported on its own, refused nothing and ended in an outcome that says nothing about
    the GPU's health (a hang, a crash or a kill replaces the judge, and so does any doubt)."""
    judge, candidate = self.judge, self.candidate
    report = judge.result if judge is not None else None
    return (isinstance(report, envelope.JudgeReport) and report.reusable
            and not judge.refused and not judge.forged and not judge.exited
            and not judge.killed and judge.jobs < max_jobs
            and report.cpu_s + cpu_s <= job_process.judge_cpu_limit(cpu_s, max_jobs)
            and isinstance(candidate.result, envelope.CandidateReport)
            and not candidate.killed and not candidate.violations
            and outcome in KEEP_JUDGE_AFTER)

  def kill(self) -> None:
    for process in self.processes:
      process.kill()

  def retire(self) -> None:
    """After the job: both process groups killed (what is left is the kernel's teardown), the
    descriptors closed; `reap` collects the exits and removes both folders. A kept judge
    (`keep_judge`) is left waiting for its next job."""
    if self.boundary is not None:
      self.boundary.close()
      self.boundary = None
    judge = self.judge
    if judge is not None and self.job_id and isinstance(judge.result, envelope.JudgeReport):
      self._judge_cpu = (self._judge_cpu[0], judge.result.cpu_s)
      judge.cpu_reported = judge.result.cpu_s
    for process in self.owned():
      if not process.exited:
        process.kill()
      if process.supervisor is not None:
        process.supervisor.close()
        process.supervisor = None

  def owned(self) -> list[Process]:
    """The processes that end with this pair (all but a kept judge)."""
    return [p for p in self.processes if not (p is self.judge and self.keep_judge)]

  def reap(self, block: bool = False) -> bool:
    """Collects the exits (without waiting unless `block`); True, with the folders removed and
    every descriptor closed, once every process of its own has exited."""
    owned = self.owned()
    if not all(p.reap(block) for p in owned):
      return False
    for process in owned:
      process.close()
    return True

  def cpu_report(self) -> dict[str, Any] | None:
    """Once its processes have exited: the "reaped" message, the CPU seconds the job's processes
    used (the kernel's count, wait4, from fork to exit), the judge's split at its report (its own
    count, trusted: the judge's code); None for a pair that never got a job. A judge that served
    earlier jobs counts from its previous report; a kept judge (not reaped yet) only up to this
    job's report (`judge_until_report`)."""
    owned = self.owned()
    if not self.job_id or not all(p.exited for p in owned):
      return None
    parts = {"candidate": self.candidate.cpu_s}
    before, at_report = self._judge_cpu
    if self.judge is not None and self.judge in owned:
      parts["judge"] = max(0.0, self.judge.cpu_s - before)
      if at_report > 0:
        until = min(at_report - before, parts["judge"])
        parts.update(judge_until_report=until, judge_after_report=parts["judge"] - until)
    elif at_report > 0:
      parts["judge_until_report"] = at_report - before
    return {"type": "reaped", "job_id": self.job_id,
            "cpu_s": {k: round(v, 4) for k, v in parts.items()}}

  def discard(self) -> None:
    """A pair that never got a job: end of file on its start channels, then it is reaped."""
    if self.boundary is not None:
      self.boundary.close()
      self.boundary = None
    for process in self.owned():
      process.close_start()
    self.reap(block=True)
