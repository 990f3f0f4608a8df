"""The split's device halves preprocessed from a snapshot of their headers' macros.

Why: a device half (device_split.py) is one include of a header of system headers (`marker`'s
first line, then `#line 1`) and the candidate's device code, and nvcc preprocesses it twice (its
host and device passes), each over the whole headers. On the H200 RL burst of 2026-12-04 17:20
UTC the device halves' three gcc runs (those two passes and the host compile of cudafe++'s output)
took 201 of the 1,051 compile CPU-s of its two steps, 0.45 CPU-s a run (median). The candidate's
code alone, preprocessed after the headers' macros, takes 0.03 CPU-s where the whole takes
0.48-0.56 (CPU VM, 2026-12-04; benchmarks/verifier_rest_preprocess.py).

How, per preprocessing command (nvcc's dry-run step less its input and output names, with its
environment and the included header's content):
  snapshot  from the first device half whose usual pass succeeds in silence (that result
            stands): the usual output up to the line where the main file resumes after the
            include (`# 2 "cuda.cu" 2`), which every half's output starts with; the command with
            `-dD` on the include line alone, giving the headers' `#define` and `#undef` lines in
            order, each under the line marker of the file it came from, so that a macro of a
            system header expands marked as one (`# 14 "cuda.cu" 3 4`), as in the usual pass
            (gcc's own predefined macros left out); and which of the headers' includes do nothing
            when repeated after them (`quiet_includes`: guarded headers gcc skips unopened).
  a half    its code after `marker`, its leading includes of quiet headers blanked (load_inline
            sources start with `#include <cuda.h>` and `<cuda_runtime.h>`), preceded by an
            include of a stub (the prefix's last lines: `stub_text`, so that gcc's printer
            reaches the code in the state the headers left it in) and `#line 1`, is preprocessed
            with `-imacros` of the snapshot and without the command's `-include`s, in a folder of
            its own; its output after `# 2 "cuda.cu" 2` follows the prefix.
Checked, not assumed: until a half other than the snapshot's own has been run both ways with
outputs equal byte for byte, each half runs both ways (the usual output is used); a difference
switches the command off (logged with what differed); after that every `check_every`th half runs
both ways too. A command's key leaves out the VARYING macros' values (load_inline's module name),
so one snapshot serves every candidate.
tests/verifier/test_verifier_rest_preprocess.py compares the two ways' outputs and objects with
real nvcc on sources written to tell them apart; tests/verifier/test_verifier_split.py builds
DICE's items with it (the lite builds' SASS).

Every pass (the usual one, the snapshot's, a half's own) runs through the compile stage's process
runner, confined and bounded as every compiler process is (confine.py, limits.py).

Refused (the usual pass runs): a command that is not a plain `gcc -E` of one input (shell
variables, relative include folders, an input in another folder); a half whose code names what a
snapshot of macros does not carry (any other include, `#line`, __COUNTER__, __BASE_FILE__,
__INCLUDE_LEVEL__, `push_macro`/`pop_macro`, `_Pragma`, `poison`, `system_header`,
`__has_include`, `#pragma once`, `dependency`); and a half whose own pass fails or prints anything
(the usual pass's messages decide).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import pathlib
import re
import shlex
import shutil
from typing import Awaitable, Callable

from verifier_service.compile import nvcc_split

log = logging.getLogger(__name__)

# (argv, cwd) -> (return code, combined output): the compile stage's confined process runner.
RunFn = Callable[[list[str], pathlib.Path], Awaitable[tuple[int, str]]]

CHECK_EVERY = 32
_STUB = "dice_pp_stub.h"
_MACROS = "dice_pp_macros.h"
_OUT = "dice_pp_rest.ii"
_VALUED = {"-o", "-include", "-imacros", "-isystem", "-I", "-x", "-D", "-U", "-idirafter",
           "-iquote", "-MF", "-MT", "-MQ", "-Xpreprocessor", "-iprefix", "-iwithprefix",
           "-isysroot", "--param", "-aux-info"}
_FOLDERS = ("-I", "-isystem", "-iquote", "-idirafter", "-imacros")
_REFUSED_RE = re.compile(
    r"#\s*(include|include_next|import|line)\b|__COUNTER__|__BASE_FILE__|__INCLUDE_LEVEL__|"
    r"push_macro|pop_macro|_Pragma|#\s*pragma\s+(once|GCC\s+(poison|system_header|dependency))|"
    r"__has_include|#\s*\d")
# Command-line macros that differ per candidate and that no header reads (load_inline's module
# name): left out of a command's key and of its snapshot, so that one snapshot serves every
# candidate; each half's own pass defines its own. That no header reads them is checked, not
# assumed: a snapshot's first check is of another half than the one it was taken from.
VARYING = ("TORCH_EXTENSION_NAME",)
_VARYING_RE = re.compile(r"^(-D\s*(?:%s)=).*$" % "|".join(VARYING), re.S)
_TRIES = 3  # first halves whose usual pass failed or printed, before a command is off
_INCLUDE_RE = re.compile(r"^\s*#\s*include\s*<([^<>\s]+)>\s*$")
_MARKER_RE = re.compile(r'^# \d+ "')
_FLAGS_RE = re.compile(r'^(# \d+ "(?:[^"\\]|\\.)*")((?: \d)*)$')


@dataclasses.dataclass(frozen=True)
class _Step:
  """A `gcc -E` step: its argv with the input and output at `source` and `output`."""
  command: str
  argv: tuple[str, ...]
  source: int
  output: int

  @property
  def input_name(self) -> str:
    return self.argv[self.source]

  @property
  def return_marker(self) -> bytes:
    """The line gcc prints where the main file resumes after its first line's include."""
    return f'# 2 "{self.input_name}" 2\n'.encode()

  def with_files(self, source: str, output: str, drop_includes: bool = False,
                 extra: tuple[str, ...] = ()) -> list[str]:
    """The argv on another input and output, `extra` before the input; without `-include`s."""
    out, skip = [], False
    for i, arg in enumerate(self.argv):
      if skip:
        skip = False
        continue
      if drop_includes and arg == "-include":
        skip = True
        continue
      if i == self.source:
        out += [*extra, source]
      elif i == self.output:
        out.append(output)
      else:
        out.append(arg)
    return out

  @property
  def key(self) -> str:
    """The command less its input, output and the values of VARYING macros."""
    argv = self.with_files("{src}", "{out}")
    return shlex.join(_VARYING_RE.sub(r"\1*", f"-D{a}" if b == "-D" else a)
                      for b, a in zip(["", *argv], argv))


