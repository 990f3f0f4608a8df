"""The names a split cuda.cu must not use, computed from the installed headers (split_source.py).

Two questions, each answered by preprocessing the real headers with the real commands, once per
toolchain, flag set and lite header block, and kept beside the header tier (`<env>/split.json`):

- Device code compiled without torch: which names could it meet differently? Those that the
  source as written sees only because of torch's headers: every identifier of the original's
  headers that the CUDA headers alone lack, every name at global scope the original has and they
  lack (batch.global_names), and every macro only the original defines; in nvcc's host view and
  in its device view (`__CUDA_ARCH__`). Device code naming none of them finds, in the CUDA headers
  alone, the very declarations it finds with torch's (torch adds overloads only of its own types,
  which it cannot name).

- Host code compiled by g++ instead of nvcc's host pass: which names are declared differently?
  nvcc preprocesses the host side with macros saying "CUDA" (`__CUDACC__`, `__NVCC__`, ...) and
  g++ without them (split_host_flags: the same command otherwise), so headers keep other lines
  (`#ifdef __CUDACC__`: thrust-based complex math, conversions to `__half`, CUDA-only
  declarations). Every line kept in one view and not the other is found by its file and line
  (line markers), and the entities around it are named: the classes and functions it lies in,
  and what it declares at namespace or class scope; with every macro defined in one view only or
  differently. Host code naming none of them reaches, in both views, the same declarations.
  Checked, not assumed: it is the headers' own text, per toolchain; a new torch or toolkit
  gets its own set.

A source that includes more than the lite block (split_source.extra_includes: `<math.h>`,
`ATen/cuda/CUDAContext.h`) gets both sets computed again with those includes in every view, as
each half sees them (`compute`'s `extras`; `Store`, once per include list).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import pathlib
import re
import shlex
import shutil
import tempfile
from typing import Awaitable, Callable

from verifier_service.compile import batch as batch_lib
from verifier_service.compile import cache as cache_lib
from verifier_service.compile import nvcc_split
from verifier_service.compile import procs as compile_procs
from verifier_service.compile import split_source

log = logging.getLogger(__name__)

# (argv, cwd) -> (return code, output): the compile stage's runner (shared builds).
RunFn = Callable[[list[str], pathlib.Path], Awaitable[tuple[int, str]]]

VERSION = 1  # bump when what is computed changes
# A source's own includes the split computes names for (Store): per list, and lists per store.
MAX_EXTRAS = 4
MAX_EXTRA_LISTS = 16
_HEADER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")
_MARKER_RE = re.compile(r'^# (\d+) "((?:\\.|[^"\\])*)"')
_TOKEN_RE = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[A-Za-z_]\w*|\d[\w.\']*|\S')
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")
_DEFINE_RE = re.compile(r"^#define (\w+)(.*)$", re.M)
# Macros by which nvcc tells the host compiler it compiles CUDA: g++ compiles host code without.
_NVCC_MACRO_RE = re.compile(r"^-D(__CUDACC\w*|__NVCC\w*|__CUDA_ARCH_LIST__|__CUDA_API_VER\w*)"
                            r"(=.*)?$")
_KEYWORDS = batch_lib.KEYWORDS
_SCOPE_KEYS = ("class", "struct", "union", "enum")


@dataclasses.dataclass(frozen=True)
class HostCommand:
  """g++'s compile of the host half: nvcc's host preprocessing flags without nvcc's macros."""
  compiler: str
  flags: tuple[str, ...]  # no -c, -o, -x, source


