"""Builds, checks and stores the header tiers of one toolchain, flag set and original level.

header_tiers.py decides which tier may build a source; this module computes what the tiers are for
the installed torch and proves each one a subset of the original, with the compiler that will build
it (nvcc for cuda.cu, g++ for main.cpp). Levels:

  extension  cuda.cu including torch/extension.h (nvcc): tiers lite and types;
  types      cuda.cu including only torch/types.h (nvcc): tier lite;
  binding    load_inline's main.cpp, whose first line is torch/extension.h (g++): tier lite, which
             adds the two headers the generated PYBIND11_MODULE needs (torch/csrc/utils/pybind.h
             for pybind11 and torch's type casters, torch/csrc/Exceptions.h for
             torch::wrap_pybind_function).

Checks per tier (preprocessor runs only; a tier that fails one is recorded as unavailable, with
the reason): every torch header the tier opens is opened by the original; every system header the
original opens is opened by the tier; its macros are recorded (sources using a macro only the
original defines are refused). For the binding level, every torch header the original opens and
the tier does not must be free of pybind11 customisations (type casters, holder or opaque types):
then each bound function converts its arguments and results exactly as the original would.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
import time
from typing import AbstractSet, Awaitable, Callable

from verifier_service.compile import cache as compile_cache
from verifier_service.compile import header_tiers
from verifier_service.compile import procs as compile_procs

log = logging.getLogger(__name__)

LITE, TYPES = header_tiers.LITE, header_tiers.TYPES
BINDING_INCLUDES = "#include <torch/csrc/utils/pybind.h>\n#include <torch/csrc/Exceptions.h>\n"

# (argv, cwd) -> (return code, combined output); compiler.py's bounded process runner.
RunFn = Callable[[list[str], pathlib.Path], Awaitable[tuple[int, str]]]

_LITE_FACTORIES = header_tiers.LITE_FACTORIES  # torch_lite.h's ATen/ops includes: the one list
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")
_OP_SUFFIXES = ("", "_out", "_outf", "_symint", "_symint_out", "_symint_outf")
_PYBIND_CUSTOM_RE = re.compile(r"namespace\s+pybind11\b|\b(?:pybind11|py)\s*::\s*detail\b|"
                               r"\bPYBIND11_(?:MAKE_OPAQUE|DECLARE_HOLDER_TYPE|TYPE_CASTER)\b|"
                               r"\btype_caster\b")


def _torch_include() -> str:
  import torch  # pylint: disable=import-outside-toplevel
  return os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "include"))


def _search_dirs(verbose: str) -> list[str]:
  """The host compiler's #include <...> search list, from its -v output."""
  lines = verbose.splitlines()
  try:
    start = lines.index("#include <...> search starts here:") + 1
    end = lines.index("End of search list.", start)
  except ValueError:
    return []
  return [os.path.realpath(line.strip()) for line in lines[start:end]]


def _trace(verbose: str, torch_root: str) -> tuple[list[str], set[str], set[str]]:
  """From gcc -H output: system headers a torch header (or the file) includes directly, in
  order; every torch header opened; every system header opened."""
  stack: list[str] = []
  direct: list[str] = []
  torch_files, system_files = set(), set()
  for line in verbose.splitlines():
    match = re.match(r"^(\.+) (.+)$", line)
    if not match:
      continue
    depth, path = len(match.group(1)), os.path.realpath(match.group(2))
    del stack[depth - 1:]
    in_torch = path.startswith(torch_root + os.sep)
    (torch_files if in_torch else system_files).add(path)
    parent_is_torch = not stack or stack[-1].startswith(torch_root + os.sep)
    if not in_torch and parent_is_torch and path not in direct:
      direct.append(path)
    stack.append(path)
  return direct, torch_files, system_files


def _spell(path: str, dirs: list[str]) -> str | None:
  """The shortest `#include <name>` that resolves to `path` through the search list."""
  names = sorted((os.path.relpath(path, d) for d in dirs if path.startswith(d + os.sep)), key=len)
  for name in names:
    found = next((os.path.join(d, name) for d in dirs if os.path.isfile(os.path.join(d, name))),
                 None)
    if found and os.path.realpath(found) == path:
      return name
  return None


