"""Stage 4, timing: reference and candidate in the same process, alternating, cold L2.

Per trial and side: write a buffer several times the L2 size (evicting what the previous call left
in L2), synchronise the device, record a start event, call, synchronise the whole device again,
then record the end event. The device-wide synchronisation before the end event means work the
candidate hides on side streams is inside the measured interval; it adds the same few
microseconds to both sides, which biases very small kernels' speedups towards 1, never away from
it. The side that goes first alternates every trial so neither benefits from the other's
leftovers. Reported: median (the figure speedup uses), mean, min, max, p10, p90, stddev.

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

  def __call__(self, fn: Callable[[], Any]) -> float:
    self._flush.zero_()
    torch.cuda.synchronize()
    self._start.record()
    fn()
    torch.cuda.synchronize()
    self._end.record()
    self._end.synchronize()
    return self._start.elapsed_time(self._end) * 1000.0


def _cpu_timer(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  fn()
  return (time.perf_counter() - start) * 1e6


def time_pair(reference: Callable[[], Any], candidate: Callable[[], Any], trials: int,
              device: torch.device) -> tuple[dict[str, Any], dict[str, Any]]:
  """Times both callables `trials` times each, alternating; returns their RuntimeStats."""
  timer = _CudaTimer(device) if device.type == "cuda" else _cpu_timer
  with torch.no_grad():
    for _ in range(WARMUP_CALLS):
      reference()
      candidate()
    if device.type == "cuda":
      torch.cuda.synchronize()
    ref_us, cand_us = [], []
    for i in range(trials):
      if i % 2 == 0:
        ref_us.append(timer(reference))
        cand_us.append(timer(candidate))
      else:
        cand_us.append(timer(candidate))
        ref_us.append(timer(reference))
  return stats(ref_us), stats(cand_us)
