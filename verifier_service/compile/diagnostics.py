"""What of a compiler's output may leave the compile stage.

Every output the compile stage reads from a process (procs.py: each command's; front_ends.py: a
warm front end's) goes through `Redactor.clean` first, so build records, the verdict's compile log
and message, scheduler logs of it, the CLI's table and its JSON only ever hold cleaned text.

Two rules:
1. Only files the candidate may be quoted from are quoted: its own sources (the build folder) and
   the files beneath the read-only roots a confined compiler may read (the toolkit, the compiler's
   own install and system headers, torch's and Python's headers, the shared header tiers). A
   diagnostic located anywhere else (an `#include "/etc/hostname"`, a `#line 1 "/etc/passwd"`
   whose lines the tool rereads for its excerpt, an assembler `.include`, a linker script) keeps
   its path, which the candidate wrote, and its kind (error, warning, note), but its text is
   replaced by "[withheld ...]" and its continuation lines (the quoted source line, the caret,
   instantiation notes) are dropped: tools quote the lines they point at, and their messages
   quote tokens of the file. Paths are resolved first (`..`, symlinks), so a link from an allowed
   folder to a host file does not pass.
2. Our own folders get neutral names: the build folder goes (paths become relative to it, as the
   candidate's own file names are), and the cache folder, torch's package folder, the toolkit and
   the Python installation become <cache>, <torch>, <cuda> and <python>.

Confinement (confine.py) is the first defence: a confined compiler cannot open such a file at all,
and its log only says so. This is the second, for a layer a kernel lacks or an unconfined server.
Not covered: output that quotes a file without naming it as a location (a response file `@F` in a
candidate's flags is expanded into command-line words) - only confinement stops that.
"""

from __future__ import annotations

import functools
import os
import re

WITHHELD = "[withheld: a diagnostic in a file outside the candidate's sources]"

_KIND = r"(?P<kind>fatal error|internal compiler error|catastrophic error|error|warning|note|" \
        r"remark|Error|Warning|Fatal error|Info|Message)"
# path:line[:col]: ...   (gcc, g++, as; ld and as with their program name first)
_GNU_RE = re.compile(r"^(?P<lead>(?:\S*?\b(?:ld(?:\.\w+)?|as): ?)?)(?P<path>[^\s:\"][^:\n\"]*?):(?P<line>\d+)"
                     r"(?::\d+)?:(?P<rest>.*)$")
# path(line): kind ...   or   "path", line N: ...   (nvcc's EDG front ends: cudafe++, cicc)
_EDG_RE = re.compile(r"^(?P<lead>)\"?(?P<path>[^\s\"(][^\"(\n]*?)\"?\((?P<line>\d+)\):(?P<rest>.*)$")
_EDG_OLD_RE = re.compile(r"^(?P<lead>)\"(?P<path>[^\"\n]+)\", line (?P<line>\d+):(?P<rest>.*)$")
# path: In function 'f': / At global scope: / Assembler messages:  (context headers)
_CONTEXT_RE = re.compile(r"^(?P<lead>)(?P<path>[^\s:][^:\n]*?): (?P<rest>(?:In (?:function|member "
                         r"function|static member function|constructor|destructor|instantiation"
                         r"|substitution|lambda function|copy constructor)|At global scope|"
                         r"Assembler messages|At top level).*)$")
# ptxas PATH, line N; error   : ...
_PTXAS_RE = re.compile(r"^(?P<lead>ptxas )(?P<path>\S+?), line (?P<line>\d+);(?P<rest>.*)$")
_LOCATION_RES = (_PTXAS_RE, _EDG_OLD_RE, _EDG_RE, _CONTEXT_RE, _GNU_RE)
_KIND_RE = re.compile(_KIND)


class Redactor:
  """Cleans compiler output given where the build ran (`clean`).

  `roots`: folders and files the candidate may be quoted from besides its build folder.
  `names`: our folders and the neutral names that replace them."""

  def __init__(self, roots: list[str], names: dict[str, str]):
    self._roots = tuple(sorted({os.path.realpath(r) for r in roots}))
    pairs = {}
    for path, name in names.items():
      for form in {path.rstrip("/"), os.path.realpath(path)}:
        if form and form != "/":
          pairs[form] = name
    self._names = sorted(pairs.items(), key=lambda kv: -len(kv[0]))

  def clean(self, text: str, cwd: str | os.PathLike | None = None) -> str:
    """`text` with diagnostics in foreign files withheld and our folders renamed."""
    if not text:
      return text
    folders = [] if cwd is None else sorted({str(cwd).rstrip("/"), os.path.realpath(cwd)},
                                            key=len, reverse=True)
    out, dropping = [], False
    for line in text.split("\n"):
      match = _location(line)
      if match is not None:
        path = match.group("path")
        if self._allowed(path, None if cwd is None else str(cwd)):
          out.append(line)
          dropping = False
        else:
          out.append(_withheld(match))
          dropping = True
        continue
      if dropping and (not line.strip() or line[:1] in (" ", "\t")):
        continue  # the withheld diagnostic's excerpt, caret or notes
      dropping = False
      out.append(line)
    cleaned = "\n".join(out)
    for folder in folders:
      cleaned = cleaned.replace(folder + "/", "")
    for path, name in self._names:
      cleaned = cleaned.replace(path, name)
    return cleaned

  def _allowed(self, path: str, cwd: str | None) -> bool:
    if path.startswith("<") or path in ("-", "cc1plus", "cc1", "collect2", "nvcc"):
      return True  # <command-line>, <built-in>, standard input, tool names
    return _inside(_resolve(path, cwd), self._roots + ((os.path.realpath(cwd),) if cwd else ()))


def _withheld(match: re.Match) -> str:
  """The location and kind of a diagnostic, its text withheld."""
  where = match.group("path")
  if "line" in match.re.groupindex:
    where += f":{match.group('line')}"
  kind = _KIND_RE.search(match.group("rest"))
  return f"{match.group('lead')}{where}:{' ' + kind.group('kind') + ':' if kind else ''} {WITHHELD}"


def _location(line: str) -> re.Match | None:
  if not line or line[0] in (" ", "\t"):
    return None
  for pattern in _LOCATION_RES:
    match = pattern.match(line)
    if match:
      return match
  return None


@functools.lru_cache(maxsize=4096)
def _resolve(path: str, cwd: str | None) -> str:
  joined = path if os.path.isabs(path) or cwd is None else os.path.join(cwd, path)
  return os.path.realpath(joined)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
  return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
