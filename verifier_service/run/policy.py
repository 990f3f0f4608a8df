"""The partial-replacement policy: who did the work, decided on the trusted side from evidence.

Runs in the worker when it merges the two processes' reports (trusted/verdict.py). Evidence about
the candidate comes from its own process, which can suppress it but never turn it in its favour
(a missing report is not OK); the reference's op list comes from the judge, which never loaded
candidate code.

Evidence (`evidence` dict, from the candidate's process):
  compute_ops   {"aten::mm": calls} torch ops outside the glue allow-list (ops.py) that
                ModelNew.forward dispatched during the correctness trials, including those its
                C++ called through the dispatcher
  launched      own kernels seen launching in one profiled forward (GPU); None when not measured
  own_fraction  own kernels' share of GPU kernel time (GPU), or of forward's CPU time outside
                torch's compute ops (CPU test worker); None when not measured
  library       the busiest library kernels, [(name, us)] (GPU)
  foreign_kernels  kernels it launched that were compiled for another candidate of its compile
                batch (compile/batch.py): FOREIGN_KERNEL under every policy

Policies (proto `Policy`):
  POLICY_DEFAULT  KernelBench/DICE: correct outputs count if the candidate's own kernels launched
                  and did part of the work. Rejected: NO_CUSTOM_KERNEL_LAUNCHED when none of its
                  kernels launched, and TORCH_FALLBACK when torch's compute ops in forward cover
                  every op family the reference computes (the candidate's kernels did none of the
                  reference's work, however many of them ran).
  POLICY_STRICT   what the verifier did before the policy existed: TORCH_FALLBACK for any torch
                  compute op in forward, and for own kernels below `min_fraction` of the GPU
                  kernel time while library kernels ran.
Under both, decoys, try/except fallbacks (static checks and the forward tracer) and torch-only
candidates are rejected; the fraction is reported in every verdict either way.

Decision: coverage by op family rather than a share threshold for the default. The DICE items
KernelBench calls correct keep 71-96% of the GPU time in cuBLAS/cuDNN beside a real fused
epilogue, while a do-nothing kernel beside torch.relu(x + y) can take 5%: no threshold separates
them, but "torch alone computed every kind of op the reference computes" does. Its blind spot is a
candidate that recomputes the reference through different op families beside a decorative kernel
(torch.where instead of relu); strict catches that.
"""

from __future__ import annotations

from typing import Any

from verifier_service import enums
from verifier_service.run import ops

DEFAULT, STRICT = enums.POLICY_DEFAULT, enums.POLICY_STRICT


def _names(compute_ops: dict[str, int], limit: int = 12) -> str:
  return ", ".join(f"{name} x{n}" for name, n in list(compute_ops.items())[:limit])


def findings(policy: str, min_fraction: float, evidence: dict[str, Any],
             reference_ops: list[str] | None) -> list[tuple[str, str]]:
  """(Exploit name, evidence) pairs the policy rejects for; [] when the candidate's work counts."""
  found: list[tuple[str, str]] = []
  compute = dict(evidence.get("compute_ops") or {})
  launched = evidence.get("launched")
  foreign = evidence.get("foreign_kernels") or []
  if foreign:
    found.append((enums.FOREIGN_KERNEL, "launched kernels compiled for another candidate: "
                  + ", ".join(str(n)[:120] for n in foreign[:4])))
  if launched is not None and not launched:
    found.append((enums.NO_CUSTOM_KERNEL_LAUNCHED,
                  "none of the compiled kernels ran during forward: "
                  + ", ".join(evidence.get("kernel_names", [])[:8])))
  if policy == STRICT:
    if compute:
      found.append((enums.TORCH_FALLBACK, "torch computed values in ModelNew.forward: " +
                    _names(compute)))
    own, library = evidence.get("own_fraction"), evidence.get("library") or []
    if launched and own is not None and own < min_fraction and library:
      names = ", ".join(f"{n[:80]} ({d:.1f} us)" for n, d in library)
      found.append((enums.TORCH_FALLBACK, f"kernels the candidate did not write did "
                    f"{100 * (1 - own):.0f}% of the GPU work (strict needs at least "
                    f"{100 * min_fraction:.0f}% in its own): {names}"))
    return found
  needed = ops.compute_families(reference_ops or [])
  done_by_torch = ops.compute_families(compute)
  if needed and needed <= done_by_torch:
    found.append((enums.TORCH_FALLBACK, f"torch computed every kind of op the reference computes "
                  f"({', '.join(sorted(needed))}); the candidate's kernels did none of that work: "
                  + _names(compute)))
  return found