def parse_step(command: str) -> _Step | None:
  """The `gcc -E` step in `command` (nvcc's dry-run line), or None where it is anything else."""
  if "$" in command or "`" in command:
    return None
  try:
    argv = shlex.split(command)
  except ValueError:
    return None
  if not argv or not argv[0].rsplit("/", 1)[-1].endswith(("gcc", "g++", "c++")) or "-E" not in argv:
    return None
  positional, output, i = [], None, 1
  while i < len(argv):
    arg = argv[i]
    if arg in _VALUED:
      if i + 1 >= len(argv):
        return None
      if arg == "-o":
        output = i + 1
      elif arg in _FOLDERS and not argv[i + 1].startswith("/"):
        return None  # a relative folder would mean another one from a half's own folder
      i += 2
      continue
    joined = next((f for f in _FOLDERS if arg.startswith(f) and len(arg) > len(f)), None)
    if joined is not None and not arg[len(joined):].startswith("/"):
      return None
    if not arg.startswith("-"):
      positional.append(i)
    i += 1
  if output is None or len(positional) != 1 or "/" in argv[positional[0]]:
    return None
  return _Step(command, tuple(argv), positional[0], output)


def macro_snapshot(dd_output: str) -> str:
  """The `#define`/`#undef` lines of a `-dD` pass, each under its file's line marker, gcc's own
  predefined macros (`<built-in>`) and the VARYING command-line ones left out."""
  keep, inside, command_line = [], False, False
  varying = re.compile(r"#(define|undef) (%s)\b" % "|".join(VARYING))
  for line in dd_output.splitlines():
    if _MARKER_RE.match(line):
      inside = '"<built-in>"' not in line
      command_line = '"<command-line>"' in line
      if inside:
        keep.append(line)
    elif inside and line.startswith(("#define ", "#undef ")) and not (
        command_line and varying.match(line)):
      keep.append(line)
  return "\n".join(keep) + "\n"


def stub_text(prefix: str) -> str:
  """What a half's own pass includes before its code: the end of the usual output before the
  main file resumes, from its last line marker that code follows, with the marker's flags 1 and 2
  (entering and leaving a file) dropped. Preprocessed again, it leaves gcc's printer as the
  headers did (the file, line and system-ness of the last token printed), which decides how the
  code's first lines are marked."""
  lines = prefix.splitlines(keepends=True)
  at = next((i for i in range(len(lines) - 2, -1, -1)
             if _MARKER_RE.match(lines[i]) and not _MARKER_RE.match(lines[i + 1])), None)
  if at is None:
    return ""
  out = []
  for line in lines[at:]:
    match = _FLAGS_RE.match(line.rstrip("\n"))
    if match:
      line = match.group(1) + "".join(f" {f}" for f in match.group(2).split() if f in "34") + "\n"
    out.append(line)
  return "".join(out)


