"""Stage 4, timing: CUDA events around the forward call alone, one process and one side at a time.

The reference is timed in the judge (which never loaded candidate code) and the candidate in its
own process, one call at a time, alternating which side goes first (trusted/judge.py drives both).
Every trial makes two calls per side, each on fresh input values copied into the same buffers:
- cold: flush L2 (write a buffer of 4x the L2 size), synchronise the device, record the start
  event, call, record the end event, wait for it, synchronise the device;
- warm: the same without the flush (the inputs were just written, so they sit in L2 when they
  fit): the condition KernelBench times in, so `speedup_warm` is comparable with its figures.
Only the call lies between the events: the flush, the synchronisations and our Python do not.
Reported per side and condition: median (the figure speedups use), mean, min, max, p10, p90,
stddev.

What an earlier timer got wrong: it recorded the end event after a device-wide
synchronisation, so each sample also held the host waking from that synchronisation, the Python
around it and the event's submission, with the GPU idle: ~80 us per call on the H200 box, which
pushed every speedup of a small kernel towards 1. benchmarks/verifier_timing.py measures this
timer against `triton.testing.do_bench` and KernelBench's method on DICE pairs.

Work a candidate leaves on a side stream the current stream does not wait for is not inside the
events; `after_end` (run right after the end event is recorded, before any synchronisation) lets
the candidate's process snapshot the output at that moment, and the judge compares snapshots with
the reference (a late or stale output is SIDE_STREAM / OUTPUT_CACHING).

Timing owns the GPU: with several slots on one GPU, each judge takes that GPU's lock file
(`GpuLock`, an flock the kernel drops when the judge dies) for its whole timing stage, so no two
jobs time on the GPU at the same moment. Other jobs' correctness trials can still overlap a timing
stage. A judge waits at most `LOCK_WAIT_S`; past that it times anyway and says so in the verdict's
environment (`timing_lock`), so a slow neighbour can never turn into a timeout of this job.
Both sides time on one CPU core (`timing_core`, per GPU; `on_core` binds the timing thread): a
small kernel's time is mostly its host-side launch, and on the H200 box that cost drifted by up
to 45% over seconds within one process, so two processes timed on whatever cores the scheduler
gave them could differ by that much for no reason of their own. The two sides never time at once
(they alternate), so sharing the core costs nothing; at one slot per GPU the verdicts' speedups
moved from 0.84 to 0.90 of KernelBench's (median of 20 DICE pairs) and the worst pair's gap
halved. The verdict's `timing_lock` says where it ran ("held; on cpu 15").

Measured on an H200 (RELIABILITY.md, "Timing method"): the verdicts' times are above
what this timer gives in a plain process at 1 slot as at 4, so concurrency is not what separates
them; a torch.profiler session run earlier in the same process (it was the candidate's kernel-share
probe, which now runs after timing) added 22-83 us to every later call of a launch-bound model.

The timer's functions are bound when this module is imported (before any candidate code runs),
and the candidate process's StateGuard refuses candidates that replace them afterwards. On the
CPU test device the same calls are timed with `time.perf_counter`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Iterator

import torch

WARMUP_CALLS = 3  # at least, and for at least WARMUP_S: a GPU that idled runs slower at first
WARMUP_S = 0.2
# A judge that takes the timing lock within HANDOVER_S of another judge's release finds a GPU that
# was timing until then, not one that idled: it warms up for HANDOVER_WARMUP_S (and WARMUP_CALLS).
HANDOVER_S = 0.1
HANDOVER_WARMUP_S = 0.02
LOCK_WAIT_S = 60.0
LOCK_DIR = os.path.join(tempfile.gettempdir(), "dice-verifier-gpu-locks")
CU_CTX_SCHED_BLOCKING_SYNC = 0x04  # cuda.h's CUctx_flags


def stats(samples_us: list[float]) -> dict[str, Any]:
  """RuntimeStats fields (microseconds) for one side."""
  ordered = sorted(samples_us)
  q = lambda p: ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]
  return {
      "median_us": statistics.median(ordered), "mean_us": statistics.fmean(ordered),
      "min_us": ordered[0], "max_us": ordered[-1], "p10_us": q(0.10), "p90_us": q(0.90),
      "stddev_us": statistics.pstdev(ordered), "num_trials": len(ordered),
  }


def timing_core(device: torch.device) -> int | None:
  """The CPU core both sides of a job time on: per GPU index, counted from the last core this
  process may use (the compilers' pool is niced and spread over every core)."""
  cores = sorted(os.sched_getaffinity(0))
  index = device.index if device.index is not None else (
      torch.cuda.current_device() if device.type == "cuda" else 0)
  return cores[-1 - index % len(cores)] if cores else None


@contextlib.contextmanager
def on_core(core: int | None) -> Iterator[str]:
  """Runs the calling thread on `core` (restoring its CPU set after); yields what the verdict
  reports: "on cpu N", or why not."""
  if core is None:
    yield "no cpu binding"
    return
  previous = os.sched_getaffinity(0)
  try:
    os.sched_setaffinity(0, {core})
  except OSError as e:
    yield f"not bound to cpu {core}: {e.strerror}"
    return
  try:
    yield f"on cpu {core}"
  finally:
    with contextlib.suppress(OSError):
      os.sched_setaffinity(0, previous)


def warm_up(fn: Callable[[], Any], max_calls: int = 10_000, min_s: float = WARMUP_S) -> int:
  """Calls `fn` (which waits for its own work) at least WARMUP_CALLS times and for at least
  `min_s` seconds; returns the number of calls. Time-based, as triton's do_bench warms up: after
  the idle gaps between jobs the GPU's first calls ran up to 1.4x slower (H200,
  benchmarks/verifier_timing_env.py), and three calls did not cover that. Without an idle gap
  (`GpuLock.warmup_s`) `min_s` is HANDOVER_WARMUP_S."""
  start, calls = time.perf_counter(), 0
  while calls < max_calls and (calls < WARMUP_CALLS or time.perf_counter() - start < min_s):
    fn()
    calls += 1
  return calls


class Timer:
  """`timer(fn, cold)` -> (microseconds, fn's output) for one call."""

  def __init__(self, device: torch.device):
    self.cuda = device.type == "cuda"
    if self.cuda:
      props = torch.cuda.get_device_properties(device)
      l2_bytes = getattr(props, "L2_cache_size", 0) or (64 << 20)
      self._flush = torch.empty(max(4 * l2_bytes, 256 << 20) // 4, dtype=torch.int32,
                                device=device)
      self._start = torch.cuda.Event(enable_timing=True)
      self._end = torch.cuda.Event(enable_timing=True)

  def __call__(self, fn: Callable[[], Any], cold: bool = True,
               after_end: Callable[[Any], None] | None = None) -> tuple[float, Any]:
    if not self.cuda:
      start = time.perf_counter()
      out = fn()
      elapsed = (time.perf_counter() - start) * 1e6
      if after_end is not None:
        after_end(out)
      return elapsed, out
    if cold:
      self._flush.zero_()
    torch.cuda.synchronize()
    self._start.record()
    out = fn()
    self._end.record()
    if after_end is not None:
      after_end(out)
    self._end.synchronize()
    torch.cuda.synchronize()
    return self._start.elapsed_time(self._end) * 1000.0, out


class GpuLock:
  """The lock file of the GPU a judge times on, opened before the judge's sandbox closes.

  `for_device` keys it by the GPU's UUID, so the slots of every server on the host share it. It is
  opened, never inherited: the candidate's process is forked from the worker, not from the judge,
  and cannot reach it. None for `path`: no lock (`state` says why).
  """

  def __init__(self, path: str | None, state: str = "off (not a GPU)"):
    self.fd: int | None = None
    self.state = state
    self.handover_s: float | None = None  # while held: seconds since the previous holder let go
    if path is None:
      return
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with contextlib.suppress(OSError):  # another user's server may own the folder
        os.chmod(os.path.dirname(path), 0o1777)
      self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
      self.state = f"unavailable ({path}: {e.strerror})"

  @classmethod
  def for_device(cls, device: torch.device, lock_dir: str = LOCK_DIR) -> "GpuLock":
    if device.type != "cuda":
      return cls(None)
    props = torch.cuda.get_device_properties(device)
    key = str(getattr(props, "uuid", "") or os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    return cls(os.path.join(lock_dir, f"gpu-{key}.lock"))

  @contextlib.contextmanager
  def held(self, wait_s: float = LOCK_WAIT_S) -> Iterator[str]:
    """Holds the lock (waiting up to `wait_s`); yields what the verdict reports about it."""
    if self.fd is None:
      yield self.state
      return
    start = time.monotonic()
    while True:
      try:
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        if time.monotonic() - start >= wait_s:
          yield f"not acquired in {wait_s:g} s: timed alongside another job's timing"
          return
        time.sleep(0.005)
    try:
      waited = time.monotonic() - start
      self.handover_s = self._since_release()
      notes = [f"waited {waited:.2f} s"] if waited >= 0.01 else []
      if self.handed_over:
        notes.append(f"handed over after {self.handover_s:.3f} s: "
                     f"warm-up {HANDOVER_WARMUP_S:g} s")
      yield f"held ({'; '.join(notes)})" if notes else "held"
    finally:
      self.handover_s = None
      with contextlib.suppress(OSError):  # the release time, for the next holder (`warmup_s`)
        os.pwrite(self.fd, f"{time.monotonic():<31.6f}\n".encode(), 0)
      fcntl.flock(self.fd, fcntl.LOCK_UN)

  def _since_release(self) -> float | None:
    """Seconds since the previous holder released the lock (CLOCK_MONOTONIC, which every process
    of the host shares); None when no holder ever released it (or one died holding it)."""
    try:
      released = float(os.pread(self.fd, 64, 0).decode())
    except (OSError, ValueError, UnicodeDecodeError):
      return None
    since = time.monotonic() - released
    return since if since >= 0 else None

  @property
  def handed_over(self) -> bool:
    """Held, and the previous holder released it under HANDOVER_S ago (the GPU was busy timing
    until then)."""
    return self.handover_s is not None and self.handover_s < HANDOVER_S

  def warmup_s(self) -> float:
    """How long to warm up under the lock: HANDOVER_WARMUP_S when `handed_over`, else WARMUP_S.

    Decision: with several slots per GPU, timing stages queue for the lock back to back,
    and 2 x WARMUP_S per job was about half of each one's time holding it."""
    return HANDOVER_WARMUP_S if self.handed_over else WARMUP_S


def block_on_sync(device: str) -> None:
  """Makes the primary CUDA context of `device` ("cuda" or "cuda:N"), not yet made in this
  process, block the waiting thread on every synchronisation instead of spinning on a core
  (ServerConfig.cuda_blocking_sync): the driver's flag, set before torch makes the context.
  Raises RuntimeError with the driver's error code where a call fails."""
  import ctypes  # pylint: disable=import-outside-toplevel
  lib = ctypes.CDLL("libcuda.so.1")
  handle = ctypes.c_int()
  index = int(device.partition(":")[2] or 0)
  for name, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(handle), index)),
                     ("cuDevicePrimaryCtxSetFlags_v2", (handle, CU_CTX_SCHED_BLOCKING_SYNC))):
    code = getattr(lib, name)(*args)
    if code != 0:
      raise RuntimeError(f"{name} failed: CUDA driver error {code}")


def context_blocks_on_sync() -> bool:
  """Whether the current CUDA context has the blocking-synchronisation flag (after torch made
  it): what `block_on_sync` asked for, checked."""
  import ctypes  # pylint: disable=import-outside-toplevel
  flags = ctypes.c_uint()
  code = ctypes.CDLL("libcuda.so.1").cuCtxGetFlags(ctypes.byref(flags))
  return code == 0 and bool(flags.value & CU_CTX_SCHED_BLOCKING_SYNC)