def host_command(preprocess: str, env: dict[str, str]) -> HostCommand:
  """From nvcc's host preprocessing step (`gcc -E ... -D__CUDACC__ ... -include cuda_runtime.h
  SRC -o OUT`, as its dry run prints it)."""
  expanded = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)),
                    preprocess)
  words = shlex.split(expanded)
  flags, skip = [], 0
  for i, word in enumerate(words[1:], 1):
    if skip:
      skip -= 1
      continue
    nxt = words[i + 1] if i + 1 < len(words) else ""
    if word in ("-D", "-I", "-include", "-x", "-o"):
      word, skip = word + (" " if word in ("-include", "-x", "-o") else "") + nxt, 1
    if word in ("-E",) or word.startswith(("-o ", "-x ", "-include ")) or (
        not word.startswith("-") and word.endswith((".cu", ".ii", ".cpp"))):
      continue
    if _NVCC_MACRO_RE.match(word):
      continue
    flags.append(word)
  return HostCommand(words[0], tuple(flags))


def view_lines(text: str) -> dict[tuple[str, int], str]:
  """{(file, line): text} of a preprocessed translation unit's non-blank lines."""
  out, name, number = {}, "", 0
  for line in text.split("\n"):
    marker = _MARKER_RE.match(line)
    if marker:
      number, name = int(marker.group(1)), marker.group(2)
      continue
    if line.strip() and not line.startswith("#"):
      out[(name, number)] = line.strip()
    number += 1
  return out


def entities(text: str, wanted: set[tuple[str, int]]) -> set[str]:
  """Names of what the lines `wanted` lie in (enclosing classes and functions) or declare (at
  namespace scope)."""
  names: set[str] = set()
  spaces: set[str] = set()  # namespace names: what they hold is named, not they
  stack: list[tuple[str, set[str]]] = []  # per open brace: (kind, names)
  head: list[str] = []
  name, number = "", 0
  for line in text.split("\n"):
    marker = _MARKER_RE.match(line)
    if marker:
      number, name = int(marker.group(1)), marker.group(2)
      continue
    if line.startswith("#"):
      number += 1
      continue
    hit = (name, number) in wanted
    number += 1
    if hit:
      for _, enclosing in stack:
        names |= enclosing
    # A member is reached through its class, which is named above; a namespace's are not.
    declaring = lambda: not stack or stack[-1][0] == "namespace"
    for tok in _TOKEN_RE.findall(line):
      if tok == "{":
        stack.append(_scope(head))
        if stack[-1][0] == "namespace":
          spaces.update(t for t in head if _IDENT_RE.fullmatch(t))
        head = []
      elif tok == "}":
        if stack:
          stack.pop()
        head = []
      elif tok == ";":
        if hit and declaring():
          names |= _declares(head)
        head = []
      else:
        head.append(tok)
    if hit and declaring():
      names |= _declares(head)
  return names - _KEYWORDS - spaces


def _scope(head: list[str]) -> tuple[str, set[str]]:
  if "namespace" in head:
    return "namespace", set()
  if "(" in head:
    at = head.index("(")
    before = [t for t in head[:at] if _IDENT_RE.fullmatch(t) and t not in _KEYWORDS]
    found = set(before[-1:])
    if len(head[:at]) >= 3 and head[at - 2] == "::" and _IDENT_RE.fullmatch(head[at - 3]):
      found.add(head[at - 3])  # Class::method (namespaces are taken out by `entities`)
    return "function", found
  for key in _SCOPE_KEYS:
    if key in head:
      after = [t for t in head[head.index(key) + 1:] if _IDENT_RE.fullmatch(t)
               and t not in _KEYWORDS]
      return "class", set(after[:1])
  return "block", set()  # an initialiser list, an extern "C" block: enclosing nothing named


def _declares(head: list[str]) -> set[str]:
  found, depth = set(), 0
  for i, tok in enumerate(head):
    if tok in "([<":
      depth += 1
    elif tok in ")]>":
      depth -= 1
    elif depth == 0 and _IDENT_RE.fullmatch(tok):
      nxt = head[i + 1] if i + 1 < len(head) else ";"
      if nxt in ("(", "=", ";", "[", ",", ":", "{") or (i and head[i - 1] in _SCOPE_KEYS):
        found.add(tok)
  return found


