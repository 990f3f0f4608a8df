"""The body of a job's forked process (the judge or the candidate's), up to its job and through it.

Forked by worker/pair.py from the worker (torch imported, no CUDA). It enters its namespaces, keeps
only its own descriptors, moves into its own folder, and waits on its start pipe: `s` makes its
trusted setup (what needs more than the sandbox allows: CUDA context, memory cap, imports;
trusted/judge.setup, untrusted/child.trusted_setup), `g` starts the job the worker wrote into
its folder as `job.json` (a run/envelope.Envelope, read and removed before anything untrusted
runs); end of file ends a process whose pair was never used. Then the sandbox (`lock_down`, when
the role's code asks for it), the role's run, and one nonce-stamped result line on its report
pipe (its JudgeReport or CandidateReport), with when it was written (`at`, for the worker's timings).
"""

from __future__ import annotations

import faulthandler
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


def _wait_for(start_fd: int) -> bytes:
  """The next byte on the start pipe; end of file (the worker dropped this pair): exit."""
  byte = os.read(start_fd, 1)
  if not byte:
    os._exit(0)  # pylint: disable=protected-access
  return byte


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
                report_fd: int, start_fd: int, boundary: socket.socket,
                notify: socket.socket | None) -> None:
  """Runs in a forked child (the judge or the candidate's process); never returns."""
  code = 70
  try:
    os.setsid()
    netns = sandbox.enter_namespaces() if spec["enabled"] else "off: disabled"
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the job pipe is the worker's, not the children's
    log_fd = os.open(os.path.join(job_dir, "output.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    keep = {report_fd, start_fd, boundary.fileno()} | ({notify.fileno()} if notify else set())
    _close_other_fds(keep)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable()
    os.chdir(job_dir)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from verifier_service.run import wire  # pylint: disable=import-outside-toplevel
    setup = None
    while _wait_for(start_fd) != b"g":  # `s` then `g`: the job is read once the set-up is made
      setup = setup or _setup(role, device, spec)
    setup = {**(setup or _setup(role, device, spec)), "job_read_at": time.monotonic()}
    with open(JOB_FILE, encoding="utf-8") as f:
      job = envelope.Envelope.from_json(json.load(f))
    os.unlink(JOB_FILE)
    os.close(start_fd)
    if spec["enabled"]:
      policy = sandbox.Policy(job_dir=job_dir, read_only=spec["read_only"], uid=spec["uid"],
                              memory_bytes=spec["memory_bytes"], cpu_s=spec["cpu_s"],
                              file_bytes=spec["file_bytes"], strict=spec["strict"])

    def lock_down() -> dict[str, str]:
      if not spec["enabled"]:
        return {"sandbox": "off: disabled by --no-sandbox"}
      return sandbox.lock_down(policy, netns, notify)

    emit = lambda msg: write_line(report_fd, {"type": "phase", **msg})
    chan = wire.Channel(boundary)
    result: envelope.JudgeReport | envelope.CandidateReport
    if role == JUDGE:
      from verifier_service.trusted import judge  # pylint: disable=import-outside-toplevel
      result = judge.run(job, chan, emit, lock_down, setup)
    else:
      from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
      result = child.run(job, chan, emit, lock_down, setup)
    write_line(report_fd, {"type": "result", "nonce": nonce, "result": result.to_json(),
                           "at": time.monotonic()})
    code = 0
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


