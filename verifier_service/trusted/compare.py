"""The comparison rules, applied in the judge to outputs that arrived from the candidate as bytes.

Outputs: same structure, exactly `torch.Tensor` (no subclasses; checked from the declared
metadata in run/wire.py), same shape and dtype, NaN where and only where the reference has NaN,
infinities equal, and |c - r| <= atol + rtol * |r| elsewhere (torch.allclose's rule). Integer and
bool outputs must be equal. Inputs after the call are compared the same way (mutation).

This module only ever runs in the judge, whose torch no candidate code has touched: an operator a
candidate re-registers in its own process (`torch.library`, TORCH_LIBRARY_IMPL) does not exist
here.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from verifier_service import enums
from verifier_service.run import problem

CHUNK = 1 << 24  # elements compared at a time (`_chunks`): 128 MiB per float64 temporary


def _compare_tensor(index: int, ref: torch.Tensor, cand: Any, atol: float,
                    rtol: float) -> tuple[bool, float, float, str, list[tuple[str, str]]]:
  where = f"output {index}"
  if not isinstance(cand, torch.Tensor):
    return False, math.inf, math.inf, f"{where} is {type(cand).__name__}, expected a tensor", []
  if type(cand) is not torch.Tensor:  # pylint: disable=unidiomatic-typecheck
    return False, math.inf, math.inf, f"{where} is a tensor subclass {type(cand).__name__}", [
        (enums.TENSOR_SUBCLASS, f"{where}: {type(cand).__qualname__}")]
  if tuple(cand.shape) != tuple(ref.shape):
    return False, math.inf, math.inf, (
        f"{where} shape {tuple(cand.shape)} != reference {tuple(ref.shape)}"), []
  if cand.dtype != ref.dtype:
    return False, math.inf, math.inf, f"{where} dtype {cand.dtype} != reference {ref.dtype}", []
  if cand.device != ref.device:
    return False, math.inf, math.inf, f"{where} on {cand.device}, reference on {ref.device}", []
  if not ref.is_floating_point() and not ref.is_complex():
    if torch.equal(cand, ref):
      return True, 0.0, 0.0, "", []
    diff = max(float((c.double() - r.double()).abs().max()) for r, c in _chunks(ref, cand))
    return False, diff, diff, f"{where} differs (max abs {diff:g})", []
  compute = torch.float64 if ref.dtype == torch.float64 else torch.float32
  tiny = torch.finfo(compute).tiny
  extra_nan = missing_nan = bad = finite = 0
  inf_differs = False
  max_abs = max_rel = 0.0
  for r, c in _chunks(ref, cand):
    r, c = r.to(compute), c.to(compute)
    r_nan, c_nan = torch.isnan(r), torch.isnan(c)
    if not torch.equal(r_nan, c_nan):
      extra_nan += int((c_nan & ~r_nan).sum())
      missing_nan += int((r_nan & ~c_nan).sum())
      continue
    r_inf, c_inf = torch.isinf(r), torch.isinf(c)
    if not torch.equal(r_inf, c_inf) or not torch.equal(r[r_inf], c[c_inf]):
      inf_differs = True
      continue
    keep = ~(r_nan | r_inf)
    r, c = r[keep], c[keep]
    if not r.numel():
      continue
    abs_diff = (c - r).abs()
    max_abs = max(max_abs, float(abs_diff.max()))
    max_rel = max(max_rel, float((abs_diff / r.abs().clamp_min(tiny)).max()))
    bad += int((abs_diff > atol + rtol * r.abs()).sum())
    finite += r.numel()
  if extra_nan or missing_nan:
    return False, math.inf, math.inf, (
        f"NaN in {where} at {extra_nan} positions where the reference is finite" if extra_nan else
        f"{where} is finite where the reference is NaN"), []
  if inf_differs:
    return False, math.inf, math.inf, f"Inf in {where} does not match the reference", []
  if bad:
    return False, max_abs, max_rel, (
        f"{where}: {bad} of {finite} elements exceed atol={atol:g} rtol={rtol:g} "
        f"(max abs {max_abs:.3g}, max rel {max_rel:.3g})"), []
  return True, max_abs, max_rel, "", []


def _chunks(ref: torch.Tensor, cand: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
  """Both tensors, flattened, CHUNK elements at a time.

  Decision: the judge's temporaries stay a few hundred MiB whatever the output's size. Whole-tensor
  float casts and masks of DICE 3497's 1G-element output took the judge past 57 GiB of GPU memory
  (H200), beyond even a whole GPU's judge share at two slots."""
  r, c = ref.reshape(-1), cand.reshape(-1)
  for start in range(0, r.numel(), CHUNK):
    yield r[start:start + CHUNK], c[start:start + CHUNK]


def compare(reference: Any, candidate: Any, atol: float, rtol: float,
            what: str = "output") -> tuple[bool, float, float, str, list[tuple[str, str]]]:
  """Compares two output trees; returns (passed, max_abs, max_rel, message, exploits)."""
  refs, cands = problem.flatten(reference), problem.flatten(candidate)
  if len(refs) != len(cands):
    return False, math.inf, math.inf, (
        f"{what} has {len(cands)} leaves, the reference has {len(refs)}"), []
  max_abs = max_rel = 0.0
  for i, (r, c) in enumerate(zip(refs, cands)):
    if isinstance(r, torch.Tensor):
      ok, a, rel, msg, exploits = _compare_tensor(i, r, c, atol, rtol)
      msg = msg.replace("output", what, 1)
    elif isinstance(r, (int, float)) and not isinstance(r, bool) and isinstance(
        c, (int, float)) and not isinstance(c, bool):
      a = abs(float(c) - float(r))
      rel = a / max(abs(float(r)), 1e-30)
      ok = math.isclose(c, r, rel_tol=rtol, abs_tol=atol) or (math.isnan(r) and math.isnan(c))
      msg, exploits = ("" if ok else f"{what} {i}: {c!r} != reference {r!r}"), []
    else:
      ok, a, rel, exploits = (type(r) is type(c) and r == c), 0.0, 0.0, []
      msg = "" if ok else f"{what} {i}: {c!r} != reference {r!r}"
    max_abs, max_rel = max(max_abs, a), max(max_rel, rel)
    if not ok:
      return False, max_abs, max_rel, msg, exploits
  return True, max_abs, max_rel, "", []


def same_values(a: Any, b: Any) -> bool:
  """Exact equality of two output trees (NaN equals NaN)."""
  left, right = problem.flatten(a), problem.flatten(b)
  if len(left) != len(right):
    return False
  for x, y in zip(left, right):
    if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
      return False
    if not isinstance(x, torch.Tensor):
      if x != y:
        return False
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