def describe(usual: bytes, fast: bytes) -> str:
  """Where a half's two outputs differ ("" if they do not)."""
  if usual == fast:
    return ""
  at = len(os.path.commonprefix([usual, fast]))
  return (f"{len(fast)} bytes against {len(usual)}, first differing at {at}: "
          f"{fast[at:at + 60]!r} (usual {usual[at:at + 60]!r})")


def quiet_includes(output: str, source: str, headers: list[str]) -> frozenset[str]:
  """The headers whose include does nothing after the headers' include: `output` is the usual pass
  over `source`, which is the include line and then `#include <h>` for each of `headers`, one per
  line. An include that entered a file returned to the main file at its next line
  (`# 5 "x.cu" 2`); gcc skips a guarded header it has read whole (its multiple-include
  optimisation), and then prints nothing."""
  name = re.escape(source)
  entered = {int(m.group(1)) - 1 for m in re.finditer(rf'^# (\d+) "{name}" 2$', output, re.M)}
  return frozenset(h for i, h in enumerate(headers, start=2) if i not in entered)


@dataclasses.dataclass
class _Snapshot:
  prefix: bytes  # the usual output up to and with the return to the main file
  macros: str  # macro_snapshot
  stub: str  # stub_text
  quiet: frozenset[str]  # quiet_includes
  checked: bool = False  # a half's two outputs were compared, and equal
  uses: int = 0

  def body(self, rest: str) -> str | None:
    """The half's code as its own pass reads it: leading includes of quiet headers (before any
    other line but blank ones, where the code cannot have touched their guards) blanked; None
    where anything else is refused."""
    lines = rest.split("\n")
    for i, line in enumerate(lines):
      match = _INCLUDE_RE.match(line)
      if match and match.group(1) in self.quiet:
        lines[i] = ""
      elif line.strip():
        break
    body = "\n".join(lines)
    return None if _REFUSED_RE.search(body) else body


