"""Stage 4, timing: reference and candidate in the same process, alternating, cold L2.

Per trial and side: write a buffer several times the L2 size (evicting what the previous call left
in L2), synchronise the device, record a start event, call, synchronise the whole device again,
then record the end event. The device-wide synchronisation before the end event means work the
candidate hides on side streams is inside the measured interval; it adds the same few
microseconds to both sides, which biases very small kernels' speedups towards 1, never away from
it. The side that goes first alternates every trial so neither benefits from the other's
leftovers. Reported: median (the figure speedup uses), mean, min, max, p10, p90, stddev.

The timer's functions are bound when this module is imported (before any candidate code runs),
and the runner's StateGuard refuses candidates that replace them afterwards.

On the CPU test device (`worker.py --device cpu`) the same loop runs with `time.perf_counter`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

WARMUP_CALLS = 3


def stats(samples_us: list[float]) -> dict[str, Any]:
  """RuntimeStats fields (microseconds) for one side."""
  ordered = sorted(samples_us)
  q = lambda p: ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]
  return {
      "median_us": statistics.median(ordered), "mean_us": statistics.fmean(ordered),
      "min_us": ordered[0], "max_us": ordered[-1], "p10_us": q(0.10), "p90_us": q(0.90),
      "stddev_us": statistics.pstdev(ordered), "num_trials": len(ordered),
  }


class _CudaTimer:

  def __init__(self, device: torch.device):
    props = torch.cuda.get_device_properties(device)
    l2_bytes = getattr(props, "L2_cache_size", 0) or (64 << 20)
    self._flush = torch.empty(max(4 * l2_bytes, 256 << 20) // 4, dtype=torch.int32,
                              device=device)
    self._start = torch.cuda.Event(enable_timing=True)
    self._end = torch.cuda.Event(enable_timing=True)

  def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
    self._flush.zero_()
    torch.cuda.synchronize()
    self._start.record()
    out = fn()
    torch.cuda.synchronize()
    self._end.record()
    self._end.synchronize()
    return self._start.elapsed_time(self._end) * 1000.0, out


def _cpu_timer(fn: Callable[[], Any]) -> tuple[float, Any]:
  start = time.perf_counter()
  out = fn()
  return (time.perf_counter() - start) * 1e6, out


def time_pair(reference: Callable[[], Any], candidate: Callable[[], Any], trials: int,
              device: torch.device, prepare: Callable[[int], None] | None = None,
              inspect: Callable[[int, str, Any], None] | None = None,
              ) -> tuple[dict[str, Any], dict[str, Any]]:
  """Times both callables `trials` times each, alternating; returns their RuntimeStats.

  `prepare(i)` runs before trial i's pair of calls and `inspect(i, side, output)` after each call,
  both outside the timed interval: the runner uses them to give every trial fresh input values and
  to check each candidate output against the reference output for the same inputs.
  """
  timer = _CudaTimer(device) if device.type == "cuda" else _cpu_timer
  prepare = prepare or (lambda i: None)
  inspect = inspect or (lambda i, side, out: None)
  with torch.no_grad():
    for i in range(WARMUP_CALLS):
      prepare(-1 - i)
      inspect(-1 - i, "reference", reference())
      inspect(-1 - i, "candidate", candidate())
    if device.type == "cuda":
      torch.cuda.synchronize()
    samples: dict[str, list[float]] = {"reference": [], "candidate": []}
    sides = {"reference": reference, "candidate": candidate}
    for i in range(trials):
      prepare(i)
      order = ("reference", "candidate") if i % 2 == 0 else ("candidate", "reference")
      for side in order:
        elapsed, out = timer(sides[side])
        samples[side].append(elapsed)
        inspect(i, side, out)
  return stats(samples["reference"]), stats(samples["candidate"])
