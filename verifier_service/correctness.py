"""Stage 3, correctness: one trial = fresh seed, fresh inputs, reference vs candidate.

Semantics (KernelBench's, tightened where it can be fooled):
- Models are built with the same seed and the same `get_init_inputs()`; parameters and buffers
  whose names and shapes match are then copied from the reference into ModelNew, so a candidate
  that creates its parameters in another order is still compared on identical weights.
- Modules stay in their default mode (training), as KernelBench leaves them, and every forward runs
  under `torch.no_grad()`, as KernelBench does.
- Each side gets its own clone of the inputs. The candidate runs FIRST: the reference's output
  for these inputs does not exist yet, so it cannot be read, returned or inherited from the
  caching allocator. Reference outputs are NaN-filled once compared, and before each candidate
  call the allocator is primed with NaN-filled blocks of the outputs' sizes ("poisoning"), so a
  candidate that returns uninitialised memory reads NaN or stale values, never a right result. Outputs sharing memory with the inputs (where the reference's do not) or with
  live reference tensors are OUTPUT_REUSE.
- After the call the candidate's inputs must equal the reference's inputs after its call (a
  reference that works in place may be matched; a candidate may not mutate otherwise).
- Outputs: same structure, exactly `torch.Tensor` (no subclasses), same shape and dtype, NaN
  where and only where the reference has NaN, infinities equal, and |c - r| <= atol + rtol * |r|
  elsewhere (torch.allclose's rule). Integer and bool outputs must be equal.
- Floating inputs and modules are cast to the requested precision; integer inputs (indices) never.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from typing import Any, Callable, ContextManager

import numpy as np
import torch

DEFAULT_TOLERANCE = {"FP32": 1e-4, "FP16": 1e-2, "BF16": 1e-2}
DTYPES = {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}


class ReferenceFailure(Exception):
  """The reference raised: the problem is unusable, not the candidate's fault."""


class CandidateFailure(Exception):
  """The candidate raised while being called."""


