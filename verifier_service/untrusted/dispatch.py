"""Tripwire for dispatcher tampering in the candidate's process: its own kernels for torch's ops.

`Registrations.take()` snapshots the dispatcher after the trusted setup, before the reference or
the candidate is executed: per operator, `torch._C._dispatch_dump(op)` (every kernel registered for
each dispatch key, with the file and line that registered it; overridden ones marked "(inactive)"),
and which dispatch keys have a backend fallback. `changes()` compares a fresh dump with it:
- an operator of a namespace that existed at the snapshot (aten, prims, ...: torch's own) that
  gained a kernel or schema registered outside torch's sources: DISPATCH_OVERRIDE, naming the line.
  Python `torch.library` registrations carry the caller's file ("candidate.py:12"), C++
  TORCH_LIBRARY_IMPL / TORCH_LIBRARY_FRAGMENT the extension's source file;
- a backend fallback for a dispatch key that had none (`m.fallback(...)` in TORCH_LIBRARY_IMPL(_,
  ...)): DISPATCH_OVERRIDE;
- operators in namespaces that did not exist are the candidate's own (TORCH_LIBRARY(myops, m)).
Lines registered from torch's own sources are ignored: torch registers some kernels lazily (meta
kernels when torch._refs or torch._dynamo is first imported), and those are not the candidate's.

A tripwire, not the defence: the reference, the comparison and the reference's timing run in the
judge, where no candidate registration exists. Blind spots, which the static check (checks.py)
narrows by refusing private dispatcher APIs and TORCH_LIBRARY_IMPL for torch's namespaces in the
sources: a registration removed again between two snapshots, and a registration that forges a
torch source path (`torch._C._dispatch_library(..., filename)`, `#line`).

Cost: one dump of ~3,600 operators, ~0.15 s on the 2-core CI VM; taken twice per job (after
loading the candidate, and at the end).
"""

from __future__ import annotations

import os
import re

import torch

_SITE = re.compile(r"registered at (.*):\d+(?: ::|$)")


def _dump() -> dict[str, str]:
  dump = torch._C._dispatch_dump  # pylint: disable=protected-access
  return {name: dump(name) for name in torch._C._dispatch_get_all_op_names()}  # pylint: disable=protected-access


def _fallbacks() -> set[str]:
  has = torch._C._dispatch_has_backend_fallback  # pylint: disable=protected-access
  out = set()
  for name, key in torch._C.DispatchKey.__members__.items():  # pylint: disable=protected-access
    try:
      if has(key):
        out.add(name)
    except RuntimeError:
      pass  # alias keys have no fallback table entry
  return out


def _sites(text: str) -> set[str]:
  return {m.group(1) for m in map(_SITE.search, text.splitlines()) if m}


class Registrations:
  """A snapshot of the dispatcher's registrations; `changes()` names what was added since."""

  def __init__(self, ops: dict[str, str], fallbacks: set[str]):
    self._ops = ops
    self._fallbacks = fallbacks
    self._namespaces = {name.partition("::")[0] for name in ops}
    self._torch_sites = {site for text in ops.values() for site in _sites(text)}
    self._torch_dir = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep

  @classmethod
  def take(cls) -> Registrations:
    return cls(_dump(), _fallbacks())

  def _foreign(self, line: str) -> bool:
    match = _SITE.search(line)
    if match is None:
      return False
    site = match.group(1)
    return site not in self._torch_sites and not os.path.realpath(site).startswith(self._torch_dir)

  def changes(self) -> list[tuple[str, str]]:
    found = []
    for name, text in _dump().items():
      before = self._ops.get(name)
      if before == text or name.partition("::")[0] not in self._namespaces:
        continue
      old = set(before.splitlines()) if before is not None else set()
      for line in text.splitlines():
        if line not in old and self._foreign(line):
          found.append(("DISPATCH_OVERRIDE", f"{name}: {line.strip()[:200]}"))
          break
    for key in sorted(_fallbacks() - self._fallbacks):
      found.append(("DISPATCH_OVERRIDE", f"a backend fallback was registered for {key}"))
    return found[:8]