def _macros(dm: str) -> dict[str, str]:
  return {m.group(1): m.group(2).strip() for m in _DEFINE_RE.finditer(dm)}


def host_names(nvcc_view: str, gxx_view: str, nvcc_dm: str, gxx_dm: str) -> frozenset[str]:
  """Names declared differently by nvcc's host view and g++'s view of the same headers."""
  a, b = view_lines(nvcc_view), view_lines(gxx_view)
  only_a = {k for k in a if k not in b}
  only_b = {k for k in b if k not in a}
  names = entities(nvcc_view, only_a) | entities(gxx_view, only_b)
  ma, mb = _macros(nvcc_dm), _macros(gxx_dm)
  names |= {m for m in set(ma) | set(mb) if ma.get(m) != mb.get(m)}
  return frozenset(names)


def files_of(text: str) -> set[str]:
  """The files a preprocessed translation unit holds lines of."""
  return set(re.findall(r'^# \d+ "((?:\\.|[^"\\])*)"', text, re.M))


def global_names_in(text: str, files: set[str]) -> set[str]:
  """The names that lines of `files` declare at global scope (inline namespaces count as global
  scope; a using-directive there makes every identifier of theirs count)."""
  names: set[str] = set()
  every: set[str] = set()
  stack: list[bool] = []  # per open brace: global scope still (an inline namespace's)?
  head: list[str] = []
  name, directive = "", False
  for line in text.split("\n"):
    marker = _MARKER_RE.match(line)
    if marker:
      name = marker.group(2)
      continue
    if line.startswith("#"):
      continue
    kept = name in files
    for tok in _TOKEN_RE.findall(line):
      at_global = all(stack)
      if kept and _IDENT_RE.fullmatch(tok):
        every.add(tok)
      if tok in ("{", ";"):
        if kept and at_global:
          names |= _declares(head)
          directive |= tok == ";" and head[:2] == ["using", "namespace"]
        stack += [at_global and "inline" in head and "namespace" in head] if tok == "{" else []
        head = []
      elif tok == "}":
        if stack:
          stack.pop()
        head = []
      else:
        head.append(tok)
  return (every if directive else names) - _KEYWORDS


def device_names(full_views: list[str], cuda_views: list[str], full_dm: str,
                 cuda_dm: str) -> frozenset[str]:
  """Names the source as written sees only through torch's headers: what the files that only
  it includes (torch's, and the system headers they bring) put at global scope, and the macros
  only it defines."""
  names: set[str] = set()
  for full, cuda in zip(full_views, cuda_views):
    names |= global_names_in(full, files_of(full) - files_of(cuda))
  names |= set(_macros(full_dm)) - set(_macros(cuda_dm))
  return frozenset(names)


def _swap(command: str, source: str, out: str, extra: tuple[str, ...] = ()) -> str:
  """A dry-run preprocessing command with another input and output (and `extra` flags)."""
  words = shlex.split(command)
  at = words.index("-o")
  words[at + 1] = out
  words = [source if w.endswith("probe.cu") else w for w in words]
  return shlex.join(words[:1] + list(extra) + words[1:])


