"""Extra calls of ModelNew in the candidate's process, outside the correctness trials.

(The caching probe, two calls on the same input tensors with their values replaced in between,
is driven by the judge, which compares both outputs with its own reference: trusted/judge.py.)

- `aftermath_probe`: the output is copied the moment forward returns (after synchronising only the
  current stream, which is all a naive timer waits for), then compared with itself after the whole
  device has synchronised and 50 ms have passed. If it changed, work continued after forward
  returned, on a side stream or a thread (SIDE_STREAM). Python threads alive after forward, and
  OS threads started since the trusted setup that keep burning CPU after it, are SIDE_STREAM too.
- `kernel_profile` (GPU): which CUDA kernels one forward launched, and the share of kernel time in
  the candidate's own kernels versus library kernels (cuBLAS/cuDNN/torch/Triton). Copies, fills
  and memsets count as neither; library kernels are seen even when
  the extension calls them from C++ without going through torch's dispatcher. What that share
  means for the verdict is the policy's call (run/policy.py), on the trusted side.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import torch

from verifier_service import enums
from verifier_service.run import problem
from verifier_service.untrusted import guards

GLUE_KERNEL_RE = re.compile(r"memcpy|memset|copy|fill|CatArray", re.IGNORECASE)


def aftermath_probe(candidate: Callable[..., Any], inputs: Any, device: torch.device,
                    baseline_tids: set[int]) -> list[tuple[str, str]]:
  """Work that continues after forward returns: side streams and threads."""
  found = []
  held = problem.clone_tree(inputs)
  with torch.no_grad():
    out = candidate(*held)
    if device.type == "cuda":
      torch.cuda.current_stream().synchronize()
    early = problem.clone_tree(out)
    if device.type == "cuda":
      torch.cuda.current_stream().synchronize()
    times_before = guards.os_thread_times()
    time.sleep(0.05)
    if device.type == "cuda":
      torch.cuda.synchronize()
    times_after = guards.os_thread_times()
  if not _same(early, out):
    found.append((enums.SIDE_STREAM, "the output kept changing after forward returned (work on a "
                  "side stream or thread that a current-stream timer would not see)"))
  names = guards.python_threads()
  if names:
    found.append((enums.SIDE_STREAM, f"Python threads alive after forward: {', '.join(names[:4])}"))
  busy = [tid for tid, (ticks, state) in times_after.items() if tid not in baseline_tids and (
      state == "R" or ticks - times_before.get(tid, (ticks, ""))[0] >= 2)]
  if busy:
    found.append((enums.SIDE_STREAM, f"threads started by the candidate kept running after forward "
                  f"returned (tids {busy[:4]})"))
  return found


_BATCH_KERNEL_RE = re.compile(r"\bdice_[0-9a-f]{12}_\d+::")


def foreign_kernels(names: list[str], own_namespaces: list[str]) -> list[str]:
  """Kernels of a compile batch's namespace (compile/batch.py) that is not the candidate's own."""
  return [n for n in dict.fromkeys(names) if _BATCH_KERNEL_RE.search(n)
          and not any(re.search(rf"\b{re.escape(ns)}::", n) for ns in own_namespaces)]


def kernel_profile(run: Callable[[], Any], kernel_names: list[str],
                   own_namespaces: list[str] | None = None) -> dict[str, Any]:
  """Launched own kernels, own share of kernel time, the busiest library kernels, and kernels
  compiled for other candidates of its compile batch (GPU)."""
  from torch.profiler import ProfilerActivity, profile  # pylint: disable=import-outside-toplevel
  try:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
      with torch.no_grad():
        run()
      torch.cuda.synchronize()
    kernels = [(e.name, max(e.time_range.elapsed_us(), 0.0)) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
  except Exception as e:  # pylint: disable=broad-except
    return {"launched": [], "note": f"profiler unavailable: {e}"}
  patterns = {k: re.compile(rf"\b{re.escape(k)}\b") for k in kernel_names}
  launched = [k for k in kernel_names if any(patterns[k].search(n) for n, _ in kernels)]
  own = sum(d for n, d in kernels if any(p.search(n) for p in patterns.values()))
  library: dict[str, float] = {}
  for name, duration in kernels:
    if not any(p.search(name) for p in patterns.values()) and not GLUE_KERNEL_RE.search(name):
      library[name] = library.get(name, 0.0) + duration
  total = own + sum(library.values())
  share = own / total if total > 0 else (1.0 if launched else 0.0)
  top = sorted(library.items(), key=lambda kv: -kv[1])[:3]
  foreign = foreign_kernels([n for n, _ in kernels], own_namespaces or [])
  return {"launched": launched, "own_share": share, "library": top, "foreign": foreign,
          "note": ""}


def _same(a: Any, b: Any) -> bool:
  """Exact equality (NaN equals NaN) of two output trees, here only to see an output change."""
  left, right = problem.flatten(a), problem.flatten(b)
  if len(left) != len(right):
    return False
  for x, y in zip(left, right):
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
      if x.shape != y.shape or not bool(((x == y) | (x != x) & (y != y)).all()):
        return False
    elif x is not y and x != y:
      return False
  return True
