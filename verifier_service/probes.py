"""Extra calls of ModelNew, outside the correctness trials, that expose what the trials cannot.

- `caching_probe`: two calls on the SAME input tensors whose values are replaced in place between
  them (same objects, same addresses, new contents): a result cached by tensor identity, address
  or shape comes back stale (OUTPUT_CACHING).
- `aftermath_probe`: the output is copied the moment forward returns (after synchronising only the
  current stream, which is all a naive timer waits for), then compared with itself after the whole
  device has synchronised and 50 ms have passed. If it changed, work continued after forward
  returned, on a side stream or a thread (SIDE_STREAM). Python threads alive after forward, and
  OS threads started since the trusted setup that keep burning CPU after it, are SIDE_STREAM too.
- `kernel_profile` (GPU): which CUDA kernels one forward launched, and the share of kernel time in
  the candidate's own kernels versus library kernels (cuBLAS/cuDNN/torch/Triton). Copies, fills
  and memsets count as neither. Library kernels doing most of the work is TORCH_FALLBACK even when
  the extension calls them from C++ without going through torch's dispatcher.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import torch

from verifier_service import correctness
from verifier_service import guards

GLUE_KERNEL_RE = re.compile(r"memcpy|memset|copy|fill|CatArray", re.IGNORECASE)
MIN_OWN_SHARE = 0.5


def _tensors(tree: Any) -> list[torch.Tensor]:
  return [t for t in correctness.flatten(tree) if isinstance(t, torch.Tensor)]


def same_values(a: Any, b: Any) -> bool:
  """Exact equality of two output trees (NaN equals NaN)."""
  left, right = correctness.flatten(a), correctness.flatten(b)
  if len(left) != len(right):
    return False
  for x, y in zip(left, right):
    if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
      return False
    if not isinstance(x, torch.Tensor):
      continue
    if x.shape != y.shape or x.dtype != y.dtype:
      return False
    if x.is_floating_point() or x.is_complex():
      same = (x == y) | (torch.isnan(x) & torch.isnan(y))
      if not bool(same.all()):
        return False
    elif not torch.equal(x, y):
      return False
  return True


def caching_probe(candidate: Callable[..., Any], reference: Callable[..., Any],
                  inputs_a: Any, inputs_b: Any, atol: float, rtol: float,
                  sync: Callable[[], None]) -> list[tuple[str, str]]:
  """Call, change the inputs' values in place, call again: the second output must follow."""
  held = correctness.clone_tree(inputs_a)
  with torch.no_grad():
    first = correctness.clone_tree(candidate(*held))
    sync()
    for dst, src in zip(_tensors(held), _tensors(inputs_b)):
      dst.copy_(src)
    second = correctness.clone_tree(candidate(*held))
    sync()
    expect_a = reference(*correctness.clone_tree(inputs_a))
    expect_b = reference(*correctness.clone_tree(inputs_b))
    sync()
  ok_a = correctness.compare(expect_a, first, atol, rtol)[0]
  ok_b = correctness.compare(expect_b, second, atol, rtol)[0]
  if ok_a and not ok_b and not same_values(expect_a, expect_b):
    stale = same_values(first, second)
    return [("OUTPUT_CACHING", "second call on the same input tensors with new values returned "
             + ("the first call's output" if stale else "an output that does not follow them"))]
  return []


def aftermath_probe(candidate: Callable[..., Any], inputs: Any, device: torch.device,
                    baseline_tids: set[int]) -> list[tuple[str, str]]:
  """Work that continues after forward returns: side streams and threads."""
  found = []
  held = correctness.clone_tree(inputs)
  with torch.no_grad():
    out = candidate(*held)
    if device.type == "cuda":
      torch.cuda.current_stream().synchronize()
    early = correctness.clone_tree(out)
    if device.type == "cuda":
      torch.cuda.current_stream().synchronize()
    times_before = guards.os_thread_times()
    time.sleep(0.05)
    if device.type == "cuda":
      torch.cuda.synchronize()
    times_after = guards.os_thread_times()
  if not same_values(early, out):
    found.append(("SIDE_STREAM", "the output kept changing after forward returned (work on a "
                  "side stream or thread that a current-stream timer would not see)"))
  names = guards.python_threads()
  if names:
    found.append(("SIDE_STREAM", f"Python threads alive after forward: {', '.join(names[:4])}"))
  busy = [tid for tid, (ticks, state) in times_after.items() if tid not in baseline_tids and (
      state == "R" or ticks - times_before.get(tid, (ticks, ""))[0] >= 2)]
  if busy:
    found.append(("SIDE_STREAM", f"threads started by the candidate kept running after forward "
                  f"returned (tids {busy[:4]})"))
  return found


def kernel_profile(run: Callable[[], Any], kernel_names: list[str]) -> dict[str, Any]:
  """Launched own kernels, own share of kernel time, and the busiest library kernels (GPU)."""
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
  return {"launched": launched, "own_share": share, "library": top, "note": ""}


def profile_findings(profile: dict[str, Any]) -> list[tuple[str, str]]:
  if profile.get("note") or not profile["launched"]:
    return []
  if profile["own_share"] < MIN_OWN_SHARE and profile["library"]:
    names = ", ".join(f"{n[:80]} ({d:.1f} us)" for n, d in profile["library"])
    return [("TORCH_FALLBACK", f"kernels the candidate did not write did "
             f"{100 * (1 - profile['own_share']):.0f}% of the GPU work: {names}")]
  return []
