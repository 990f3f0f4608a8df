"""Header tiers for the CUDA translation unit: the lightest torch headers that build it.

load_inline's cuda.cu starts with `#include <torch/types.h>` and candidates add
`#include <torch/extension.h>`: parsing those headers is most of a compile (three times over:
nvcc's host front end, its device front end and the host compiler each read all of it). A kernel
launcher needs far less, so the compiler tries, in order (compile.py falls back on failure):

  lite      the torch includes replaced by torch_lite.h (at::Tensor, TORCH_CHECK, AT_DISPATCH, a
            few factory ops) plus torch's own `namespace torch` aliases and factory wrappers, taken
            from the installed torch; every other torch:: factory is deleted;
  types     torch/extension.h (or torch/torch.h) replaced by torch/types.h;
  original  the source exactly as load_inline writes it.

Both light tiers are preceded by every system header the original includes, in the original's
order, so the C and C++ library declarations a source sees are the same at every tier.

Why a verdict cannot change. A tier's headers are a subset of the original's (checked per toolchain
by `build_environment`: every torch header a tier opens is opened by the original; every system
header the original opens is opened by the tier). A source that compiles only with more
declarations fails at a light tier and is rebuilt at the next one, ending at the original, so a
source that builds in the naive path builds here, and one that fails everywhere gets the original's
log. What remains is a source that compiles with fewer declarations yet means something else, or
nothing, with all of them. `refusal` keeps every such source we know of off the light tiers:
  - macros only the original defines (`#ifdef`, or a token that would expand);
  - `using namespace` and reopening at/torch/c10/std: unqualified lookup would see more names;
  - (lite) functions or operators the source declares named like an ATen op: with all of ATen
    visible, argument-dependent lookup adds at::op to the overload set (ambiguous or a better match);
  - (lite) using-declarations of lower-case at/torch/c10 names (function overload sets);
  - (lite) `requires_grad`: torch's factory wrappers then attach autograd metadata, which the lite
    stand-in for make_variable refuses; without it torch::empty(...) returns at::empty(...) as is;
  - pybind11 and torch's Python-binding globals (`py`, `pybind11`, `THP...`).
torch::tensor and torch::from_blob (own semantics: dtype inference, deleters) and every factory
the lite tier does not wrap are deleted, so `torch::tensor(...)` cannot silently become
`at::tensor(...)`; calls to torch:: factories resolve against torch's own overload set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

LITE, TYPES, ORIGINAL = "lite", "types", "original"
VERSION = 1  # bump when the generated text or the rules change (part of the cache key)

# (argv, cwd) -> (return code, combined output); compile.py's bounded process runner.
RunFn = Callable[[list[str], pathlib.Path], Awaitable[tuple[int, str]]]

_HEAVY_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](torch/extension\.h|torch/torch\.h|'
                       r'torch/types\.h|ATen/ATen\.h)[>"][^\n]*$', re.M)
_EXTENSION_LEVEL = {"torch/extension.h", "torch/torch.h"}
_LITE_FACTORIES = ("arange", "empty", "empty_like", "empty_strided", "full", "full_like", "ones",
                   "ones_like", "zeros", "zeros_like")
_STRIP_RE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")
_KEYWORDS = {"return", "else", "case", "do", "throw", "new", "delete", "sizeof", "alignof",
             "typeid", "co_return", "co_yield", "co_await", "not", "and", "or", "xor", "goto"}
_DECL_RE = re.compile(r"(?:\b([A-Za-z_]\w*)|(?<!-)>)[\s*&]*\s\s*([A-Za-z_]\w*)\s*\(|"
                      r"(?:\b([A-Za-z_]\w*)|(?<!-)>)[*&]+\s*([A-Za-z_]\w*)\s*\(")
_USING_LOWER_RE = re.compile(r"\busing\s+(?:::\s*)?(?:at|torch|c10)\s*::(?:\s*\w+\s*::)*\s*[a-z_]\w*"
                             r"\s*;")
_NAMESPACE_RE = re.compile(r"\busing\s+namespace\b|\bnamespace\s+(?:at|torch|c10|caffe2|std|"
                           r"pybind11)\b\s*[{:]")
_OP_SUFFIXES = ("", "_out", "_outf", "_symint", "_symint_out", "_symint_outf")
_UNDEFINED_RE = re.compile(r'error(?: #\d+(?:-D)?)?: identifier "(\w+)" is undefined')
_ERROR_RE = re.compile(r"\berror(?: #\d+(?:-D)?)?:")


@dataclasses.dataclass
class Environment:
  """Everything the tiers need for one toolchain, flag set and original header level."""
  key: str
  level: str  # "extension": the source includes torch/extension.h; "types": only torch/types.h
  blocks: dict[str, str]  # tier -> text that replaces the torch includes
  unavailable: dict[str, str]  # tier -> why it is off for this toolchain
  macro_diff: dict[str, frozenset[str]]  # tier -> macros only the original headers define
  op_names: frozenset[str]  # ATen operator function names (at::relu, at::relu_out, ...)
  full_tokens: frozenset[str]  # every identifier and macro of the original headers

  def to_json(self) -> dict:
    data = dataclasses.asdict(self)
    for key in ("op_names", "full_tokens"):
      data[key] = sorted(data[key])
    data["macro_diff"] = {k: sorted(v) for k, v in self.macro_diff.items()}
    return data

  @classmethod
  def from_json(cls, data: dict) -> Environment:
    return cls(key=data["key"], level=data["level"], blocks=data["blocks"],
               unavailable=data["unavailable"],
               macro_diff={k: frozenset(v) for k, v in data["macro_diff"].items()},
               op_names=frozenset(data["op_names"]), full_tokens=frozenset(data["full_tokens"]))


def original_level(cuda_text: str) -> str | None:
  """"extension" or "types" (which torch headers the source includes), None if not tierable."""
  names = {m.group(1) for m in _HEAVY_RE.finditer(cuda_text)}
  if "torch/types.h" not in names:  # no_implicit_headers sources: left as written
    return None
  return "extension" if names & _EXTENSION_LEVEL else "types"


def header_name(tier: str) -> str:
  """The file (in the environment's folder, on the -isystem path) holding a tier's headers."""
  return f"dice_tier_{tier}.h"


def rewrite(cuda_text: str, tier: str) -> str:
  """Replaces every torch include with the tier's header (line numbers are unchanged)."""
  return _HEAVY_RE.sub(f"#include <{header_name(tier)}>", cuda_text)


def header_text(block: str) -> str:
  return "#pragma once\n" + block


def code_tokens(cuda_text: str) -> tuple[str, set[str]]:
  """The source without comments and literals, and its identifiers."""
  code = _STRIP_RE.sub(" ", cuda_text)
  return code, set(_IDENT_RE.findall(code))


def refusal(cuda_text: str, tier: str, env: Environment) -> str | None:
  """Why `tier` must not build this source (see the module docstring), or None."""
  code, tokens = code_tokens(cuda_text)
  macros = tokens & env.macro_diff.get(tier, frozenset())
  if macros:
    return f"uses macros only the original headers define: {sorted(macros)[:5]}"
  if tokens & {"py", "pybind11"} or any(t.startswith("THP") for t in tokens):
    return "uses names of torch's Python bindings"
  if _NAMESPACE_RE.search(code):
    return "has a using-directive or reopens a torch or std namespace"
  if tier != LITE:
    return None
  if "requires_grad" in tokens:
    return "mentions requires_grad"
  if _USING_LOWER_RE.search(code):
    return "has a using-declaration of an at/torch/c10 function"
  if "operator" in tokens:
    return "declares an operator"
  declared = set()
  for match in _DECL_RE.finditer(code):
    before, name = (match.group(1), match.group(2)) if match.group(2) else (
        match.group(3), match.group(4))
    if before not in _KEYWORDS:
      declared.add(name)
  clashes = declared & env.op_names
  if clashes:
    return f"declares functions named like ATen ops: {sorted(clashes)[:5]}"
  return None


def types_may_help(lite_log: str, env: Environment) -> bool:
  """Whether a failed lite build could build at the types tier.

  Only a plain typo is ruled out: every error is an undefined identifier that appears nowhere in
  the original headers either (the original build will fail the same way, and says so).
  """
  errors = _ERROR_RE.findall(lite_log)
  undefined = _UNDEFINED_RE.findall(lite_log)
  if not errors or len(undefined) != len(errors):
    return True
  return any(name in env.full_tokens for name in undefined)


def broken_by_tier(log_text: str, tier: str) -> bool:
  """Whether a failed build's errors lie in the tier's own header (then no source can use it)."""
  name = re.escape(header_name(tier))
  return re.search(rf"{name}(\(\d+\): error|:\d+:\d+: error)", log_text) is not None


def plan(cuda_text: str, env: Environment | None,
         tiers: tuple[str, ...] = (LITE, TYPES)) -> tuple[list[tuple[str, str]], dict[str, str]]:
  """[(tier, text)] to try in order, ending with the original; and why tiers were skipped."""
  skipped = {}
  variants = []
  level = original_level(cuda_text)
  if env is not None and env.level == level:
    for tier in tiers:
      block = env.blocks.get(tier)
      if block is None:
        skipped[tier] = env.unavailable.get(tier, f"not applicable to a {level}-level source")
        continue
      reason = refusal(cuda_text, tier, env)
      if reason:
        skipped[tier] = reason
        continue
      variants.append((tier, rewrite(cuda_text, tier)))
  variants.append((ORIGINAL, cuda_text))
  return variants, skipped


# ----------------------------------------------------------------------------- environment


def environment_key(fingerprint: str, nvcc_argv: list[str], level: str) -> str:
  lite = (pathlib.Path(__file__).parent / "torch_lite.h").read_text()
  blob = json.dumps([VERSION, fingerprint, nvcc_argv, level, lite])
  return hashlib.sha256(blob.encode()).hexdigest()


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


async def build_environment(level: str, nvcc_argv: list[str], work: pathlib.Path, run: RunFn,
                            key: str) -> Environment:
  """Computes and checks the tiers for one toolchain and flag set (six preprocessor runs); a
  tier that fails a check is recorded as unavailable, with the reason."""
  torch_root = _torch_include()
  pre = lambda text, name, *extra: _preprocess(nvcc_argv, work, run, text, name, list(extra))
  full_text = "#include <torch/types.h>\n" + (
      "#include <torch/extension.h>\n" if level == "extension" else "")
  (full_rc, full_out, full_ii), (_, _, full_macros) = await asyncio.gather(
      pre(full_text, "full", "-Xcompiler", "-H", "-Xcompiler", "-v"),
      pre(full_text, "full_dm", "-Xcompiler", "-dM"))
  if full_rc != 0:
    raise RuntimeError(f"preprocessing the torch headers failed:\n{full_out[-2000:]}")
  direct, full_torch, full_system = _trace(full_out, torch_root)
  dirs = _search_dirs(full_out)
  spelled = [_spell(p, dirs) for p in direct]
  env = Environment(key=key, level=level, blocks={}, unavailable={}, macro_diff={},
                    op_names=_op_names(torch_root),
                    full_tokens=frozenset(_IDENT_RE.findall(full_ii)) | _macro_names(full_macros))
  if None in spelled:
    reason = f"cannot spell system header {direct[spelled.index(None)]} as an include"
    env.unavailable = {LITE: reason, TYPES: reason}
    return env
  prelude = "".join(f"#include <{name}>\n" for name in spelled)
  candidates = {}
  try:
    candidates[LITE] = (prelude + (pathlib.Path(__file__).parent / "torch_lite.h").read_text() +
                        _torch_namespace_block(torch_root) + _factory_block(torch_root))
  except (OSError, ValueError) as e:
    env.unavailable[LITE] = str(e)
  if level == "extension":
    candidates[TYPES] = prelude + "#include <torch/types.h>\n"
  checks = await asyncio.gather(*(
      _check_tier(tier, block, pre, torch_root, full_torch, full_system)
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
                      full_system: set[str]) -> tuple[str | None, set[str]]:
  (rc, out, _), (_, _, macros) = await asyncio.gather(
      pre(block, tier, "-Xcompiler", "-H"), pre(block, tier + "_dm", "-Xcompiler", "-dM"))
  if rc != 0:
    return f"preprocessing failed: {out[-1500:]}", set()
  _, torch_files, system_files = _trace(out, torch_root)
  extra = sorted(torch_files - full_torch)
  if extra:
    return f"opens torch headers the original does not: {extra[:3]}", set()
  missing = sorted(full_system - system_files)
  if missing:
    return f"misses system headers the original opens: {missing[:3]}", set()
  return None, _macro_names(macros)


def _macro_names(dm_output: str) -> frozenset[str]:
  return frozenset(re.findall(r"^#define (\w+)", dm_output, re.M))


async def _preprocess(nvcc_argv: list[str], work: pathlib.Path, run: RunFn, text: str, name: str,
                      extra: list[str]) -> tuple[int, str, str]:
  src, out = work / f"{name}.cu", work / f"{name}.ii"
  src.write_text(text)
  rc, output = await run(nvcc_argv + ["-E", str(src), "-o", str(out)] + extra, work)
  result = out.read_text(errors="replace") if out.is_file() else ""
  return rc, output, result
