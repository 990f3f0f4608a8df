"""A worker process: imports torch once, then forks two sandboxed children per job, ahead of it.

Run as `python -m verifier_service.worker --device cuda` with CUDA_VISIBLE_DEVICES naming one GPU
(the pool does this, one process per slot). Protocol: one JSON object per line. Jobs arrive on
stdin (run/envelope.Job; a line that is not one ends at once in a "done" whose status names
why, and the worker reads on); messages leave on the process's original stdout, which is kept private (fd 1 is pointed
at stderr so that stray prints cannot corrupt it, and job children never inherit it):

  {"type": "ready", "pid": ..., "torch_version": ..., "sandbox": {layer: state}}   once
  {"type": "accepted", "job_id": ...}                           the job was read
  {"type": "started", "job_id": ..., "pid": CANDIDATE, "pids": [CANDIDATE, JUDGE]}  (= pgids)
  {"type": "phase", "job_id": ..., "phase": "STAGE_..."}         as the judge goes
  {"type": "budget", "job_id": ..., "seconds": ..., "why": ...}   the judge's budget for what is
                                                                 left (run/budget.py)
  {"type": "done", "job_id": ..., "result": {...}, "status": {...}, "log_tail": "..."}
  {"type": "reaped", "job_id": ..., "cpu_s": {"judge": ..., "candidate": ..., ...}}  once a job's
                                                                 processes are reaped, often after
                                                                 its "done" (Pair.cpu_report)

Each of the job's two processes gets the job as a run/envelope.Envelope and answers with a
JudgeReport or a CandidateReport, each checked where this process reads it: a report that does
not fit its type counts as no report, and the verdict names why.

The trust boundary (ARCHITECTURE.md, "The verifier's trust boundary"). Each job runs in two children forked from this process:
- the judge (trusted/judge.py) executes the reference, regenerates every input from the seeds,
  compares and times the reference: it never loads candidate code;
- the candidate's process (untrusted/child.py) executes the candidate and answers the judge's
  commands, its outputs leaving as bytes over a socket (wire.py).
Each is sandboxed on its own (sandbox.py) and they share nothing but that socket. Each reports to
this process on a pipe of its own, with a per-job nonce (a candidate that writes a result line
without knowing the nonce is caught forging it); the candidate's process also hands over its
seccomp listener, through which the worker names every refused system call (`sandbox.Supervisor`).
The worker then merges both reports (and, where one is missing, both exit statuses) into one
verdict (trusted/verdict.py): only this process and the judge decide anything.

Why fork per job: the worker never initialises CUDA, so each child creates its own context, and a
child that hangs, crashes, corrupts its CUDA context or monkey-patches torch takes only itself
down; torch's import cost (seconds) is paid once per slot, not per job. The job's modules are
copied from the compile cache into the candidate's folder: the children never need to see the
cache.

Ahead of the job (worker/pair.py): while a job runs, the next job's pair is already forked and makes
its CUDA contexts once the running judge's timing is over (`standby`, on unless the spec says
otherwise; `standby_setup: "fork"` makes them as soon as the pair is forked; `standby_pairs: N`
keeps N pairs waiting, so that each has N jobs' time to make its contexts), and a finished job's
processes exit after its verdict is sent, not before. A job whose sandbox settings differ from the
slot's (a retry alone on its GPU, with every slot's memory) gets a pair forked for it.

Kept judges (`judge_jobs: N` above 1, standby on): the judge of a job it ran cleanly
(`Pair.judge_reusable`) serves the slot's next job too, up to N jobs, and the standbys are
candidates' processes alone; a reserve judge, forked and set up with them, takes over when the
kept one is replaced (after a crash, a hang, a refused call, a changed torch global, N jobs).
Every job still gets a candidate's process of its own; the candidate's code never runs in the
judge's, and a kept judge only ever talks to a candidate's process through that job's socket.

`--device cpu` is the development/test mode (off by default; the server enables it only with
`--cpu-test-mode`): the same children run reference and candidate on the CPU, which lets CI
exercise the boundary, the sandbox, crashes, hangs, timeouts, correctness, exploit checks and
poisoning with candidates whose load_inline has only C++ sources. It proves nothing about CUDA.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import select
import shutil
import sys
import tempfile
import time
from typing import Any, TextIO

from verifier_service.run import envelope
from verifier_service.run import job as job_lib
from verifier_service.worker import pair as pair_lib
from verifier_service.run import sandbox

JUDGE, CANDIDATE = pair_lib.JUDGE, pair_lib.CANDIDATE


class _Lines:
  """Lines from a descriptor, read as they come (stdin of the worker, polled with other fds)."""

  def __init__(self, fd: int):
    self.fd, self._buffer, self.closed = fd, b"", False

  def read(self) -> list[bytes]:
    data = os.read(self.fd, 1 << 20)
    if not data:
      self.closed = True
      return [self._buffer] if self._buffer.strip() else []
    self._buffer += data
    *lines, self._buffer = self._buffer.split(b"\n")
    return [line for line in lines if line.strip()]


def serve(device: str, out: TextIO, sandbox_spec: dict[str, Any]) -> None:
  """Reads jobs from stdin until EOF, two forked children per job (`run_job`).

  This process must never initialise CUDA (nor call torch.cuda.is_available(), which poisons
  fork on recent torch): every child creates its own context. It also stays single-threaded,
  since fork() copies only the calling thread (and a user namespace needs a single thread).
  While it waits for a job it collects the exits of finished jobs' processes.
  """
  import torch  # pylint: disable=import-outside-toplevel
  # Imported once here, inherited by every job's processes.
  from verifier_service.trusted import judge, verdict  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
  from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
  child.prepare_worker()
  sandbox_spec = dict(sandbox_spec, read_only=sandbox.default_read_only(
      sandbox_spec.get("read_only", [])))
  threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
  send(out, {"type": "ready", "pid": os.getpid(), "device": device, "threads": threads,
             "torch_version": torch.__version__, "cuda_version": torch.version.cuda or "",
             "sandbox": probe(sandbox_spec)})
  slot = _Slot(device, sandbox_spec, out)
  slot.prepare_next(None)  # the first job's pair, set up while no job is waiting
  slot.set_up_next()
  stdin = _Lines(sys.stdin.fileno())
  try:
    while not stdin.closed:
      fds = {p.pidfd: pair for pair in slot.retiring for p in pair.owned()}
      ready, _, _ = select.select([stdin.fd, *fds], [], [])
      if any(fd in fds for fd in ready):
        slot.collect()
      if stdin.fd in ready:
        for line in stdin.read():
          job, refused = _job(line)
          if job is None:  # the pool's slip: the job ends here, named, and the worker goes on
            send(out, refused)
            continue
          send(out, {"type": "accepted", "job_id": job.job_id})  # before any child runs it
          send(out, slot.run(job, out))
  finally:
    slot.close()


send = pair_lib.send


def _job(line: bytes) -> tuple[envelope.Job | None, dict[str, Any]]:
  """The job on one line from the pool, or the "done" message that refuses it (with its job_id
  where the line has one, so that the pool's wait ends)."""
  try:
    data = json.loads(line)
  except ValueError as e:
    return None, {"type": "done", "job_id": None, "result": None,
                  "status": {"exit_code": -1, "error": f"job refused: not JSON: {e}"}}
  try:
    return envelope.Job.from_json(data), {}
  except ValueError as e:
    job_id = data.get("job_id") if isinstance(data, dict) else None
    return None, {"type": "done", "job_id": job_id if isinstance(job_id, str) else None,
                  "result": None, "status": {"exit_code": -1, "error": f"job refused: {e}"}}


class _Slot:
  """The worker's pairs: the one running a job, the standbys for the next (`standby_pairs` of
  them, oldest first), the finished ones; with `judge_jobs` above 1 also the judge kept from the
  last job and a reserve judge (forked and set up ahead, for when the kept one is replaced)."""

  def __init__(self, device: str, spec: dict[str, Any], out: TextIO):
    self.device, self.spec, self.out = device, spec, out
    self.standby_on = bool(spec.get("standby", True))
    self.setup_at_fork = spec.get("standby_setup") == "fork"
    self.ahead = max(1, int(spec.get("standby_pairs", 1)))
    self.judge_jobs = max(1, int(spec.get("judge_jobs", 1)))
    self.keeping = self.standby_on and self.judge_jobs > 1
    self.standbys: collections.deque[pair_lib.Pair] = collections.deque()
    self.retiring: list[pair_lib.Pair] = []
    self.judge: pair_lib.Process | None = None  # kept from the last job, waiting for the next
    self.reserve: pair_lib.Process | None = None
    self.reserve_set_up = False

  def run(self, job: envelope.Job, out: TextIO) -> dict[str, Any]:
    spec = _scaled(self.spec, job.memory_scale)
    if not self.standby_on:  # each job forked for it and reaped before its verdict is sent
      return run_job(job, self.device, spec, out)
    pair, waited, lead = None, 0.0, 0.0
    if spec is self.spec and self.standbys:
      pair = self.standbys.popleft()
      if not pair.alive() or (self.keeping and not self._attach_judge(pair)):
        pair.discard()  # a standby process died while waiting: not this job's to pay for
        pair = None
      else:
        now = time.monotonic()
        waited, lead = now - pair.forked_at, (now - pair.set_up_at if pair.set_up else 0.0)
    done = run_job(job, self.device, spec, out, pair=pair, before_serving=self.prepare_next,
                   on_timed=self.set_up_next,
                   judge_jobs=self.judge_jobs if pair is not None else 1)
    done["worker_timings"]["standby_age"] = round(waited, 4)
    if pair is not None:  # how long its set-up had before the job came (0: none)
      done["worker_timings"]["standby_lead"] = round(lead, 4)
      if self.keeping and pair.keep_judge:
        self.judge = pair.judge
    self.set_up_next()
    return done

  def _attach_judge(self, pair: pair_lib.Pair) -> bool:
    """Gives `pair` (forked without a judge) the judge kept from the last job if it still waits,
    else the reserve, else one forked now; False if none could be forked."""
    judge, self.judge = _waiting(self.judge), None
    self.reserve = _waiting(self.reserve)  # one that died is replaced by `prepare_next`
    if judge is None and self.reserve is not None:
      judge, self.reserve, self.reserve_set_up = self.reserve, None, False
    if judge is None:
      try:
        judge = pair_lib.fork(JUDGE, self.device, self.spec, "")
      except OSError:
        return False
    pair.attach(judge)
    return True

  def prepare_next(self, running: pair_lib.Pair | None) -> None:
    """Forks the next jobs' pairs (up to `standby_pairs` waiting; without their judges where
    judges are kept, with a reserve judge instead) while this one runs; they set up once this
    one's timing is over, or at once with `standby_setup: "fork"`."""
    if running is not None:
      self.retiring.append(running)
    while self.standby_on and len(self.standbys) < self.ahead:
      try:
        self.standbys.append(pair_lib.Pair.fork(self.device, self.spec,
                                                with_judge=not self.keeping))
      except OSError:
        break  # the next job forks its own
    if self.keeping and (self.reserve is None or self.reserve.wait_status is not None):
      with contextlib.suppress(OSError):  # else the next replacement is forked when needed
        self.reserve, self.reserve_set_up = pair_lib.fork(JUDGE, self.device, self.spec, ""), False
    if self.setup_at_fork:
      self.set_up_next()

  def set_up_next(self) -> None:
    """Lets every waiting pair (and the reserve judge) set up (one that did already is left as
    it is)."""
    for pair in self.standbys:
      pair.setup()
    if self.reserve is not None and not self.reserve_set_up:
      self.reserve_set_up = True
      with contextlib.suppress(OSError):
        self.reserve.tell(b"s")

  def collect(self) -> None:
    """Reaps the finished pairs that have exited, each reported as "reaped"."""
    still = []
    for pair in self.retiring:
      if pair.reap():
        _send_reaped(self.out, pair)
      else:
        still.append(pair)
    self.retiring = still

  def close(self) -> None:
    while self.standbys:
      self.standbys.popleft().discard()
    for pair in self.retiring:
      pair.kill()
      pair.reap(block=True)
    for judge in (self.judge, self.reserve):
      if judge is not None and judge.wait_status is None:
        judge.end()
    self.judge = self.reserve = None


def _waiting(judge: pair_lib.Process | None) -> pair_lib.Process | None:
  """`judge` if it still waits for a job; one that died while waiting is reaped, and None."""
  if judge is None or judge.wait_status is not None:
    return None
  if judge.gone():
    judge.end()
    return None
  return judge


def _scaled(spec: dict[str, Any], scale: int) -> dict[str, Any]:
  """The sandbox settings of a job that holds `scale` slots of its GPU (pool.WorkerPool.run,
  exclusive): each GPU memory fraction times `scale`, at most 0.9 of the GPU."""
  if scale <= 1:
    return spec
  keys = ("gpu_memory_fraction", "judge_gpu_memory_fraction")
  return dict(spec, **{k: min(0.9, spec[k] * scale) for k in keys if spec.get(k)})


def run_job(job: envelope.Job, device: str, spec: dict[str, Any] | None = None,
            out: TextIO | None = None, pair: pair_lib.Pair | None = None,
            before_serving=None, on_timed=None, judge_jobs: int = 1) -> dict[str, Any]:
  """Runs one job in a pair of processes (`pair`, set up ahead, or one forked now), merges their
  reports.

  `device` and `spec` (the sandbox settings; None: no sandbox) are the slot's; `out` gets
  "started" and "phase" messages (None: nobody listens). Returns the "done" message, whose
  "result" is the Verdict-shaped dict. Also the entry point for one verification without a worker
  pool or a sandbox (the naive path of benchmarks/verifier_throughput.py, whose job's modules are
  None: the candidate's load_inline compiles with torch's own).

  1. Fork the pair unless one is given; copy the job's modules into the candidate's folder and
     hand both processes the job (`Pair.start`).
  2. `before_serving(pair)` (the worker: fork the next pair, and keep this one to reap later);
     without it this pair is reaped here, after the verdict is made.
  3. Serve both until both reported, or until both exited (`Pair.serve`).
  4. Merge their reports into the verdict (`_merge`), with the candidate's log tail.
  5. With `judge_jobs` above 1 (the slot's pair), whether the judge serves the slot's next job
     (`Pair.judge_reusable`); every other process of the job is retired.
  An OSError in 1 (copying, forking) is the verifier's: both children die, the result is None.
  The "done" message also carries `worker_timings`: where the job's seconds went in this process
  (`_timings`).
  """
  out = out if out is not None else io.StringIO()
  spec = spec if spec is not None else {"enabled": False}
  done: dict[str, Any] = {"type": "done", "job_id": job.job_id, "result": None}
  marks = {"start": time.monotonic()}
  try:
    if pair is None:
      pair = pair_lib.Pair.fork(device, spec)  # 1
    marks["forked"] = time.monotonic()
    pair.start(envelope.Envelope(job=job, device=device, share=envelope.Share.of(spec)))
    marks["staged"] = time.monotonic()
    send(out, {"type": "started", "job_id": job.job_id, "pid": pair.candidate.pid,
               "pids": [pair.candidate.pid, pair.judge.pid]})
  except OSError as e:
    if pair is not None:
      pair.kill()
      pair.reap(block=True)
    done.update(status={"exit_code": -1, "error": str(e)})
    marks["end"] = time.monotonic()
    done["worker_timings"] = _timings(marks, None)
    return done
  if before_serving is not None:
    before_serving(pair)  # 2
  marks["prepared"] = time.monotonic()
  pair.serve(out, job.job_id, on_timed)  # 3
  marks["served"] = time.monotonic()
  done.update(_merge(job.options, pair))  # 4
  done["log_tail"] = pair_lib.tail(os.path.join(pair.cand_dir, "output.log"))
  if judge_jobs > 1:  # 5
    pair.keep_judge = pair.judge_reusable((done["result"] or {}).get("outcome"), judge_jobs,
                                          spec.get("cpu_s", 0))
  marks["merged"] = time.monotonic()
  pair.retire()
  if before_serving is None:
    pair.reap(block=True)
    _send_reaped(out, pair)
  marks["end"] = time.monotonic()
  done["worker_timings"] = _timings(marks, pair)
  done["judge_job"] = pair.judge_job  # 1: its judge's first job; more: a kept judge's
  return done


def _send_reaped(out: TextIO, pair: pair_lib.Pair) -> None:
  report = pair.cpu_report()
  if report is not None:
    send(out, report)


def _timings(marks: dict[str, float], pair: pair_lib.Pair | None) -> dict[str, float]:
  """Seconds of one job in the worker, part by part (a part that did not happen is left out):
  fork (0 for a pair forked ahead), stage_modules (copying modules and handing the job over),
  standby (forking the next job's pair meanwhile); judge_start (the job handed over to the
  judge's run beginning, by the judge's own clock, as its first message says: the set-up left, if
  any, then reading the job), judge_setup_left (the job handed over to the judge reading it,
  which it does once its set-up is made: the part of judge_start that set-up), judge_run
  (from there to its result: the stages it reports); exit (the judge's result to the job's end for the slot: the candidate's
  final checks and report, or the exits where a process did not report), and two looks into it
  where both reported: candidate_after_finish (the candidate's process from answering the judge's
  `finish` to writing its report, by its own clock) and report_read_lag (the later report
  written to this process done reading it); merge; cleanup (log
  tails, and folders where reaped here); total; and the judge's own parts of its run, from its
  report (trusted/judge.Judge.part)."""
  spans = {"fork": ("start", "forked"), "stage_modules": ("forked", "staged"),
           "standby": ("staged", "prepared"), "merge": ("served", "merged")}
  out = {name: marks[b] - marks[a] for name, (a, b) in spans.items() if a in marks and b in marks}
  judge = pair.judge if pair is not None else None
  if judge is not None and isinstance(judge.result, envelope.JudgeReport):
    out.update(judge.result.timing_parts)
  if judge is not None and "staged" in marks and judge.first_line_at:
    began = max(marks["staged"], judge.began_at or judge.first_line_at)
    out["judge_start"] = began - marks["staged"]
    if judge.job_read_at:
      out["judge_setup_left"] = max(0.0, judge.job_read_at - marks["staged"])
    if judge.result_at:
      out["judge_run"] = judge.result_at - began
      if "served" in marks:
        out["exit"] = marks["served"] - judge.result_at
  candidate = pair.candidate if pair is not None else None
  if candidate is not None and candidate.written_at and "served" in marks:
    # exit, looked into (the candidate's clock: timings only): its work after answering the
    # judge's `finish`, and the worker's lag in reading the later of the two reports
    if candidate.finished_at:
      out["candidate_after_finish"] = min(max(0.0, candidate.written_at - candidate.finished_at),
                                          marks["served"] - marks["start"])
    if judge is not None and judge.written_at:
      latest = min(marks["served"], max(judge.written_at, candidate.written_at))
      out["report_read_lag"] = marks["served"] - latest
  out["cleanup"] = marks["end"] - marks.get("merged", marks["end"])
  out["total"] = marks["end"] - marks["start"]
  return {k: round(v, 4) for k, v in out.items()}


def _merge(options: job_lib.JobOptions, pair: pair_lib.Pair) -> dict[str, Any]:
  """The processes' statuses and the verdict merged from their reports."""
  from verifier_service.trusted import verdict  # pylint: disable=import-outside-toplevel
  sides = {p.role: {"report": p.result, "refused": p.refused, "status": p.status, "phase": p.phase,
                    "loading": p.loading,
                    "log_tail": pair_lib.tail(os.path.join(p.job_dir, "output.log"))}
           for p in pair.processes}
  violations = [v for p in pair.processes for v in p.violations]
  return {"status": {role: side["status"] for role, side in sides.items()},
          "result": verdict.merge(options, sides[JUDGE], sides[CANDIDATE], violations)}


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
      pair_lib.write_line(write_fd, sandbox.lock_down(policy, netns, None))
      code = 0
    except BaseException as e:  # pylint: disable=broad-except
      pair_lib.write_line(write_fd, {"error": f"{type(e).__name__}: {e}"})
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
  try:
    serve(args.device, out, json.loads(args.sandbox))
  except BrokenPipeError:
    # The pool is gone (its server stopped or was killed) while this worker wrote to it; `serve`
    # has closed its slot (the standby pair and its folders). Nothing is left to tell anyone.
    os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())  # the exit's flush must not raise
    print("verifier worker: the pool's pipe closed; exiting", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  main()