class RestPreprocessor:
  """`run(command, env, cwd)`: the step's (0, "") with its output written from a snapshot, or
  None for "run it as usual" (nvcc_split's `preprocess` hook)."""

  def __init__(self, run: RunFn, marker: str, check_every: int = CHECK_EVERY,
               max_bytes: int | None = None):
    self._run = run
    self._max_bytes = max_bytes  # the file bound the usual pass writes its output under
    self._marker = marker
    self._head = marker.split("\n", 1)[0] + "\n"
    included = re.fullmatch(r'#include "([^"/]+)"\n', self._head)
    if included is None:
      raise ValueError(f"the marker must start with an include of a file in the folder: {marker!r}")
    self._header = included.group(1)
    self._check_every = check_every
    self._snapshots: dict[str, _Snapshot] = {}
    self._off: dict[str, str] = {}
    self._learning: set[str] = set()
    self._tries: dict[str, int] = {}
    self._serial = 0  # names each call's files: a half's two passes share its folder
    self.served = 0
    self.checked = 0

  def stats(self) -> dict[str, int]:
    return {"rest_preprocessed": self.served, "rest_checked": self.checked,
            "rest_commands": sum(s.checked for s in self._snapshots.values()),
            "rest_off": len(self._off)}

  async def run(self, command: str, env: dict[str, str],
                cwd: pathlib.Path) -> tuple[int, str] | None:
    step = parse_step(command)
    if step is None:
      return None
    try:
      text = (cwd / step.input_name).read_text(encoding="utf-8")
      # The included header is part of the key: each header-tier environment writes its own.
      header = (cwd / self._header).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
      return None
    if not text.startswith(self._marker):
      return None
    key = "\0".join((step.key, repr(sorted(env.items())),
                     hashlib.sha256(header.encode()).hexdigest()))
    if key in self._off:
      return None
    snapshot = self._snapshots.get(key)
    if snapshot is None:
      if key in self._learning:
        return None  # its snapshot is being taken: this half runs as usual
      self._learning.add(key)
      try:
        return await self._learn(key, step, text, header, env, cwd)
      finally:
        self._learning.discard(key)
    body = snapshot.body(text[len(self._marker):])
    if body is None:
      return None
    snapshot.uses += 1
    if not snapshot.checked or snapshot.uses % self._check_every == 0:
      return await self._check(key, step, body, env, cwd, snapshot)
    fast = await self._fast(step, body, env, cwd, snapshot)
    if fast is None or (self._max_bytes is not None and len(fast) > self._max_bytes):
      return None  # past the file bound: the usual pass is stopped there and names it
    (cwd / step.argv[step.output]).write_bytes(fast)
    self.served += 1
    return 0, ""

  async def _usual(self, step: _Step, env: dict[str, str],
                   cwd: pathlib.Path) -> tuple[tuple[int, str], bytes | None]:
    result = await self._run(nvcc_split.shell(env, [step.command]), cwd)
    try:
      return result, (cwd / step.argv[step.output]).read_bytes()
    except OSError:
      return result, None

  async def _learn(self, key: str, step: _Step, text: str, header: str, env: dict[str, str],
                   cwd: pathlib.Path) -> tuple[int, str]:
    """A command's first half: run as usual (that result stands) and the snapshot taken from it
    (two more gcc runs on the headers alone)."""
    result, usual = await self._usual(step, env, cwd)
    if result[0] != 0 or result[1].strip() or usual is None:
      self._tries[key] = self._tries.get(key, 0) + 1
      if self._tries[key] >= _TRIES:
        self._switch_off(key, f"the first {_TRIES} halves' usual passes failed or printed")
      return result
    return_marker = step.return_marker
    at = usual.find(return_marker)
    if at < 0:
      self._switch_off(key, "the usual output has no return to the main file after the include")
      return result
    headers = [m.group(1) for m in map(_INCLUDE_RE.match, header.split("\n")) if m] + [
        step.argv[i + 1] for i, a in enumerate(step.argv[:-1]) if a == "-include"]
    # The include line alone, and then every header again, in the half's folder (where its
    # header is); named for this call: the half's other pass may be here at the same time.
    self._serial += 1
    names = [f"dice_pp_head{self._serial}.{suffix}" for suffix in ("cu", "ii", "q.cu", "q.ii")]
    try:
      (cwd / names[0]).write_text(self._head)
      (cwd / names[2]).write_text(self._head + "".join(f"#include <{h}>\n" for h in headers))
      runs = await asyncio.gather(*(self._run(nvcc_split.shell(env, [shlex.join(
          step.with_files(source, out, extra=extra))]), cwd) for source, out, extra in (
              (names[0], names[1], ("-dD",)), (names[2], names[3], ()))))
      failed = next((r for r in runs if r[0] != 0 or r[1].strip()), None)
      if failed is not None:
        self._switch_off(key, f"a pass over the headers alone failed (exit {failed[0]}): "
                              f"{failed[1][:200]}")
        return result
      macros = macro_snapshot((cwd / names[1]).read_text(errors="replace"))
      quiet = quiet_includes((cwd / names[3]).read_text(errors="replace"), names[2], headers)
    except OSError as e:
      self._switch_off(key, f"a pass over the headers alone could not be read: {e}")
      return result
    finally:
      for name in names:
        (cwd / name).unlink(missing_ok=True)
    snapshot = _Snapshot(prefix=usual[:at + len(return_marker)], macros=macros,
                         stub=stub_text(usual[:at].decode(errors="replace")), quiet=quiet)
    self._snapshots[key] = snapshot  # checked by the next half (another candidate's flags)
    return result

  async def _check(self, key: str, step: _Step, body: str, env: dict[str, str],
                   cwd: pathlib.Path, snapshot: _Snapshot) -> tuple[int, str]:
    """A half run both ways: the usual result stands; equal outputs check the snapshot, a
    difference switches the command off."""
    result, usual = await self._usual(step, env, cwd)
    if result[0] != 0 or result[1].strip() or usual is None:
      return result
    fast = await self._fast(step, body, env, cwd, snapshot)
    if fast is None:  # the half's own code failed or printed there: says nothing of the snapshot
      return result
    difference = describe(usual, fast)
    if difference:
      self._snapshots.pop(key, None)
      self._switch_off(key, f"a half's two outputs differ: {difference}")
    else:
      snapshot.checked = True
      self.checked += 1
    return result

  async def _fast(self, step: _Step, body: str, env: dict[str, str], cwd: pathlib.Path,
                  snapshot: _Snapshot) -> bytes | None:
    """The half's output from the snapshot, or None where its own pass failed or printed."""
    self._serial += 1
    folder = cwd / f"dice-pp-{self._serial}"
    try:
      folder.mkdir()
      (folder / _STUB).write_text(snapshot.stub)
      (folder / _MACROS).write_text(snapshot.macros)
      (folder / step.input_name).write_text(f'#include "{_STUB}"\n#line 1\n' + body,
                                            encoding="utf-8")
      rc, output = await self._run(nvcc_split.shell(env, [shlex.join(step.with_files(
          step.input_name, _OUT, drop_includes=True, extra=("-imacros", _MACROS)))]), folder)
      if rc != 0 or output.strip():
        return None
      rest = (folder / _OUT).read_bytes()
    except OSError:
      return None
    finally:
      shutil.rmtree(folder, ignore_errors=True)
    return_marker = step.return_marker
    at = rest.find(return_marker)
    if at < 0:
      return None
    return snapshot.prefix + rest[at + len(return_marker):]

  def _switch_off(self, key: str, why: str) -> None:
    self._off[key] = why
    log.warning("preprocessing from a macro snapshot off for a device half's command: %s", why)