def _torch_namespace_block(torch_root: str) -> str:
  """The `namespace torch { ... }` aliases of the installed torch/types.h, verbatim."""
  text = pathlib.Path(torch_root, "torch/csrc/api/include/torch/types.h").read_text()
  match = re.search(r"^namespace torch \{\n(.*?)^\} // namespace torch", text, re.S | re.M)
  if not match:
    raise ValueError("torch/types.h has no recognisable namespace torch block")
  body = re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)
  allowed = re.compile(r"^\s*(|//.*|using (namespace )?[\w:]+;.*|using \w+ = [\w:]+;.*|"
                       r"constexpr auto \w+ = [\w:]+;.*|#\s*(if|ifdef|ifndef|else|elif|endif)\b.*)$")
  bad = [line for line in body.splitlines() if not allowed.match(line)]
  if bad:
    raise ValueError(f"unexpected line in torch/types.h's namespace torch: {bad[0]!r}")
  return "namespace torch {\n" + body + "}  // namespace torch\n"


def _factory_block(torch_root: str) -> str:
  """torch's own factory wrappers for the lite factories (make_variable swapped for the lite
  stand-in), every other torch:: factory deleted."""
  path = pathlib.Path(torch_root, "torch/csrc/autograd/generated/variable_factories.h")
  text = path.read_text()
  wanted = set(_LITE_FACTORIES) | {f + "_symint" for f in _LITE_FACTORIES}
  kept, deleted = [], []
  for match in re.finditer(r"^inline at::Tensor (\w+)\(", text, re.M):
    name, i, depth = match.group(1), match.end(), 1
    while depth:  # to the parameter list's closing parenthesis (defaults may hold braces)
      depth += {"(": 1, ")": -1}.get(text[i], 0)
      i += 1
    body_start = text.index("{", i)
    j, depth = body_start + 1, 1
    while depth:
      depth += {"{": 1, "}": -1}.get(text[j], 0)
      j += 1
    if name not in wanted:
      if name not in deleted:
        deleted.append(name)
      continue
    body = text[body_start:j]
    expected = (r"\{\s*at::AutoDispatchBelowADInplaceOrView guard;\s*return autograd::make_variable"
                rf"\(at::{name}\(.*\), /\*requires_grad=\*/options\.requires_grad\(\)\);\s*\}}")
    if not re.fullmatch(expected, body, re.S):
      raise ValueError(f"torch::{name} is not the plain factory wrapper the lite tier expects")
    kept.append(text[match.start():body_start] +
                body.replace("autograd::make_variable(", "::dice_lite::fresh_variable("))
  missing = set(_LITE_FACTORIES) - {re.match(r"inline at::Tensor (\w+)", k).group(1) for k in kept}
  if missing:
    raise ValueError(f"variable_factories.h lacks {sorted(missing)}")
  poison = [f"template <typename... Args> at::Tensor {n}(Args&&...) = delete;" for n in deleted]
  return "namespace torch {\n" + "\n".join(kept + poison) + "\n}  // namespace torch\n"


def _op_names(torch_root: str) -> frozenset[str]:
  files = set(os.listdir(os.path.join(torch_root, "ATen", "ops")))
  ops = {f[:-len("_ops.h")] for f in files if f.endswith("_ops.h")}
  return frozenset(op + s for op in ops if op + ".h" in files for s in _OP_SUFFIXES)


def _lite_block(prelude: str, torch_root: str) -> str:
  return (prelude + header_tiers.LITE_HEADER.read_text() +
          _torch_namespace_block(torch_root) + _factory_block(torch_root))


