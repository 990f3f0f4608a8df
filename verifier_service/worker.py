"""A worker process: imports torch once, then forks one sandboxed child per job.

Run as `python -m verifier_service.worker --device cuda` with CUDA_VISIBLE_DEVICES naming one GPU
(the pool does this, one process per slot). Protocol: one JSON object per line. Jobs arrive on
stdin; messages leave on the process's original stdout, which is kept private (fd 1 is pointed
at stderr so that stray prints cannot corrupt it, and job children never inherit it):

  {"type": "ready", "pid": ..., "torch_version": ..., "sandbox": {layer: state}}   once
  {"type": "started", "job_id": ..., "pid": CHILD}               the child's pid (= its pgid)
  {"type": "phase", "job_id": ..., "phase": "STAGE_..."}         as the child goes
  {"type": "done", "job_id": ..., "status": {...}, "result": {...} | null, "log_tail": "...",
   "violations": [{"kind": ..., "evidence": ...}]}

Why fork per job: the worker never initialises CUDA, so each child creates its own context, and a
child that hangs, crashes, corrupts its CUDA context or monkey-patches torch takes only itself
down; torch's import cost (seconds) is paid once per slot, not per job.

The child talks back over a pipe of its own (phases, then one result carrying a per-job nonce, so
a candidate that writes a result line without knowing the nonce is caught forging it) and hands
the worker its seccomp listener, through which the worker names every refused system call
(`sandbox.Supervisor`). The job's modules are copied from the compile cache into the job's folder
before the fork: the child never needs to see the cache.

`--device cpu` is the development/test mode (off by default; the server enables it only with
`--cpu-test-mode`): the same children run reference and candidate on the CPU, which lets CI
exercise spawning, the sandbox, crashes, hangs, timeouts, correctness, exploit checks and
poisoning with candidates whose load_inline has only C++ sources. It proves nothing about CUDA.
"""

from __future__ import annotations

import argparse
import faulthandler
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

from verifier_service import sandbox

LOG_TAIL_BYTES = 4096
_EXIT_GRACE_S = 2.0


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


