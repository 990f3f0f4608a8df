"""Tripwire for dispatcher tampering in the candidate's process: its own kernels for torch's ops.

`baseline()` snapshots the dispatcher once per worker, before it forks any job's process: per
operator, `torch._C._dispatch_dump(op)` (every kernel registered for each dispatch key, with the
file and line that registered it; overridden ones marked "(inactive)"), and which dispatch keys
have a backend fallback. `Registrations.changes()` compares a fresh dump with it, at the end of
the candidate's run (and when it ends in an error):
- an operator of a namespace that existed at the snapshot (aten, prims, ...: torch's own) that
  gained a kernel or schema registered outside torch's sources: DISPATCH_OVERRIDE, naming the line.
  Python `torch.library` registrations carry the caller's file ("candidate.py:12"), C++
  TORCH_LIBRARY_IMPL / TORCH_LIBRARY_FRAGMENT the extension's source file;
- a backend fallback for a dispatch key that had none (`m.fallback(...)` in TORCH_LIBRARY_IMPL(_,
  ...)): DISPATCH_OVERRIDE;
- operators in namespaces that did not exist are the candidate's own (TORCH_LIBRARY(myops, m)).
Lines registered from torch's own sources (its install folder, or the build tree its baseline
registrations name) are ignored: torch registers some kernels lazily (meta kernels when
torch._refs is first imported, libraries loaded on first use), and those are not the candidate's.

A tripwire, not the defence: the reference, the comparison and the reference's timing run in the
judge, where no candidate registration exists. Blind spots, which the static check
(compile/checks.py) narrows by refusing private dispatcher APIs and TORCH_LIBRARY_IMPL for torch's
namespaces in the sources: a registration removed again before the end of the run, and one that
forges a torch source path (`torch._C._dispatch_library(..., filename)`, `#line`).

Cost: one dump of ~3,600 operators per job (~0.15 s on the 2-core CI VM), plus the worker's one.
"""

from __future__ import annotations

import os
import re

import torch

from verifier_service import enums

_SITE = re.compile(r"registered at (.*):\d+(?: ::|$)")


def _dump() -> dict[str, str]:
  dump, names = torch._C._dispatch_dump, torch._C._dispatch_get_all_op_names  # pylint: disable=protected-access
  return {name: dump(name) for name in names()}


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


_SOURCE_TREE = re.compile(r"^(.*?)/(?:aten/src|torch/csrc|build|c10|caffe2|third_party|torch)/")


def _roots(sites: set[str], torch_dir: str) -> set[str]:
  """The source trees torch was built from, as its own registrations name them."""
  roots = set()
  for site in sites:
    match = _SOURCE_TREE.match(site)
    if match and not site.startswith(torch_dir) and match.group(1):
      roots.add(match.group(1) + "/")
  return roots


class Registrations:
  """A snapshot of the dispatcher's registrations; `changes()` names what was added since."""

  def __init__(self, ops: dict[str, str], fallbacks: set[str]):
    self._ops = ops
    self._fallbacks = fallbacks
    self._namespaces = {name.partition("::")[0] for name in ops}
    self._torch_sites = {site for text in ops.values() for site in _sites(text)}
    self._torch_dir = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
    self._torch_roots = tuple(_roots(self._torch_sites, self._torch_dir))

  @classmethod
  def take(cls) -> Registrations:
    return cls(_dump(), _fallbacks())

  def _foreign(self, line: str) -> bool:
    match = _SITE.search(line)
    if match is None:
      return False
    site = match.group(1)
    return site not in self._torch_sites and not site.startswith(self._torch_roots) and not (
        os.path.realpath(site).startswith(self._torch_dir))

  def changes(self) -> list[tuple[str, str]]:
    found = []
    for name, text in _dump().items():
      before = self._ops.get(name)
      if before == text or name.partition("::")[0] not in self._namespaces:
        continue
      old = set(before.splitlines()) if before is not None else set()
      for line in text.splitlines():
        if line not in old and self._foreign(line):
          found.append((enums.DISPATCH_OVERRIDE, f"{name}: {line.strip()[:200]}"))
          break
    for key in sorted(_fallbacks() - self._fallbacks):
      found.append((enums.DISPATCH_OVERRIDE, f"a backend fallback was registered for {key}"))
    return found[:8]


_BASELINE: list[Registrations] = []


def baseline() -> Registrations:
  """The snapshot every job's process compares with; taken once (in the worker, before it forks
  any job's process, so each job pays for one dump instead of two)."""
  if not _BASELINE:
    _BASELINE.append(Registrations.take())
  return _BASELINE[0]
