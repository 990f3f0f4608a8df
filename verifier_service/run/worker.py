"""A worker process: imports torch once, then forks two sandboxed children per job.

Run as `python -m verifier_service.run.worker --device cuda` with CUDA_VISIBLE_DEVICES naming one GPU
(the pool does this, one process per slot). Protocol: one JSON object per line. Jobs arrive on
stdin; messages leave on the process's original stdout, which is kept private (fd 1 is pointed
at stderr so that stray prints cannot corrupt it, and job children never inherit it):

  {"type": "ready", "pid": ..., "torch_version": ..., "sandbox": {layer: state}}   once
  {"type": "accepted", "job_id": ...}                           the job was read
  {"type": "started", "job_id": ..., "pid": CANDIDATE, "pids": [CANDIDATE, JUDGE]}  (= pgids)
  {"type": "phase", "job_id": ..., "phase": "STAGE_..."}         as the judge goes
  {"type": "budget", "job_id": ..., "seconds": ..., "why": ...}   the judge's budget for what is
                                                                 left (run/budget.py)
  {"type": "done", "job_id": ..., "result": {...}, "status": {...}, "log_tail": "..."}

The trust boundary (ARCHITECTURE.md, "The verifier's trust boundary"). Each job runs in two children forked from this process:
- the judge (trusted/judge.py) executes the reference, regenerates every input from the seeds,
  compares and times the reference: it never loads candidate code;
- the candidate's process (untrusted/child.py) executes the candidate and answers the judge's
  commands, its outputs leaving as bytes over a socket (wire.py).
Each is sandboxed on its own (sandbox.py) and they share nothing but that socket. Each reports to
this process on a pipe of its own, with a per-job nonce (a candidate that writes a result line
without knowing the nonce is caught forging it); the candidate's process also hands over its
seccomp listener, through which the worker names every refused system call (`sandbox.Supervisor`).
The worker then merges both reports and both exit statuses into one verdict (trusted/verdict.py):
only this process and the judge decide anything.

Why fork per job: the worker never initialises CUDA, so each child creates its own context, and a
child that hangs, crashes, corrupts its CUDA context or monkey-patches torch takes only itself
down; torch's import cost (seconds) is paid once per slot, not per job. The job's modules are
copied from the compile cache into the candidate's folder before the fork: the children never
need to see the cache.

`--device cpu` is the development/test mode (off by default; the server enables it only with
`--cpu-test-mode`): the same children run reference and candidate on the CPU, which lets CI
exercise the boundary, the sandbox, crashes, hangs, timeouts, correctness, exploit checks and
poisoning with candidates whose load_inline has only C++ sources. It proves nothing about CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import os
import secrets
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, TextIO

from verifier_service import enums
from verifier_service.run import job as job_lib
from verifier_service.run import sandbox

LOG_TAIL_BYTES = 4096
_EXIT_GRACE_S = 2.0
JUDGE, CANDIDATE = "judge", "candidate"


def _send(out: TextIO, message: dict[str, Any]) -> None:
  out.write(json.dumps(message) + "\n")
  out.flush()


def _write_line(fd: int, message: dict[str, Any]) -> None:
  data = (json.dumps(message) + "\n").encode()
  while data:
    data = data[os.write(fd, data):]


def _close_other_fds(keep: set[int]) -> None:
  for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    if fd > 2 and fd not in keep:
      try:
        os.close(fd)
      except OSError:
        pass  # the listing's own descriptor


def _child(role: str, job: dict[str, Any], job_dir: str, nonce: str, report_fd: int,
           boundary: socket.socket, notify: socket.socket | None) -> None:
  """Runs in a forked child (the judge or the candidate's process); never returns."""
  code = 70
  try:
    os.setsid()
    netns = sandbox.enter_namespaces() if job["sandbox"]["enabled"] else "off: disabled"
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the job pipe is the worker's, not the children's
    log_fd = os.open(os.path.join(job_dir, "output.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    _close_other_fds({report_fd, boundary.fileno()} | ({notify.fileno()} if notify else set()))
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable()
    os.chdir(job_dir)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from verifier_service.run import wire  # pylint: disable=import-outside-toplevel
    spec = job["sandbox"]
    if spec["enabled"]:
      policy = sandbox.Policy(job_dir=job_dir, read_only=spec["read_only"], uid=spec["uid"],
                              memory_bytes=spec["memory_bytes"], cpu_s=spec["cpu_s"],
                              file_bytes=spec["file_bytes"], strict=spec["strict"])

    def lock_down() -> dict[str, str]:
      if not spec["enabled"]:
        return {"sandbox": "off: disabled by --no-sandbox"}
      return sandbox.lock_down(policy, netns, notify)

    emit = lambda msg: _write_line(report_fd, {"type": "phase", **msg})
    chan = wire.Channel(boundary)
    if role == JUDGE:
      from verifier_service.trusted import judge  # pylint: disable=import-outside-toplevel
      result = judge.run(job, chan, emit, lock_down)
    else:
      from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
      result = child.run(job, chan, emit, lock_down)
    _write_line(report_fd, {"type": "result", "nonce": nonce, "result": result})
    code = 0
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


def _status(wait_status: int) -> dict[str, Any]:
  if os.WIFSIGNALED(wait_status):
    sig = os.WTERMSIG(wait_status)
    return {"signal": sig, "signal_name": signal.Signals(sig).name}
  return {"exit_code": os.WEXITSTATUS(wait_status)}


def _tail(path: str) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return ""


class _Child:
  """The worker's side of one child: its report pipe, its seccomp listener, its exit."""

  def __init__(self, role: str, pid: int, report_fd: int, notify: socket.socket | None,
               nonce: str, job_dir: str):
    self.role, self.pid, self.report_fd, self.notify, self.nonce = (role, pid, report_fd, notify,
                                                                    nonce)
    self.job_dir = job_dir
    self.pidfd = os.pidfd_open(pid)
    self.result: dict[str, Any] | None = None
    self.forged: list[dict[str, str]] = []
    self.supervisor: sandbox.Supervisor | None = None
    self.phase = enums.STAGE_LOAD
    self.loading = False  # the candidate's process is about to execute candidate code
    self.exited = self.drained = self.killed = False
    self.wait_status: int | None = None
    self.first_line_at = self.result_at = self.exited_at = 0.0  # time.monotonic(); 0: not yet
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
      if message["phase"] == "CANDIDATE_LOADING" and self.role == CANDIDATE:
        self.loading = True
      elif self.role == JUDGE and message["phase"].startswith("STAGE_"):
        self.phase = message["phase"]
        _send(out, {"type": "phase", "job_id": job_id, "phase": message["phase"]})
    elif message.get("type") == "budget" and self.role == JUDGE:
      # The next stretch's time budget (run/budget.py): only the judge may set one.
      seconds = message.get("seconds")
      if isinstance(seconds, (int, float)) and 0 < seconds < float("inf"):
        _send(out, {"type": "budget", "job_id": job_id, "seconds": float(seconds),
                    "why": str(message.get("why", ""))[:400]})
    elif message.get("type") == "result":
      if message.get("nonce") != self.nonce or not isinstance(message.get("result"), dict):
        self.forged.append({"kind": enums.MONKEY_PATCH,
                            "evidence": "wrote a forged result to the verifier's report pipe"})
      elif self.result is None:
        self.result = message["result"]
        self.result_at = time.monotonic()

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

  def reap(self) -> dict[str, Any]:
    if self.wait_status is None:
      _, self.wait_status = os.waitpid(self.pid, 0)
    os.close(self.pidfd)
    os.close(self.report_fd)
    if self.supervisor is not None:
      self.supervisor.close()
    if self.notify is not None:
      self.notify.close()
    return _status(self.wait_status)

  @property
  def violations(self) -> list[dict[str, str]]:
    return (self.supervisor.violations if self.supervisor else []) + self.forged


def _serve_children(children: list[_Child], out: TextIO, job_id: str) -> None:
  """Serves both children until they exited and their pipes are drained. A child that lingers
  after the other one is done (the judge finished and the candidate's threads keep its process
  alive, or the other way round) is killed after a grace period."""
  poller = select.poll()
  owner: dict[int, tuple[_Child, str]] = {}

  def watch(child: _Child, fd: int, what: str) -> None:
    poller.register(fd, select.POLLIN)
    owner[fd] = (child, what)

  for child in children:
    watch(child, child.pidfd, "exit")
    watch(child, child.report_fd, "report")
    if child.notify is not None:
      watch(child, child.notify.fileno(), "notify")
  deadline = None
  while not all(c.drained and c.exited for c in children):
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    events = poller.poll(None if timeout is None else int(timeout * 1000))
    if not events and deadline is not None:
      for child in children:
        if not child.exited:
          child.kill()
          child.killed = True
        elif not child.drained:  # exited, but a grandchild still holds the pipe open
          child.drained = True
          poller.unregister(child.report_fd)
      deadline = time.monotonic() + _EXIT_GRACE_S
      continue
    for fd, _ in events:
      child, what = owner[fd]
      if what == "exit":
        child.exited = True
        child.exited_at = time.monotonic()
        poller.unregister(fd)
        _, child.wait_status = os.waitpid(child.pid, 0)
        deadline = time.monotonic() + _EXIT_GRACE_S
      elif what == "report":
        child.read(out, job_id)
        if child.drained:
          poller.unregister(fd)
      elif what == "notify":
        poller.unregister(fd)
        try:
          _, fds, _, _ = socket.recv_fds(child.notify, 1, 1)
        except OSError:
          fds = []
        if fds:
          child.supervisor = sandbox.Supervisor(fds[0])
          watch(child, fds[0], "seccomp")
      elif what == "seccomp":
        child.supervisor.handle()


def _stage_modules(job: dict[str, Any], job_dir: str) -> None:
  """Copies the job's built modules out of the compile cache into its own folder."""
  modules = job.get("modules")
  if not modules:
    return
  staged = {}
  for i, (fingerprint, path) in enumerate(sorted(modules.items())):
    folder = os.path.join(job_dir, "ext", str(i))
    os.makedirs(folder)
    staged[fingerprint] = shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))
    os.chmod(staged[fingerprint], 0o555)
  job["modules"] = staged


def serve(device: str, out: TextIO, sandbox_spec: dict[str, Any]) -> None:
  """Reads jobs from stdin until EOF, two forked children per job (`run_job`).

  This process must never initialise CUDA (nor call torch.cuda.is_available(), which poisons
  fork on recent torch): every child creates its own context. It also stays single-threaded,
  since fork() copies only the calling thread (and a user namespace needs a single thread).
  """
  import torch  # pylint: disable=import-outside-toplevel
  # Imported once here, inherited by every job's processes.
  from verifier_service.trusted import judge, verdict  # pylint: disable=import-outside-toplevel,unused-import
  from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
  child.prepare_worker()
  sandbox_spec = dict(sandbox_spec, read_only=sandbox.default_read_only(
      sandbox_spec.get("read_only", [])))
  threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
  _send(out, {"type": "ready", "pid": os.getpid(), "device": device, "threads": threads,
              "torch_version": torch.__version__, "cuda_version": torch.version.cuda or "",
              "sandbox": probe(sandbox_spec)})
  for line in sys.stdin:
    if not line.strip():
      continue
    job = json.loads(line)
    _send(out, {"type": "accepted", "job_id": job["job_id"]})  # before any child exists
    job["device"] = device
    job["sandbox"] = _scaled(sandbox_spec, job.pop("memory_scale", 1))
    _send(out, run_job(job, out))


def _scaled(spec: dict[str, Any], scale: Any) -> dict[str, Any]:
  """The sandbox settings of a job that holds `scale` slots of its GPU (pool.WorkerPool.run,
  exclusive): each GPU memory fraction times `scale`, at most 0.9 of the GPU."""
  if not isinstance(scale, int) or scale <= 1:
    return spec
  keys = ("gpu_memory_fraction", "judge_gpu_memory_fraction")
  return dict(spec, **{k: min(0.9, spec[k] * scale) for k in keys if spec.get(k)})


def run_job(job: dict[str, Any], out: TextIO | None = None) -> dict[str, Any]:
  """Forks the judge and the candidate's process for one job, serves both, merges their reports.

  `job` carries sources, options, modules and the sandbox settings; `out` gets "started" and
  "phase" messages (None: nobody listens). Returns the "done" message, whose "result" is the
  Verdict-shaped dict. Also the entry point for one verification without a worker pool or a
  sandbox (the naive path of benchmarks/verifier_throughput.py): a job of sources, "options"
  (config.resolve_options), "kernel_names", "device", "job_id" and "modules" (None: the
  candidate's load_inline compiles with torch's own).

  1. Copy the job's built modules into the candidate's folder (`_stage_modules`).
  2. Fork the judge, then the candidate's process (`_fork_job`).
  3. Serve both until they exited and their pipes are drained (`_serve_children`).
  4. Reap both and merge their reports into the verdict (`_merge`).
  5. Attach the candidate's log tail; remove both folders.
  An OSError in 1-2 (copying, forking) is the verifier's: both children die, the result is None.
  The "done" message also carries `worker_timings`: where the job's seconds went in this process
  (`_timings`).
  """
  out = out if out is not None else io.StringIO()
  job.setdefault("sandbox", {"enabled": False})
  cand_dir = tempfile.mkdtemp(prefix="dice-job-")
  judge_dir = tempfile.mkdtemp(prefix="dice-judge-")
  done: dict[str, Any] = {"type": "done", "job_id": job["job_id"], "result": None}
  children: list[_Child] = []
  marks = {"start": time.monotonic()}
  try:
    _stage_modules(job, cand_dir)  # 1
    marks["staged"] = time.monotonic()
    children = _fork_job(job, cand_dir, judge_dir, out)  # 2
    marks["forked"] = time.monotonic()
    _serve_children(children, out, job["job_id"])  # 3
    marks["served"] = time.monotonic()
    done.update(_merge(job_lib.JobOptions.from_json(job["options"]), children))  # 4
    marks["merged"] = time.monotonic()
  except OSError as e:
    for child in children:
      child.kill()
    done.update(status={"exit_code": -1, "error": str(e)})
  done["log_tail"] = _tail(os.path.join(cand_dir, "output.log"))  # 5
  shutil.rmtree(cand_dir, ignore_errors=True)
  shutil.rmtree(judge_dir, ignore_errors=True)
  marks["end"] = time.monotonic()
  done["worker_timings"] = _timings(marks, children)
  return done


def _timings(marks: dict[str, float], children: list[_Child]) -> dict[str, float]:
  """Seconds of one job in the worker, part by part (a part that did not happen is left out):
  stage_modules, fork; judge_start (fork to the judge's first message: its process set-up before
  the load stage), judge_run (from there to its result: the stages it reports); exit (the judge's
  result to both children exited and drained: the candidate's final checks and both processes'
  exits, CUDA contexts included; judge_exit and candidate_exit from the same moment); merge;
  cleanup (log tails, folders); total; and the judge's own parts of its run, from its report
  (trusted/judge.Judge.part)."""
  spans = {"stage_modules": ("start", "staged"), "fork": ("staged", "forked"),
           "merge": ("served", "merged")}
  out = {name: marks[b] - marks[a] for name, (a, b) in spans.items() if a in marks and b in marks}
  judge = next((c for c in children if c.role == JUDGE), None)
  if judge is not None and isinstance((judge.result or {}).get("timing_parts"), dict):
    out.update({k: v for k, v in judge.result["timing_parts"].items()
                if isinstance(v, (int, float))})
  if judge is not None and "forked" in marks and judge.first_line_at:
    out["judge_start"] = judge.first_line_at - marks["forked"]
    if judge.result_at:
      out["judge_run"] = judge.result_at - judge.first_line_at
      if "served" in marks:
        out["exit"] = marks["served"] - judge.result_at
      for child in children:  # each process's exit, counted from the judge's result
        if child.exited_at:
          out[f"{child.role}_exit"] = child.exited_at - judge.result_at
  out["cleanup"] = marks["end"] - marks.get("merged", marks["end"])
  out["total"] = marks["end"] - marks["start"]
  return {k: round(v, 4) for k, v in out.items()}


def _merge(options: job_lib.JobOptions, children: list[_Child]) -> dict[str, Any]:
  """Reaps both children; their exit statuses and the verdict merged from their reports."""
  from verifier_service.trusted import verdict  # pylint: disable=import-outside-toplevel
  sides = {}
  for child in children:
    status = dict(child.reap(), **({"killed_by_worker": True} if child.killed else {}))
    sides[child.role] = {"report": child.result, "status": status, "phase": child.phase,
                         "loading": child.loading,
                         "log_tail": _tail(os.path.join(child.job_dir, "output.log"))}
  violations = [v for child in children for v in child.violations]
  return {"status": {role: side["status"] for role, side in sides.items()},
          "result": verdict.merge(options, sides[JUDGE], sides[CANDIDATE], violations)}


def _fork_job(job: dict[str, Any], cand_dir: str, judge_dir: str, out: TextIO) -> list[_Child]:
  """Forks the judge, then the candidate's process; returns their worker-side handles."""
  nonce = secrets.token_hex(16)
  judge_end, cand_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
  children = []
  for role, job_dir, boundary in ((JUDGE, judge_dir, judge_end), (CANDIDATE, cand_dir, cand_end)):
    report_r, report_w = os.pipe()
    notify_parent = notify_child = None
    if role == CANDIDATE:
      notify_parent, notify_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
      os.close(report_r)
      _child(role, job, job_dir, nonce, report_w, boundary, notify_child)
    os.close(report_w)
    if notify_child is not None:
      notify_child.close()
    children.append(_Child(role, pid, report_r, notify_parent, nonce, job_dir))
  judge_end.close()
  cand_end.close()
  _send(out, {"type": "started", "job_id": job["job_id"], "pid": children[1].pid,
              "pids": [children[1].pid, children[0].pid]})
  return children


def probe(spec: dict[str, Any]) -> dict[str, str]:
  """Applies the sandbox in a throwaway child (no CUDA) and reports each layer's state."""
  if not spec["enabled"]:
    return {"sandbox": "off: disabled by --no-sandbox"}
  job_dir = tempfile.mkdtemp(prefix="dice-probe-")
  read_fd, write_fd = os.pipe()
  pid = os.fork()
  if pid == 0:
    code = 1
    try:
      os.close(read_fd)
      netns = sandbox.enter_namespaces()
      policy = sandbox.Policy(job_dir=job_dir, read_only=spec["read_only"], uid=spec["uid"])
      _write_line(write_fd, sandbox.lock_down(policy, netns, None))
      code = 0
    except BaseException as e:  # pylint: disable=broad-except
      _write_line(write_fd, {"error": f"{type(e).__name__}: {e}"})
    finally:
      os._exit(code)  # pylint: disable=protected-access
  os.close(write_fd)
  with os.fdopen(read_fd) as f:
    text = f.read()
  os.waitpid(pid, 0)
  shutil.rmtree(job_dir, ignore_errors=True)
  try:
    return json.loads(text)
  except ValueError:
    return {"error": "sandbox probe died"}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                      help="cuda: the GPU in CUDA_VISIBLE_DEVICES; cpu: test mode only")
  parser.add_argument("--sandbox", default="{}",
                      help="JSON sandbox settings from the pool (see pool.sandbox_spec)")
  args = parser.parse_args(argv)
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  serve(args.device, out, json.loads(args.sandbox))


if __name__ == "__main__":
  main()
