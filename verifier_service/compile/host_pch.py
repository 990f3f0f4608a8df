"""A precompiled header for the last step of an nvcc compile: g++ on cudafe++'s host code.

cudafe++ turns a translation unit into the host C++ that g++ compiles last (`cuda.cudafe1.cpp`,
see nvcc_split.py). At a light header tier, with the tier's module id and paths relative to the
work folder (compiler.py arranges both), that file starts with the same text for every candidate:
the host code of the tier's headers (8.6 MB for the lite tier), up to the first line marker that
returns to the candidate's own file. That prefix is precompiled once (pch.py), and the host
compile then reads `#include "<pch>/dice_host.h"` followed by the rest of the file: the same
tokens, so the same object (byte for byte, tested), for about a third of the CPU time.

Decisions:
- Checked, not assumed: the prefix is cut from each candidate's own file and looked up by its
  digest; a candidate whose prefix differs (other flags, another tier) finds no header and is
  compiled as written.
- Built in the background once `min_uses` builds share a prefix (a one-off `dice-verifier check`
  never pays for it), ahead of waiting compiles (a burst's later builds all gain from it), and
  never waited for: until it exists, builds compile the file as written.
- If the rewritten input fails to compile, nvcc_split compiles the original input and that result
  stands.
"""

from __future__ import annotations

import collections
import logging
import pathlib
import re
import shlex
from typing import Callable

from verifier_service.compile import nvcc_split
from verifier_service.compile import pch as pch_lib

log = logging.getLogger(__name__)

NAME = "dice_host.h"
_FIRST_MARKER_RE = re.compile(r'# 1 "([^"\n]+)"\n')
_VAR_RE = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")


def split_command(command: str, env: dict[str, str]) -> tuple[str, list[str], str] | None:
  """nvcc's host compile `CXX ... -c -x c++ ... SRC.cudafe1.cpp -o OUT` as (CXX, flags without
  -c/-x/SRC/-o, SRC); None for any other shape."""
  expanded = _VAR_RE.sub(lambda m: env.get(m.group(1), m.group(0)), command)
  if "$" in expanded:
    return None
  tokens = shlex.split(expanded)
  sources = [t for t in tokens if t.endswith(".cudafe1.cpp")]
  if len(sources) != 1 or tokens.count("-o") != 1 or tokens.count("-c") != 1:
    return None
  out = tokens.index("-o")
  flags = [t for i, t in enumerate(tokens[1:], 1)
           if i not in (out, out + 1) and t not in ("-c", sources[0])]
  for i in range(len(flags) - 1):
    if flags[i] == "-x" and flags[i + 1] == "c++":
      del flags[i:i + 2]
      return tokens[0], flags, sources[0]
  return None


def shared_prefix(text: str) -> int:
  """Where the candidate's own code starts: the first line marker back into the main file."""
  first = _FIRST_MARKER_RE.match(text)
  if not first:
    return 0
  marker = re.compile(rf'^# \d+ "{re.escape(first.group(1))}"$', re.M)
  found = marker.search(text, first.end())
  return found.start() if found else 0


class HostHeaders:
  """`prepare` is nvcc_split's `prepare_final` hook."""

  def __init__(self, headers: pch_lib.PrecompiledHeaders, min_uses: int = 2):
    self._headers = headers
    self._min_uses = min_uses
    self._uses: collections.Counter[pathlib.Path] = collections.Counter()
    self.used = 0  # host compiles that read a precompiled prefix

  async def prepare(self, plan: nvcc_split.Plan,
                    cwd: pathlib.Path) -> tuple[str, Callable[[], None]] | None:
    parts = split_command(plan.final, plan.env)
    if parts is None:
      return None
    cxx, flags, source = parts
    path = cwd / source
    text = path.read_text()
    cut = shared_prefix(text)
    if cut == 0:
      return None
    prefix = text[:cut]
    folder = self._headers.folder((cxx,), tuple(flags), prefix)
    header = self._headers.ready(folder, NAME)
    if header is None:
      self._uses[folder] += 1
      if self._uses[folder] >= self._min_uses:
        self._headers.prefetch((cxx,), tuple(flags), prefix, NAME,
                               "the host code nvcc's last step shares")
      return None
    path.write_text(f'#include "{header.path}"\n' + text[cut:])
    self.used += 1
    command = re.sub(r"^(\s*\S+)", r"\1 -Winvalid-pch", plan.final, count=1)
    return command, lambda: _write(path, text)


def _write(path: pathlib.Path, text: str) -> None:
  path.write_text(text)
