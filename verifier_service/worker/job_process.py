"""The body of a job's forked process (the judge or the candidate's), up to its job and through it.

Forked by worker/pair.py from the worker (torch imported, no CUDA). It enters its namespaces, keeps
only its own descriptors, moves into its own folder, and waits on its start channel (a unix
socket): `s` makes its trusted setup (what needs more than the sandbox allows: CUDA context,
memory cap, imports; trusted/judge.setup, untrusted/child.trusted_setup), `g` starts the job the
worker wrote into its folder as `job.json` (a run/envelope.Envelope, read and removed before
anything untrusted runs); end of file ends a process the worker no longer needs. Then the sandbox
(`lock_down`, when the role's code asks for it, once), the role's run, and one nonce-stamped
result line on its report pipe (its JudgeReport or CandidateReport), with when it was written
(`at`, for the worker's timings). The candidate's process then exits; the judge waits for its
next `g` (with that job's socket and nonce) until its channel closes: a worker that keeps judges
(`judge_jobs`, worker/process.py) hands it more jobs, inside the sandbox its first job made.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from verifier_service.run import envelope
from verifier_service.run import sandbox

JOB_FILE = "job.json"
JUDGE, CANDIDATE = "judge", "candidate"
_FOLDER_NAMES = {JUDGE: "judge", CANDIDATE: "job"}


def folder_prefix(role: str, tag: str = "") -> str:
  """How the folder of a job's `role` process is named (worker/pair.py), with the pool's tag of
  the worker that made it, by which the pool removes a killed worker's folders (service/pool.py)."""
  return f"dice-{_FOLDER_NAMES[role]}-" + (f"{tag}-" if tag else "")


def write_line(fd: int, message: dict[str, Any]) -> None:
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


def _wait_for(start: socket.socket) -> tuple[bytes, bytes, list[int]]:
  """The next message on the start channel: its command (`s`, `g`), what follows it (the judge's
  nonce) and the descriptors it carries (the judge's end of the job's socket). End of file (the
  worker dropped this process): exit."""
  message, fds, _, _ = socket.recv_fds(start, 64, 1)
  if not message:
    os._exit(0)  # pylint: disable=protected-access
  return message[:1], message[1:], fds


def judge_cpu_limit(cpu_s: float, jobs: int) -> int:
  """The judge's CPU-time limit (RLIMIT_CPU, whole seconds): `cpu_s` a job, for every job it may
  serve (a kept judge, worker/process.py); the worker retires it before a job could reach it."""
  return int(cpu_s) * max(1, jobs)


def _setup(role: str, device: str, spec: dict[str, Any]) -> dict[str, Any]:
  """The role's trusted setup; a failure is kept for the job's report, not raised."""
  try:
    if spec.get("blocking_sync") and device.startswith("cuda"):
      from verifier_service.run import timing  # pylint: disable=import-outside-toplevel
      timing.block_on_sync(device)  # before the role's set-up makes the context
    if role == JUDGE:
      from verifier_service.trusted import judge  # pylint: disable=import-outside-toplevel
      return {"environment": judge.setup(device, spec.get("judge_gpu_memory_fraction", 0.0))}
    from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
    return {"environment": child.trusted_setup(device, spec.get("gpu_memory_fraction", 0.0))}
  except Exception as e:  # pylint: disable=broad-except
    return {"error": f"{type(e).__name__}: {e}"}


def main(role: str, device: str, spec: dict[str, Any], job_dir: str, nonce: str,
         report_fd: int, start: socket.socket, boundary: socket.socket | None,
         notify: socket.socket | None) -> None:
  """Runs in a forked child (the judge or the candidate's process); never returns. The candidate's
  process runs one job; the judge runs jobs until its start channel closes (one unless the worker
  keeps it, worker/process.py), each on the socket and with the nonce its `g` brought."""
  code = 70
  try:
    os.setsid()
    netns = sandbox.enter_namespaces() if spec["enabled"] else "off: disabled"
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the job pipe is the worker's, not the children's
    # Appended to: the worker empties a kept judge's log before each of its later jobs.
    log_fd = os.open(os.path.join(job_dir, "output.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    keep = {report_fd, start.fileno()} | {s.fileno() for s in (boundary, notify) if s}
    _close_other_fds(keep)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable()
    os.chdir(job_dir)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from verifier_service.run import wire  # pylint: disable=import-outside-toplevel
    if spec["enabled"]:
      cpu_s = spec["cpu_s"]
      if role == JUDGE:
        cpu_s = judge_cpu_limit(cpu_s, spec.get("judge_jobs", 1))
      policy = sandbox.Policy(job_dir=job_dir, read_only=spec["read_only"], uid=spec["uid"],
                              memory_bytes=spec["memory_bytes"], cpu_s=cpu_s,
                              file_bytes=spec["file_bytes"], strict=spec["strict"])
    layers: dict[str, str] = {}

    def lock_down() -> dict[str, str]:
      """The sandbox, applied once: a kept judge's later jobs run inside the one its first made."""
      if not layers:
        layers.update(sandbox.lock_down(policy, netns, notify) if spec["enabled"]
                      else {"sandbox": "off: disabled by --no-sandbox"})
      return layers

    emit = lambda msg: write_line(report_fd, {"type": "phase", **msg})
    setup = None
    while True:
      command, extra, fds = _wait_for(start)
      setup = setup or _setup(role, device, spec)  # `s` then `g`: the job is read once set up
      if command != b"g":
        continue
      if role == JUDGE and setup is not None and not gc.get_freeze_count():
        # What the worker and the set-up made lives as long as the process: frozen, it is never
        # scanned again, and the collection after each job scans only what jobs made (a full one
        # took ~0.09 s with torch's objects on a CPU VM; a kept judge read its next job 0.12 s
        # after the hand-over on an H100 while collecting in full, BENCHMARKS.md run 25).
        gc.freeze()
      job_setup = {**setup, "job_read_at": time.monotonic()}
      with open(JOB_FILE, encoding="utf-8") as f:
        job = envelope.Envelope.from_json(json.load(f))
      os.unlink(JOB_FILE)
      result: envelope.JudgeReport | envelope.CandidateReport
      if role == JUDGE:
        from verifier_service.trusted import judge  # pylint: disable=import-outside-toplevel
        nonce = extra.decode("ascii", "replace") or nonce
        with socket.socket(fileno=fds[0]) as job_socket:
          result = judge.run(job, wire.Channel(job_socket), emit, lock_down, job_setup)
      else:
        from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
        start.close()
        result = child.run(job, wire.Channel(boundary), emit, lock_down, job_setup)
      write_line(report_fd, {"type": "result", "nonce": nonce, "result": result.to_json(),
                             "at": time.monotonic()})
      if role != JUDGE:
        code = 0
        break
      del job, result
      gc.collect()  # the job's reference and tensors, before the next job (if the worker keeps it)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access