def _child(job: dict[str, Any], job_dir: str, nonce: str, report_fd: int,
           notify: socket.socket | None) -> None:
  """Runs in the forked child; never returns."""
  code = 70
  try:
    os.setsid()
    netns = sandbox.enter_namespaces() if job["sandbox"]["enabled"] else "off: disabled"
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the job pipe is the worker's, not the candidate's
    log_fd = os.open(os.path.join(job_dir, "output.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    _close_other_fds({report_fd} | ({notify.fileno()} if notify else set()))
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable()
    os.chdir(job_dir)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from verifier_service import runner  # pylint: disable=import-outside-toplevel
    spec = job["sandbox"]
    policy = sandbox.Policy(job_dir=job_dir, read_only=spec["read_only"], uid=spec["uid"],
                            memory_bytes=spec["memory_bytes"], cpu_s=spec["cpu_s"],
                            file_bytes=spec["file_bytes"], strict=spec["strict"])

    def lock_down() -> dict[str, str]:
      if not spec["enabled"]:
        return {"sandbox": "off: disabled by --no-sandbox"}
      return sandbox.lock_down(policy, netns, notify)

    emit = lambda msg: _write_line(report_fd, {"type": "phase", **msg})
    result = runner.run_job(job, emit, lock_down)
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


class _JobChannel:
  """The worker's side of one child: its report pipe, its seccomp listener, its exit."""

  def __init__(self, pid: int, report_fd: int, notify: socket.socket, nonce: str,
               job_id: str, out: TextIO):
    self.pid, self.report_fd, self.notify, self.nonce = pid, report_fd, notify, nonce
    self.job_id, self.out = job_id, out
    self.result: dict[str, Any] | None = None
    self.forged: list[dict[str, str]] = []
    self.supervisor: sandbox.Supervisor | None = None
    self._buffer = b""

  def _line(self, line: bytes) -> None:
    try:
      message = json.loads(line)
    except ValueError:
      return
    if not isinstance(message, dict):
      return
    if message.get("type") == "phase" and isinstance(message.get("phase"), str):
      _send(self.out, {"type": "phase", "job_id": self.job_id, "phase": message["phase"]})
    elif message.get("type") == "result":
      if message.get("nonce") != self.nonce or not isinstance(message.get("result"), dict):
        self.forged.append({"kind": "MONKEY_PATCH",
                            "evidence": "wrote a forged result to the verifier's report pipe"})
      elif self.result is None:
        self.result = message["result"]

  def run(self) -> int:
    """Serves the child until it exits and its pipe is drained; returns its wait status."""
    pidfd = os.pidfd_open(self.pid)
    poller = select.poll()
    for fd in (pidfd, self.report_fd, self.notify.fileno()):
      poller.register(fd, select.POLLIN)
    exited, report_open = False, True
    deadline = None
    while report_open:
      timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
      events = poller.poll(None if timeout is None else int(timeout * 1000))
      if not events and deadline is not None:
        break  # exited, but something still holds the pipe open
      for fd, _ in events:
        if fd == pidfd:
          exited = True
          deadline = time.monotonic() + _EXIT_GRACE_S
          poller.unregister(pidfd)
        elif fd == self.report_fd:
          data = os.read(fd, 1 << 16)
          if not data:
            report_open = False
            continue
          self._buffer += data
          *lines, self._buffer = self._buffer.split(b"\n")
          for line in lines:
            self._line(line)
        elif fd == self.notify.fileno():
          poller.unregister(fd)
          try:
            _, fds, _, _ = socket.recv_fds(self.notify, 1, 1)
          except OSError:
            fds = []
          if fds:
            self.supervisor = sandbox.Supervisor(fds[0])
            poller.register(fds[0], select.POLLIN)
        elif self.supervisor is not None and fd == self.supervisor.fd:
          self.supervisor.handle()
    if not exited:
      os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
    os.close(pidfd)
    _, wait_status = os.waitpid(self.pid, 0)
    if self.supervisor is not None:
      self.supervisor.close()
    return wait_status

  @property
  def violations(self) -> list[dict[str, str]]:
    return (self.supervisor.violations if self.supervisor else []) + self.forged


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
  """Reads jobs from stdin until EOF, one forked child per job.

  This process must never initialise CUDA (nor call torch.cuda.is_available(), which poisons
  fork on recent torch): every child creates its own context. It also stays single-threaded,
  since fork() copies only the calling thread (and a user namespace needs a single thread).
  """
  import torch  # pylint: disable=import-outside-toplevel
  from verifier_service import runner  # pylint: disable=import-outside-toplevel
  runner.prepare_worker()
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
    job["device"] = device
    job["sandbox"] = sandbox_spec
    job_dir = tempfile.mkdtemp(prefix="dice-job-")
    done: dict[str, Any] = {"type": "done", "job_id": job["job_id"], "result": None}
    try:
      _stage_modules(job, job_dir)
      channel = _fork_job(job, job_dir, out)
      wait_status = channel.run()
      done.update(status=_status(wait_status), result=channel.result,
                  violations=channel.violations)
    except OSError as e:  # copying the module, forking: the verifier's problem
      done.update(status={"exit_code": -1, "error": str(e)})
    done["log_tail"] = _tail(os.path.join(job_dir, "output.log"))
    _send(out, done)
    shutil.rmtree(job_dir, ignore_errors=True)


def _fork_job(job: dict[str, Any], job_dir: str, out: TextIO) -> _JobChannel:
  nonce = secrets.token_hex(16)
  report_r, report_w = os.pipe()
  notify_parent, notify_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
  pid = os.fork()
  if pid == 0:
    os.close(report_r)
    notify_parent.close()
    _child(job, job_dir, nonce, report_w, notify_child)
  os.close(report_w)
  notify_child.close()
  _send(out, {"type": "started", "job_id": job["job_id"], "pid": pid})
  return _JobChannel(pid, report_r, notify_parent, nonce, job["job_id"], out)


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