@dataclasses.dataclass
class Trial:
  seed: int
  passed: bool
  max_abs_error: float = 0.0
  max_rel_error: float = 0.0
  message: str = ""
  exploits: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  output_sizes: list[int] = dataclasses.field(default_factory=list)

  def to_json(self) -> dict[str, Any]:
    return {"seed": self.seed, "passed": self.passed, "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error, "message": self.message}


def set_seed(seed: int) -> None:
  random.seed(seed)
  np.random.seed(seed % (1 << 32))
  torch.manual_seed(seed)  # seeds every CUDA device too


def trial_seeds(base_seed: int, count: int) -> list[int]:
  """Fresh, reproducible seeds for `count` trials (KernelBench draws them from the base seed)."""
  gen = torch.Generator().manual_seed(base_seed)
  return [int(torch.randint(0, 2**31 - 1, (1,), generator=gen).item()) for _ in range(count)]


def to_device(tree: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
  """Moves tensors to `device`; casts floating ones to `dtype`; leaves integer tensors alone."""
  if isinstance(tree, torch.Tensor):
    if dtype is not None and tree.is_floating_point():
      return tree.to(device=device, dtype=dtype)
    return tree.to(device=device)
  if isinstance(tree, (list, tuple)):
    return type(tree)(to_device(t, device, dtype) for t in tree)
  if isinstance(tree, dict):
    return {k: to_device(v, device, dtype) for k, v in tree.items()}
  return tree


def clone_tree(tree: Any) -> Any:
  if isinstance(tree, torch.Tensor):
    return tree.clone()
  if isinstance(tree, (list, tuple)):
    return type(tree)(clone_tree(t) for t in tree)
  if isinstance(tree, dict):
    return {k: clone_tree(v) for k, v in tree.items()}
  return tree


def flatten(tree: Any) -> list[Any]:
  if isinstance(tree, (list, tuple)):
    return [leaf for t in tree for leaf in flatten(t)]
  if isinstance(tree, dict):
    return [leaf for k in sorted(tree, key=str) for leaf in flatten(tree[k])]
  return [tree]


def copy_matching_state(reference: torch.nn.Module, candidate: torch.nn.Module) -> int:
  """Copies reference parameters/buffers into the candidate where name and shape match."""
  ref_state = reference.state_dict()
  cand_state = candidate.state_dict()
  shared = {k: v for k, v in ref_state.items()
            if k in cand_state and cand_state[k].shape == v.shape and cand_state[k].dtype == v.dtype}
  if shared:
    candidate.load_state_dict(shared, strict=False)
  return len(shared)


def output_sizes(outputs: Any) -> list[int]:
  """Byte sizes of the tensors in an output tree (what `poison_allocator` primes)."""
  return [t.numel() * t.element_size() for t in flatten(outputs)
          if isinstance(t, torch.Tensor) and t.numel() > 0]


def poison_allocator(sizes: list[int], device: torch.device) -> None:
  """Leaves NaN-filled blocks of these byte sizes in the caching allocator's free lists."""
  blocks = [torch.full(((n + 3) // 4,), float("nan"), dtype=torch.float32, device=device)
            for n in sizes]
  del blocks


def scrub(tree: Any, keep: list[Any]) -> None:
  """NaN-fills reference outputs once read (not memory in `keep`, the reference's own weights),
  so no later allocation can hand their values to a candidate."""
  owned = _spans(keep)
  for t in flatten(tree):
    if isinstance(t, torch.Tensor) and t.is_floating_point() and not _overlap(_spans(t), owned):
      t.fill_(float("nan"))


def _spans(tree: Any) -> list[tuple[int, int]]:
  spans = []
  for t in flatten(tree):
    if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
      start = t.untyped_storage().data_ptr()
      spans.append((start, start + t.untyped_storage().nbytes()))
  return spans


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
  return any(s < e2 and s2 < e for s, e in a for s2, e2 in b)


def output_aliases(cand_out: Any, cand_inputs: Any, ref_out: Any, ref_inputs: Any,
                   live_reference: list[Any]) -> list[tuple[str, str]]:
  """OUTPUT_REUSE findings for one call's outputs."""
  found, out_spans = [], _spans(cand_out)
  if _overlap(out_spans, _spans(cand_inputs)) and not _overlap(_spans(ref_out),
                                                                  _spans(ref_inputs)):
    found.append(("OUTPUT_REUSE", "returned memory of its own inputs; the reference does not"))
  if any(_overlap(out_spans, _spans(tree)) for tree in live_reference):
    found.append(("OUTPUT_REUSE", "returned memory that belongs to the reference"))
  return found


def _compare_tensor(index: int, ref: torch.Tensor, cand: Any, atol: float,
                    rtol: float) -> tuple[bool, float, float, str, list[tuple[str, str]]]:
  where = f"output {index}"
  if not isinstance(cand, torch.Tensor):
    return False, math.inf, math.inf, f"{where} is {type(cand).__name__}, expected a tensor", []
  if type(cand) is not torch.Tensor:  # pylint: disable=unidiomatic-typecheck
    return False, math.inf, math.inf, f"{where} is a tensor subclass {type(cand).__name__}", [
        ("TENSOR_SUBCLASS", f"{where}: {type(cand).__qualname__}")]
  if tuple(cand.shape) != tuple(ref.shape):
    return False, math.inf, math.inf, (
        f"{where} shape {tuple(cand.shape)} != reference {tuple(ref.shape)}"), []
  if cand.dtype != ref.dtype:
    return False, math.inf, math.inf, f"{where} dtype {cand.dtype} != reference {ref.dtype}", []
  if cand.device != ref.device:
    return False, math.inf, math.inf, f"{where} on {cand.device}, reference on {ref.device}", []
  if not ref.is_floating_point() and not ref.is_complex():
    equal = torch.equal(cand, ref)
    diff = 0.0 if equal else float((cand.double() - ref.double()).abs().max())
    return equal, diff, diff, "" if equal else f"{where} differs (max abs {diff:g})", []
  compute = torch.float64 if ref.dtype == torch.float64 else torch.float32
  r, c = ref.to(compute), cand.to(compute)
  r_nan, c_nan = torch.isnan(r), torch.isnan(c)
  if not torch.equal(r_nan, c_nan):
    extra = int((c_nan & ~r_nan).sum())
    return False, math.inf, math.inf, (
        f"NaN in {where} at {extra} positions where the reference is finite" if extra else
        f"{where} is finite where the reference is NaN"), []
  r_inf, c_inf = torch.isinf(r), torch.isinf(c)
  if not torch.equal(r_inf, c_inf) or not torch.equal(r[r_inf], c[c_inf]):
    return False, math.inf, math.inf, f"Inf in {where} does not match the reference", []
  finite = ~(r_nan | r_inf)
  if not bool(finite.any()):
    return True, 0.0, 0.0, "", []
  r, c = r[finite], c[finite]
  diff = (c - r).abs()
  max_abs = float(diff.max())
  max_rel = float((diff / r.abs().clamp_min(torch.finfo(compute).tiny)).max())
  bad = diff > atol + rtol * r.abs()
  if bool(bad.any()):
    return False, max_abs, max_rel, (
        f"{where}: {int(bad.sum())} of {bad.numel()} elements exceed atol={atol:g} rtol={rtol:g} "
        f"(max abs {max_abs:.3g}, max rel {max_rel:.3g})"), []
  return True, max_abs, max_rel, "", []


def compare(reference: Any, candidate: Any, atol: float, rtol: float,
            what: str = "output") -> tuple[bool, float, float, str, list[tuple[str, str]]]:
  """Compares two output trees; returns (passed, max_abs, max_rel, message, exploits)."""
  refs, cands = flatten(reference), flatten(candidate)
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


def run_trial(reference: torch.nn.Module, candidate: torch.nn.Module,
              get_inputs: Callable[[], Any], seed: int, device: torch.device,
              dtype: torch.dtype | None, atol: float, rtol: float,
              synchronize: Callable[[], None],
              observe: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
              poison: list[int] | None = None, live_reference: list[Any] | None = None) -> Trial:
  """One trial, candidate first; raises ReferenceFailure or CandidateFailure when a side raises.

  `observe()` wraps the candidate's call (the runner's op recorder and tracer); `poison` are the
  byte sizes to prime the allocator with; `live_reference` are reference tensors (parameters,
  buffers) the candidate's outputs must not share memory with.
  """
  set_seed(seed)
  try:
    inputs = to_device(get_inputs(), device, dtype)
  except Exception as e:  # pylint: disable=broad-except
    raise ReferenceFailure(f"get_inputs() raised {type(e).__name__}: {e}") from e
  ref_inputs, cand_inputs = clone_tree(inputs), clone_tree(inputs)
  del inputs
  with torch.no_grad():
    poison_allocator(poison or [], device)
    set_seed(seed)
    try:
      with observe():
        cand_out = candidate(*cand_inputs)
      synchronize()
    except Exception as e:  # pylint: disable=broad-except
      raise CandidateFailure(f"ModelNew forward raised {type(e).__name__}: {e}") from e
    set_seed(seed)
    try:
      ref_out = reference(*ref_inputs)
      synchronize()
    except Exception as e:  # pylint: disable=broad-except
      raise ReferenceFailure(f"reference forward raised {type(e).__name__}: {e}") from e
  ok, max_abs, max_rel, message, exploits = compare(ref_out, cand_out, atol, rtol)
  trial = Trial(seed, ok, max_abs, max_rel, message, exploits)
  same, _, _, why, _ = compare(ref_inputs, cand_inputs, atol, rtol, what="input")
  if not same:
    trial.exploits.append(("INPUT_MUTATION", why))
    if ok:
      trial.passed = False
      trial.message = f"ModelNew modified its inputs: {why}"
  # Returning a mutated input is the mutation's symptom (INCORRECT), not a separate exploit.
  trial.exploits += [f for f in output_aliases(cand_out, cand_inputs, ref_out, ref_inputs,
                                               live_reference or [])
                     if same or "own inputs" not in f[1]]
  trial.output_sizes = output_sizes(ref_out)
  with torch.no_grad():
    scrub(ref_out, (live_reference or []) + [ref_inputs])
  return trial