async def compute(nvcc_argv: list[str], block: str, level: str, work: pathlib.Path,
                  run: RunFn, extras: tuple[str, ...] = ()
                  ) -> tuple[split_source.Names, HostCommand]:
  """The names for cuda.cu compiled by `nvcc_argv` (its flags, no -c/-o; the lite tier's
  -isystem folder included), whose lite tier is `block`, at header `level` (header_tiers), for
  sources that also include `extras` (split_source.extra_includes), each view as the halves see
  them: the host TU after its precompiled header, the device half after its own header (torch's
  extras left out), the source as written after torch's headers."""
  lines = lambda names: "".join(f"#include <{e}>\n" for e in names)
  on_device = lines(e for e in extras if not split_source.torch_header(e))
  (work / "probe.cu").write_text("")
  rc, text = await run(list(nvcc_argv) + ["-c", "probe.cu", "-o", "probe.o", "--dryrun",
                                          "--keep", "--keep-dir", "steps"], work)
  plan = nvcc_split.parse_dryrun(text) if rc == 0 else None
  if plan is None:
    raise RuntimeError(f"nvcc's dry run has an unknown shape:\n{text[-1500:]}")
  host = host_command(plan.host[0], plan.env)
  sources = {"block": block + "#include <cuda.h>\n#include <cuda_runtime.h>\n" + lines(extras),
             "cuda": device_prelude(block) + "#include <cuda.h>\n#include <cuda_runtime.h>\n" +
             on_device,
             "full": "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + (
                 "#include <torch/extension.h>\n" if level == "extension" else "") + lines(extras)}
  for name, content in sources.items():
    (work / f"{name}.cu").write_text(content)

  async def nvcc(step: str, name: str, *extra: str) -> str:
    out = f"{name}.{len(extra)}.{step}.ii"
    command = _swap(step == "host" and plan.host[0] or plan.device[0], f"{name}.cu", out, extra)
    return await _read(run, nvcc_split.script(plan, [command]), work, out)

  async def gxx(name: str, *extra: str) -> str:
    out = f"{name}.gxx{len(extra)}.ii"
    return await _read(run, [host.compiler, *extra, *host.flags, "-x", "c++", "-E", f"{name}.cu",
                             "-o", out], work, out)

  views = await asyncio.gather(
      nvcc("host", "block"), gxx("block"), nvcc("host", "block", "-dM"), gxx("block", "-dM"),
      nvcc("host", "full"), nvcc("device", "full"), nvcc("host", "full", "-dM"),
      nvcc("host", "cuda"), nvcc("device", "cuda"), nvcc("host", "cuda", "-dM"))
  host_set = await asyncio.to_thread(host_names, *views[:4])
  device_set = await asyncio.to_thread(device_names, list(views[4:6]), list(views[7:9]),
                                       views[6], views[9])
  includes = set(re.findall(r"^#include <([^>\n]+)>", block, re.M)) | {"cuda.h", "cuda_runtime.h"}
  return split_source.Names(device=device_set, host=host_set,
                            block_includes=frozenset(includes), extras=extras), host


def device_prelude(block: str) -> str:
  """The system headers the original's torch headers include, in their order (the lite block's
  leading includes, tier_environment.py): the device half includes them first (`-include`), as
  the source as written does through torch/types.h, so that its global names and overloads
  (cuda_fp16.h's `__shfl_xor_sync(__half)`, <cmath>'s) are the original's."""
  lines = []
  for line in block.split("\n"):
    if not re.match(r"#include <[^>\n]+>$", line):
      break
    lines.append(line + "\n")
  return "".join(lines)


async def _read(run: RunFn, argv: list[str], work: pathlib.Path, out: str) -> str:
  rc, output = await run(argv, work)
  if rc != 0:
    raise RuntimeError(f"preprocessing for the split failed:\n{output[-1500:]}")
  return (work / out).read_text(errors="replace")


