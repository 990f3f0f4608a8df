"""A worker process: imports torch once, then forks one child per job.

Run as `python -m verifier_service.worker --device cuda` with CUDA_VISIBLE_DEVICES naming one GPU
(the pool does this, one process per slot). Protocol: one JSON object per line. Jobs arrive on
stdin; messages leave on the process's original stdout, which is kept private (fd 1 is pointed
at stderr so that stray prints cannot corrupt it):

  {"type": "ready", "pid": ..., "torch_version": ...}            once, after importing torch
  {"type": "started", "job_id": ..., "pid": CHILD}               the child's pid (= its pgid)
  {"type": "phase", "job_id": ..., "phase": "STAGE_..."}         from the child, as it goes
  {"type": "done", "job_id": ..., "status": {...}, "result": {...} | null, "log_tail": "..."}

Why fork per job: the worker never initialises CUDA, so each child creates its own context, and a
child that hangs, crashes, corrupts its CUDA context or monkey-patches torch takes only itself
down; torch's import cost (seconds) is paid once per slot, not per job. The pool kills a child's
process group when its time is up and replaces the worker only if the worker itself dies.

`--device cpu` is the development/test mode (off by default; the server enables it only with
`--cpu-test-mode`): the same children run reference and candidate on the CPU, which lets CI
exercise spawning, crashes, hangs, timeouts, correctness, mutation and poisoning with candidates
whose load_inline has only C++ sources. It proves nothing about CUDA kernels.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import traceback
from typing import Any, TextIO

LOG_TAIL_BYTES = 4096


def _send(out: TextIO, message: dict[str, Any]) -> None:
  out.write(json.dumps(message) + "\n")
  out.flush()


def _child(job: dict[str, Any], job_dir: str, out: TextIO) -> None:
  """Runs in the forked child; never returns."""
  code = 70
  try:
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the job pipe is the worker's, not the candidate's
    log_fd = os.open(os.path.join(job_dir, "output.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir(job_dir)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from verifier_service import runner  # pylint: disable=import-outside-toplevel
    emit = lambda msg: _send(out, {"type": "phase", "job_id": job["job_id"], **msg})
    result = runner.run_job(job, emit)
    tmp = os.path.join(job_dir, "result.json.tmp")
    with open(tmp, "w") as f:
      json.dump(result, f)
    os.replace(tmp, os.path.join(job_dir, "result.json"))
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


def serve(device: str, out: TextIO) -> None:
  """Reads jobs from stdin until EOF, one forked child per job.

  This process must never initialise CUDA (nor call torch.cuda.is_available(), which poisons
  fork on recent torch): every child creates its own context. It also stays single-threaded,
  since fork() copies only the calling thread.
  """
  import torch  # pylint: disable=import-outside-toplevel
  import verifier_service.runner  # pylint: disable=import-outside-toplevel,unused-import
  threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
  _send(out, {"type": "ready", "pid": os.getpid(), "device": device, "threads": threads,
              "torch_version": torch.__version__, "cuda_version": torch.version.cuda or ""})
  for line in sys.stdin:
    if not line.strip():
      continue
    job = json.loads(line)
    job["device"] = device
    job_dir = tempfile.mkdtemp(prefix="dice-job-")
    pid = os.fork()
    if pid == 0:
      _child(job, job_dir, out)
    _send(out, {"type": "started", "job_id": job["job_id"], "pid": pid})
    _, wait_status = os.waitpid(pid, 0)
    result = None
    try:
      with open(os.path.join(job_dir, "result.json")) as f:
        result = json.load(f)
    except (OSError, ValueError):
      pass
    _send(out, {"type": "done", "job_id": job["job_id"], "status": _status(wait_status),
                "result": result, "log_tail": _tail(os.path.join(job_dir, "output.log"))})
    shutil.rmtree(job_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                      help="cuda: the GPU in CUDA_VISIBLE_DEVICES; cpu: test mode only")
  args = parser.parse_args(argv)
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  serve(args.device, out)


if __name__ == "__main__":
  main()