async def build(level: str, argv: list[str], work: pathlib.Path, run: RunFn,
                key: str) -> header_tiers.Environment:
  """Computes and checks the tiers of `level` for the compiler command `argv` (nvcc's for the
  cuda levels, g++'s for "binding"), without its -c/-o part."""
  torch_root = _torch_include()
  gxx = level == header_tiers.BINDING
  pre = lambda text, name, *flags: _preprocess(argv, work, run, text, name, list(flags), gxx)
  if gxx:
    full_text = "#include <torch/extension.h>\n"
  else:
    full_text = "#include <torch/types.h>\n" + (
        "#include <torch/extension.h>\n" if level == "extension" else "")
  (full_rc, full_out, full_ii), (_, _, full_macros) = await asyncio.gather(
      pre(full_text, "full", "-H", "-v"), pre(full_text, "full_dm", "-dM"))
  if full_rc != 0:
    raise RuntimeError(f"preprocessing the torch headers failed:\n{full_out[-2000:]}")
  direct, full_torch, full_system = _trace(full_out, torch_root)
  dirs = _search_dirs(full_out)
  spelled = [_spell(p, dirs) for p in direct]
  env = header_tiers.Environment(
      key=key, level=level, blocks={}, unavailable={}, macro_diff={},
      op_names=_op_names(torch_root),
      full_tokens=frozenset(_IDENT_RE.findall(full_ii)) | _macro_names(full_macros))
  tiers = (LITE, TYPES) if level == "extension" else (LITE,)
  if None in spelled:
    reason = f"cannot spell system header {direct[spelled.index(None)]} as an include"
    env.unavailable = {tier: reason for tier in tiers}
    return env
  prelude = "".join(f"#include <{name}>\n" for name in spelled)
  candidates = {}
  try:
    candidates[LITE] = _lite_block(prelude, torch_root) + (BINDING_INCLUDES if gxx else "")
  except (OSError, ValueError) as e:
    env.unavailable[LITE] = str(e)
  if TYPES in tiers:
    candidates[TYPES] = prelude + "#include <torch/types.h>\n"
  checks = await asyncio.gather(*(
      _check_tier(tier, block, pre, torch_root, full_torch, full_system, gxx)
      for tier, block in candidates.items()))
  for (tier, block), (reason, macros) in zip(candidates.items(), checks):
    if reason:
      env.unavailable[tier] = reason
    else:
      env.blocks[tier] = block
      env.macro_diff[tier] = _macro_names(full_macros) - macros
  for tier, reason in env.unavailable.items():
    log.warning("header tier %s unavailable for %s-level sources: %s", tier, level, reason[:300])
  return env


async def _check_tier(tier: str, block: str, pre, torch_root: str, full_torch: set[str],
                      full_system: set[str], binding: bool) -> tuple[str | None, AbstractSet[str]]:
  (rc, out, _), (_, _, macros) = await asyncio.gather(
      pre(block, tier, "-H"), pre(block, tier + "_dm", "-dM"))
  if rc != 0:
    return f"preprocessing failed: {out[-1500:]}", set()
  _, torch_files, system_files = _trace(out, torch_root)
  extra = _unmatched(torch_files - full_torch, full_torch)
  if extra:
    return f"opens torch headers the original does not: {extra[:3]}", set()
  missing = _unmatched(full_system - system_files, system_files)
  if missing:
    return f"misses system headers the original opens: {missing[:3]}", set()
  if binding:
    custom = [p for p in sorted(full_torch - torch_files)
              if _PYBIND_CUSTOM_RE.search(pathlib.Path(p).read_text(errors="replace"))]
    if custom:
      return f"leaves out torch headers that customise pybind11: {custom[:3]}", set()
  return None, _macro_names(macros)


def _unmatched(paths: set[str], others: set[str]) -> list[str]:
  """`paths` without those whose bytes equal a file in `others`. g++ takes a `#pragma once` file
  whose bytes (and mtime) equal one already read for that file (torch ships c10/util/python_stub.h
  and torch/csrc/utils/python_stub.h identical), so which copy gets opened depends on the order."""
  def digest(path: str) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
  if not paths:
    return []
  sizes = {os.path.getsize(p) for p in paths}
  seen = {digest(p) for p in others if os.path.getsize(p) in sizes}
  return sorted(p for p in paths if digest(p) not in seen)


def _macro_names(dm_output: str) -> frozenset[str]:
  return frozenset(re.findall(r"^#define (\w+)", dm_output, re.M))


async def _preprocess(argv: list[str], work: pathlib.Path, run: RunFn, text: str, name: str,
                      flags: list[str], gxx: bool) -> tuple[int, str, str]:
  """Runs the preprocessor on `text`; `flags` are host-compiler flags (nvcc gets -Xcompiler)."""
  src, out = work / (name + (".cpp" if gxx else ".cu")), work / f"{name}.ii"
  src.write_text(text)
  host = flags if gxx else [x for flag in flags for x in ("-Xcompiler", flag)]
  rc, output = await run(argv + ["-E", str(src), "-o", str(out)] + host, work)
  result = out.read_text(errors="replace") if out.is_file() else ""
  return rc, output, result