class Store:
  """`<env folder>/split.json`: computed once per tier environment (the lite block, the flags,
  the toolchain), under a file lock shared with other servers; None where it cannot be. Sources
  with further includes (split_source.extra_includes) get theirs per include list,
  `split-<digest>.json`: at most MAX_EXTRA_LISTS lists computed per store (each is ten
  preprocessing runs over torch's headers, and a source chooses its includes)."""

  def __init__(self, scratch: pathlib.Path, run: RunFn):
    self._scratch = scratch
    self._run = run
    self._tasks: dict[tuple[pathlib.Path, tuple[str, ...]], asyncio.Task] = {}

  async def ensure(self, folder: pathlib.Path, nvcc_argv: list[str], block: str, level: str,
                   extras: tuple[str, ...] = ()
                   ) -> tuple[split_source.Names, HostCommand] | None:
    """The names (computing them if need be); None where they cannot be, or where `extras` is
    one list too many (`admits`)."""
    key = (folder, extras)
    task = self._tasks.get(key)
    if task is None or (task.done() and task.cancelled()):
      if not self.admits(extras):
        return None
      self._tasks[key] = task = asyncio.ensure_future(
          self._load(folder, nvcc_argv, block, level, extras))
    return await asyncio.shield(task)

  def admits(self, extras: tuple[str, ...]) -> bool:
    """Whether names for sources including `extras` may be computed: each a plain header path,
    at most MAX_EXTRAS of them, and room for another list (or this one already started)."""
    if not extras:
      return True
    if len(extras) > MAX_EXTRAS or not all(
        _HEADER_RE.fullmatch(e) and ".." not in e for e in extras):
      return False
    lists = {e for _, e in self._tasks if e}
    return extras in lists or len(lists) < MAX_EXTRA_LISTS

  def ready(self, folder: pathlib.Path, extras: tuple[str, ...] = ()
            ) -> tuple[split_source.Names, HostCommand] | None:
    task = self._tasks.get((folder, extras))
    return task.result() if task is not None and task.done() and not task.cancelled() and (
        task.exception() is None) else None

  def failed(self, folder: pathlib.Path, extras: tuple[str, ...]) -> bool:
    """Whether computing these names ended without them (`ready` stays None)."""
    task = self._tasks.get((folder, extras))
    return task is not None and task.done() and self.ready(folder, extras) is None

  async def close(self) -> None:
    for task in self._tasks.values():
      task.cancel()
    await asyncio.gather(*self._tasks.values(), return_exceptions=True)

  async def _load(self, folder: pathlib.Path, nvcc_argv: list[str], block: str, level: str,
                  extras: tuple[str, ...]) -> tuple[split_source.Names, HostCommand] | None:
    compile_procs.PRIORITY.set(-1)
    stem = f"split-{hashlib.sha256(json.dumps(extras).encode()).hexdigest()[:16]}" if extras else (
        "split")
    path = folder / f"{stem}.json"
    found = _read_json(path, extras)
    if found is not None:
      return found
    async with compile_procs.file_lock(folder / f"{stem}.lock"):
      found = _read_json(path, extras)
      if found is not None:
        return found
      work = pathlib.Path(tempfile.mkdtemp(prefix="split-", dir=self._scratch))
      try:
        names, host = await compute(nvcc_argv, block, level, work, self._run, extras)
      except Exception as e:  # pylint: disable=broad-except  (no split: every build as before)
        if not extras:
          log.exception("the split path is off for this flag set")
        else:  # the source's own includes (one that does not exist, say): its build decides
          log.info("no split for sources including %s: %s", list(extras), str(e)[-300:])
        return None
      finally:
        shutil.rmtree(work, ignore_errors=True)
      tmp = cache_lib.partial_path(path)
      tmp.write_text(json.dumps({"version": VERSION, "device": sorted(names.device),
                                 "host": sorted(names.host),
                                 "block_includes": sorted(names.block_includes),
                                 "extras": list(extras),
                                 "compiler": host.compiler, "flags": list(host.flags)}))
      tmp.replace(path)
      return names, host


def _read_json(path: pathlib.Path, extras: tuple[str, ...] = ()
               ) -> tuple[split_source.Names, HostCommand] | None:
  try:
    data = json.loads(path.read_text())
    if data["version"] != VERSION or tuple(data.get("extras", ())) != extras:
      return None
    return (split_source.Names(frozenset(data["device"]), frozenset(data["host"]),
                               frozenset(data["block_includes"]), extras),
            HostCommand(data["compiler"], tuple(data["flags"])))
  except (OSError, ValueError, KeyError, TypeError):
    return None
