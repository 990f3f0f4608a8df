"""The run stage's time budget, scaled to the problem: a hang costs seconds on a small problem.

The pool kills a job's two processes at the job's deadline (service/pool.py). That deadline starts
at the run stage's ceiling (`run_timeout_s`, 180 s by default), which a large problem may need;
the judge, which never runs candidate code and has measured the reference, tightens it as it goes,
by sending the worker a `Budget` (seconds from now) at each point where it knows more:

  after loading the reference     load, the correctness trials and the probes, each candidate call
                                  allowed `slowdown` x the reference's own call
  after the first trial           the rest of them at the candidate's own pace, as the judge saw it
  before the GPU's timing lock    the lock's longest wait: waiting is the judge's, not the candidate's
  with the lock held              warm-up, every timed call on both sides, the read-backs, profile

Every budget is `floor_s` plus what the work should take: calls x seconds per call x a margin, plus
the bytes that cross the socket at a pace far below what was measured. The pool never lets a
budget run past the ceiling, and a budget only ever applies to the stretch it was sent for, so
nothing the judge sends can lengthen a job beyond today's limit. The candidate's process cannot
send one (the worker takes budgets from the judge's pipe only).

Decision: the candidate's own pace decides once it is known. A correct but slow kernel (a naive
loop 1,000x slower than torch) is still correct, and a budget from the reference alone would
turn it into a TIMEOUT during timing, where it makes 2 x num_timing_trials calls. The judge times
each trial's exchange itself (send to last byte back), so the pace is measured on the trusted
side, and a candidate that is fast in the trials and then hangs is stopped within a margin of its
own pace. Before the first call nothing but the reference is known: `slowdown` (20x) and the
floor bound a candidate that hangs in its first call, the common case in RL.
"""

from __future__ import annotations

import dataclasses

from verifier_service.run import job as job_lib
from verifier_service.run import timing

FLOOR_S = 5.0
SLOWDOWN = 20.0
MARGIN = 3.0  # the candidate's observed pace times this
# Bytes through the boundary socket per second, far below the 0.3-0.8 GiB/s measured on a loaded
# 2-core VM (encode, kernel copy, decode into the judge's buffer).
WIRE_BYTES_PER_S = 64 << 20
PROBE_CALLS = 5  # the caching probe's two calls, the aftermath probe's, the profile's
PROBE_SLEEP_S = 0.05  # the aftermath probe waits this long for work left running
# The reference's first call is timed again when it took less than this: the first call of a
# process carries one-off set-up (CUDA's lazy kernel loading, library handles) that would make a
# small problem's budget many times too long.
REMEASURE_BELOW_S = 0.25


@dataclasses.dataclass(frozen=True)
class Budget:
  """Seconds from now for the stretch of the job named in `why`."""
  seconds: float
  why: str

  def to_message(self) -> dict[str, object]:
    return {"type": "budget", "seconds": round(self.seconds, 3), "why": self.why}


def _make(floor_s: float, work: list[tuple[int, float, str]], moved_bytes: int,
          extra_s: float, what: str) -> Budget:
  """floor + sum(calls x seconds) + extra + bytes over the socket, with the reasons spelled out."""
  seconds = floor_s + sum(n * s for n, s, _ in work) + extra_s + moved_bytes / WIRE_BYTES_PER_S
  parts = [f"{n} calls x {1e3 * s:.3g} ms ({why})" for n, s, why in work if n]
  if extra_s:
    parts.append(f"{extra_s:.2g} s warm-up and probe waits")
  if moved_bytes:
    parts.append(f"{moved_bytes / (1 << 20):.3g} MiB over the socket")
  return Budget(seconds, f"{what}: {floor_s:g} s + " + " + ".join(parts or ["nothing else"]))


def first(opts: job_lib.JobOptions, reference_s: float, trial_bytes: int) -> Budget | None:
  """After the reference was loaded: the candidate's load, every trial and the probes (and the
  profile, when nothing is timed), each call allowed `budget_slowdown` x the reference's."""
  if opts.budget_slowdown <= 0:
    return None
  per_call = opts.budget_slowdown * reference_s
  calls = opts.num_correctness_trials + PROBE_CALLS
  return _make(opts.budget_floor_s, [(calls, per_call, f"{opts.budget_slowdown:g}x the "
                                      "reference's call")],
               (opts.num_correctness_trials + 2) * trial_bytes, PROBE_SLEEP_S,
               "load, correctness and probes")


def after_trial(opts: job_lib.JobOptions, pace_s: float, trials_left: int,
                trial_bytes: int) -> Budget | None:
  """After the first trial: the other trials and the probes at the candidate's own pace (the
  judge's wall time for a trial's exchange) times MARGIN."""
  if opts.budget_slowdown <= 0:
    return None
  calls = trials_left + PROBE_CALLS
  return _make(opts.budget_floor_s, [(calls, MARGIN * pace_s, f"{MARGIN:g}x the candidate's "
                                      "first trial")],
               (trials_left + 2) * trial_bytes, PROBE_SLEEP_S, "the rest of correctness and probes")


def lock_wait(opts: job_lib.JobOptions) -> Budget | None:
  """While the judge waits for the GPU's timing lock (timing.GpuLock): its longest wait."""
  if opts.budget_slowdown <= 0:
    return None
  return Budget(opts.budget_floor_s + timing.LOCK_WAIT_S,
                f"waiting for the GPU's timing lock: {opts.budget_floor_s:g} s + "
                f"{timing.LOCK_WAIT_S:g} s")


def timed(opts: job_lib.JobOptions, reference_s: float, pace_s: float, output_bytes: int,
          read_back_calls: int) -> Budget | None:
  """With the timing lock held: both sides' warm-up and timed calls (cold and warm), the outputs
  read back, the profile and the final checks; the candidate at MARGIN x its pace."""
  if opts.budget_slowdown <= 0 or opts.skip_timing:
    return None
  calls = 2 * opts.num_timing_trials + timing.WARMUP_CALLS
  work = [(calls, MARGIN * reference_s, "the reference, timed"),
          (calls + 2, MARGIN * pace_s, "the candidate, timed, and its profile")]
  return _make(opts.budget_floor_s, work, read_back_calls * output_bytes, 2 * timing.WARMUP_S,
               "timing")