# ----------------------------------------------------------------------------- the cache's store


class Store:
  """Environments under `<cache>/headers/<key>/`: computed once per toolchain, flag set and
  level (shared by concurrent builds, by servers sharing the folder: a file lock), read back by
  later runs; a tier whose header turns out not to compile is switched off there for good."""

  def __init__(self, root: pathlib.Path, scratch: pathlib.Path, fingerprint: str, run: RunFn,
               report: Callable[[str, str], None],
               publish: Callable[[pathlib.Path, pathlib.Path], None]):
    self.root = root
    self._scratch = scratch
    self._fingerprint = fingerprint
    self._run = run
    self._report = report
    self._publish = publish
    self._tasks: dict[str, asyncio.Task[header_tiers.Environment | None]] = {}

  def folder(self, key: str) -> pathlib.Path:
    return self.root / key

  def in_use(self) -> set[pathlib.Path]:
    return {self.folder(key) for key in self._tasks}

  async def ensure(self, argv: list[str], level: str) -> header_tiers.Environment | None:
    """The environment of `level` for compiler command `argv` (None: tiers off, as written)."""
    key = header_tiers.environment_key(self._fingerprint, argv, level)
    task = self._tasks.get(key)
    if task is None or (task.done() and task.cancelled()):
      self._tasks[key] = asyncio.ensure_future(self._load(argv, level, key))
    return await asyncio.shield(self._tasks[key])

  async def close(self) -> None:
    tasks = list(self._tasks.values())
    for task in tasks:
      task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

  async def _load(self, argv: list[str], level: str, key: str) -> header_tiers.Environment | None:
    compile_procs.PRIORITY.set(-1)  # every build of this flag set waits for it
    folder = self.folder(key)
    env = _read_env(folder)
    if env is not None:
      compile_cache.touch(folder)
      return env
    async with compile_procs.file_lock(folder.with_suffix(".lock")):
      env = _read_env(folder)
      if env is not None:
        return env
      work = pathlib.Path(tempfile.mkdtemp(prefix="env-", dir=self._scratch))
      start = time.monotonic()
      what = "main.cpp" if level == header_tiers.BINDING else "cuda.cu"
      self._report("headers", f"checking which torch headers {what} can do without (once per "
                              "toolchain)")
      try:
        env = await build(level, argv, work, self._run, key)
      except Exception as e:  # pylint: disable=broad-except  (tiers off: builds as written)
        log.warning("header tiers off for %s-level sources: %r", level, e)
        return None
      finally:
        shutil.rmtree(work, ignore_errors=True)
      staging = pathlib.Path(tempfile.mkdtemp(prefix="env-", dir=self._scratch))
      _write_env(staging, env)
      self._publish(staging, folder)
      seconds = time.monotonic() - start
      log.info("header tiers for %s-level sources ready in %.1f s: %s", level, seconds,
               sorted(env.blocks))
      self._report("headers", f"checked the torch headers for {what} in {seconds:.0f} s")
    return _read_env(folder)

  def disable(self, env: header_tiers.Environment, tier: str, log_text: str) -> None:
    """Switches off a tier whose own header fails to compile (for this toolchain and flags)."""
    if tier not in env.blocks:
      return
    log.warning("header tier %s switched off for %s-level sources: its header does not compile: "
                "%s", tier, env.level, log_text[-1500:])
    del env.blocks[tier]
    env.unavailable[tier] = "its header failed to compile: " + log_text[-1500:]
    _write_env(self.folder(env.key), env)


def _read_env(folder: pathlib.Path) -> header_tiers.Environment | None:
  try:
    env = header_tiers.Environment.from_json(json.loads((folder / "environment.json").read_text()))
  except (OSError, ValueError, KeyError, TypeError):
    return None
  if any(not (folder / header_tiers.header_name(t)).is_file() for t in env.blocks):
    return None
  return env


def _write_env(folder: pathlib.Path, env: header_tiers.Environment) -> None:
  for tier, block in env.blocks.items():
    (folder / header_tiers.header_name(tier)).write_text(header_tiers.header_text(block))
  tmp = folder / f"environment.json.{os.getpid()}"
  tmp.write_text(json.dumps(env.to_json()))
  os.replace(tmp, folder / "environment.json")
