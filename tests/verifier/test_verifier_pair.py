"""A job's pair of processes as the worker serves them (worker/pair.py), with real forked children.

The children here are not job processes: each writes a nonce-stamped report on its pipe as
worker/job_process.py does, and the candidate's installs the real seccomp filter with its
listener (run/sandbox.py, as lock_down does) on a thread that makes one refused call, which the
worker's Supervisor answers, and then ends: the listener hangs up while the process still lives,
as it does for a while when a job's process exits.
"""

from __future__ import annotations

import io
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

from verifier_service.run import envelope
from verifier_service.run import sandbox
from verifier_service.worker import job_process
from verifier_service.worker import pair as pair_lib

_needs_seccomp = pytest.mark.skipif(sandbox.pyseccomp is None,
                                    reason="no pyseccomp/libseccomp here")

NONCE = "0" * 32
_ALIVE_S = 10.0  # how long a child waits for its start channel to close before it exits on its own


def _child(role: str, report_w: int, start_r: int, notify: socket.socket | None) -> None:
  """Body of a forked child: (the candidate's) one refused call on a filtered thread that then
  ends, its report, then alive until its start channel closes or _ALIVE_S passes."""
  code = 1
  try:
    keep = {report_w, start_r} | ({notify.fileno()} if notify is not None else set())
    job_process._close_other_fds(keep)  # pylint: disable=protected-access  (the other's pipes)
    if notify is not None:
      def filtered() -> None:
        sandbox._seccomp(notify)  # pylint: disable=protected-access
        try:
          os.kill(os.getppid(), 0)  # another process: refused, and reported to the worker
        except PermissionError:
          pass
      thread = threading.Thread(target=filtered)
      thread.start()
      thread.join()
      task = f"/proc/self/task/{thread.native_id}"
      deadline = time.monotonic() + 5.0  # the thread's task gone too: the listener hangs up
      while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.005)
      time.sleep(0.05)
    report = (envelope.JudgeReport(stage="STAGE_DONE", outcome="OK") if role == pair_lib.JUDGE
              else envelope.CandidateReport(finished=True))
    pair_lib.write_line(report_w, {"type": "result", "nonce": NONCE, "result": report.to_json(),
                                   "at": time.monotonic()})
    select.select([start_r], [], [], _ALIVE_S)
    code = 0
  finally:
    os._exit(code)  # pylint: disable=protected-access


def _fork(role: str, folder: str) -> pair_lib.Process:
  report_r, report_w = os.pipe()
  start_parent, start_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  parent_end = child_end = None
  if role == pair_lib.CANDIDATE:
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
  pid = os.fork()
  if pid == 0:
    _child(role, report_w, start_child.fileno(), child_end)
  os.close(report_w)
  start_child.close()
  if child_end is not None:
    child_end.close()
  return pair_lib.Process(role, pid, report_r, start_parent, parent_end, NONCE, folder)


def _serve_once(folder: str) -> dict:
  """One pair forked and served as the worker does; what serving it saw."""
  judge_dir, cand_dir = os.path.join(folder, "judge"), os.path.join(folder, "job")
  os.makedirs(judge_dir)
  os.makedirs(cand_dir)
  pair = pair_lib.Pair(_fork(pair_lib.JUDGE, judge_dir), _fork(pair_lib.CANDIDATE, cand_dir))
  try:
    start = time.monotonic()
    pair.serve(io.StringIO(), "job")
    served_s = time.monotonic() - start
    alive = [p.role for p in pair.processes if not p.exited]
    violations = pair.candidate.violations  # the supervisor's, until the pair is reaped
  finally:
    pair.discard()  # closes the start channels: both exit, and are reaped
  return {"reported": [p.role for p in pair.processes if p.result is not None],
          "violations": violations, "alive": alive, "served_s": served_s}


@_needs_seccomp
def test_a_job_ends_at_both_reports_though_the_candidates_listener_hung_up(tmp_path):
  """Once both processes reported, `serve` returns without waiting for their exits (a CUDA
  context's teardown on a GPU): a seccomp listener whose filter has no task left (hung up, as it is
  while the candidate's process exits) is let go, not polled until the process is reaped.

  Run in a fresh interpreter, as the worker is one: children forked from this test process
  would inherit whatever earlier tests started in it (gRPC's threads, which a fork disturbs)."""
  proc = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  seen = json.loads(proc.stdout.strip().splitlines()[-1])
  assert seen["reported"] == [pair_lib.JUDGE, pair_lib.CANDIDATE], seen
  # The supervisor still answered the refused call while the listener was there.
  assert any("kill" in v["evidence"] for v in seen["violations"]), seen
  assert seen["alive"] == [pair_lib.JUDGE, pair_lib.CANDIDATE], seen
  assert seen["served_s"] < _ALIVE_S / 2, seen


@pytest.mark.parametrize("stamp", [float("nan"), float("inf"), "12.5", None, 7])
def test_a_judge_stamp_that_is_no_finite_float_is_no_clock_reading(stamp):
  """The judge's first phase line carries `at` and `job_read_at` (time.monotonic() in the judge):
  a value that is no finite float is taken for none, and the timings built on it stay off."""
  judge = pair_lib.Process(pair_lib.JUDGE, os.getpid(), -1, None, None, NONCE, "")
  try:
    judge.line(json.dumps({"type": "phase", "phase": "STAGE_LOAD", "at": stamp,
                           "job_read_at": stamp}).encode(), io.StringIO(), "job")
    assert judge.began_at == 0.0 and judge.job_read_at == 0.0
    began = judge.first_line_at - 5.0  # before the worker read the line, as a real stamp is
    judge.line(json.dumps({"type": "phase", "phase": "STAGE_LOAD", "at": began,
                           "job_read_at": stamp}).encode(), io.StringIO(), "job")
    assert judge.began_at == began and judge.job_read_at == 0.0
  finally:
    os.close(judge.pidfd)


if __name__ == "__main__":
  print(json.dumps(_serve_once(sys.argv[1])))
