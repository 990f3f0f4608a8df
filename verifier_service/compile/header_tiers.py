"""Header tiers: the lightest torch headers that build a translation unit, and when to refuse them.

load_inline's cuda.cu starts with `#include <torch/types.h>` and candidates add
`#include <torch/extension.h>`: parsing those headers is most of a compile (three times over:
nvcc's host front end, its device front end and the host compiler each read all of it). A kernel
launcher needs far less, so the compiler tries, in order (compiler.py falls back on failure):

  lite      the torch includes replaced by torch_lite.h (at::Tensor, TORCH_CHECK, AT_DISPATCH, a
            few factory ops) plus torch's own `namespace torch` aliases and factory wrappers, taken
            from the installed torch; every other torch:: factory is deleted;
  types     torch/extension.h (or torch/torch.h) replaced by torch/types.h;
  original  the source exactly as load_inline writes it.

Both light tiers are preceded by every system header the original includes, in the original's
order, so the C and C++ library declarations a source sees are the same at every tier.

main.cpp (load_inline's pybind11 module: `#include <torch/extension.h>`, the C++ sources, the
generated PYBIND11_MODULE) has one light tier, the "binding" level's lite: the same lite headers
plus the two that the binding needs (torch/csrc/utils/pybind.h, torch/csrc/Exceptions.h). Its
headers are prepended with g++'s `-include` (precompiled, see pch.py) and the source's torch
includes become blank lines; the same rules below decide whether a main.cpp may use it.
tier_environment.py computes and checks the tiers per toolchain.

Why a verdict cannot change. A tier's headers are a subset of the original's (checked per toolchain
by tier_environment.py: every torch header a tier opens is opened by the original; every system
header the original opens is opened by the tier; for main.cpp, no header left out customises
pybind11, so bound functions convert their arguments as in the original). A source that compiles only with more
declarations fails at a light tier and is rebuilt at the next one, ending at the original, so a
source that builds in the naive path builds here, and one that fails everywhere gets the original's
log (or the lite one, when no heavier header can remove its errors: `heavier_may_help`). What
remains is a source that compiles with fewer declarations yet means something else, or nothing,
with all of them. `refusal` keeps every such source we know of off the light tiers:
  - macros only the original defines (`#ifdef`, or a token that would expand);
  - `using namespace` and reopening at/torch/c10/std: unqualified lookup would see more names;
  - (lite) functions or operators the source declares named like an ATen op: with all of ATen
    visible, argument-dependent lookup adds at::op to the overload set (ambiguous or a better match);
  - (lite) using-declarations of lower-case at/torch/c10 names (function overload sets);
  - (lite) `requires_grad`: torch's factory wrappers then attach autograd metadata, which the lite
    stand-in for make_variable refuses; without it torch::empty(...) returns at::empty(...) as is;
  - pybind11 and torch's Python-binding globals (`py`, `pybind11`, `THP...`) in the source itself.
torch::tensor and torch::from_blob (own semantics: dtype inference, deleters) and every factory
the lite tier does not wrap are deleted, so `torch::tensor(...)` cannot silently become
`at::tensor(...)`; calls to torch:: factories resolve against torch's own overload set.

The lite tier's factory ops are listed once, as torch_lite.h's `#include <ATen/ops/NAME.h>` lines:
LITE_FACTORIES is read from them, and tier_environment.py keeps torch's own wrapper for exactly
those torch:: factories (tests/verifier/test_verifier_lite_factories.py checks both).
Decision: VERSION (part of every environment's cache key and of the compiler's object policy) is
a digest of torch_lite.h and of the code of this module and tier_environment.py (their syntax
trees, so comments and layout do not count), not a number bumped by hand: a change to the header,
the op list, the rules or the generated text cannot keep a stale key. A docstring edit costs one
rebuild of the header environments and a cold object cache, which is cheaper than a wrong hit.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import pathlib
import re

from verifier_service.compile import checks

LITE, TYPES, ORIGINAL = "lite", "types", "original"
BINDING = "binding"  # the level of load_inline's main.cpp (tier_environment.py)
CUDA_LEVELS = ("extension", "types")  # original_level's answers: which torch headers cuda.cu has

_HEAVY_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](torch/extension\.h|torch/torch\.h|'
                       r'torch/types\.h|ATen/ATen\.h)[>"][^\n]*$', re.M)
_EXTENSION_LEVEL = {"torch/extension.h", "torch/torch.h"}
STRIP_RE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_IDENT_RE = re.compile(r"[A-Za-z_]\w*")
_KEYWORDS = {"return", "else", "case", "do", "throw", "new", "delete", "sizeof", "alignof",
             "typeid", "co_return", "co_yield", "co_await", "not", "and", "or", "xor", "goto"}
_DECL_RE = re.compile(r"(?:\b([A-Za-z_]\w*)|(?<!-)>)[\s*&]*\s\s*([A-Za-z_]\w*)\s*\(|"
                      r"(?:\b([A-Za-z_]\w*)|(?<!-)>)[*&]+\s*([A-Za-z_]\w*)\s*\(")
_USING_LOWER_RE = re.compile(r"\busing\s+(?:::\s*)?(?:at|torch|c10)\s*::(?:\s*\w+\s*::)*\s*[a-z_]\w*"
                             r"\s*;")
_NAMESPACE_RE = re.compile(r"\busing\s+namespace\b|\bnamespace\s+(?:at|torch|c10|caffe2|std|"
                           r"pybind11)\b\s*[{:]")
# path(line): error: identifier "NAME" is undefined   (EDG, as cudafe++ and cicc print it)
_UNDEFINED_AT_RE = re.compile(r'^"?([^\s"(][^"(\n]*?)"?\(\d+\): error(?: #\d+(?:-D)?)?: '
                              r'identifier "(\w+)" is undefined', re.M)
SOURCE_FILE = "cuda.cu"  # the name a tier's build compiles the source under (compiler.py)
_ERROR_RE = re.compile(r"\berror(?: #\d+(?:-D)?)?:")
_IMPLICIT_MAIN = "#include <torch/extension.h>\n"
# An include that fails at every tier: missing, or outside what a confined compiler may read.
_MISSING_FILE_RE = re.compile(r"fatal error: (?!dice_tier_)[^:\n]+: "
                              r"(?:No such file or directory|Permission denied)")


@dataclasses.dataclass
class Environment:
  """Everything the tiers need for one toolchain, flag set and original header level."""
  key: str
  level: str  # cuda.cu: "extension" (includes torch/extension.h) or "types"; main.cpp: BINDING
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
  return CUDA_LEVELS[0] if names & _EXTENSION_LEVEL else CUDA_LEVELS[1]


def binding_level(main_text: str) -> str | None:
  """BINDING for a main.cpp that starts with load_inline's implicit torch/extension.h (then every
  later torch include is a no-op there), None if it is built as written."""
  return BINDING if main_text.startswith(_IMPLICIT_MAIN) else None


def header_name(tier: str) -> str:
  """The file (in the environment's folder, on the -isystem path) holding a tier's headers."""
  return f"dice_tier_{tier}.h"


def rewrite(text: str, tier: str, level: str | None = None) -> str:
  """Replaces every torch include with the tier's header, or (BINDING: the header comes first
  through `-include`) with a blank line; line numbers are unchanged."""
  return _HEAVY_RE.sub("" if level == BINDING else f"#include <{header_name(tier)}>", text)


def header_text(block: str) -> str:
  return "#pragma once\n" + block


def code_tokens(cuda_text: str) -> tuple[str, set[str]]:
  """The source without comments and literals, and its identifiers."""
  code = STRIP_RE.sub(" ", cuda_text)
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


def heavier_may_help(lite_log: str, env: Environment) -> bool:
  """Whether a failed lite build could build at a heavier tier (torch/types.h, or as written).

  Ruled out: a missing or unreadable include file (no tier changes an include path, nor what a
  confined compiler may read), and a typo: an error in the source's own file is an undefined
  identifier that appears nowhere in the original headers either. No header declares or defines
  that name, and the source's macros expand alike at every tier (`refusal` keeps sources that use
  a macro the tiers define differently off them), so the source as written fails there too, on the
  same line (a tier keeps line numbers), and the compiler ends the build with the lite log instead
  of compiling torch's whole headers to fail again (compiler.py). When every error is such a typo,
  the log is the one the source as written gets; when there are others (a typo and then a parse
  error it causes, `y[i] = sinfvv v;`), the outcome is the same and the log is the lite build's.
  """
  if _MISSING_FILE_RE.search(lite_log):
    return False
  if not _ERROR_RE.search(lite_log):
    return True
  return not any(os.path.basename(path) == SOURCE_FILE and name not in env.full_tokens
                 for path, name in _UNDEFINED_AT_RE.findall(lite_log))


def broken_by_tier(log_text: str, tier: str) -> bool:
  """Whether a failed build's errors lie in the tier's own header (then no source can use it)."""
  name = re.escape(header_name(tier))
  return re.search(rf"{name}(\(\d+\): error|:\d+:\d+: error)", log_text) is not None


def plan(text: str, env: Environment | None, tiers: tuple[str, ...] = (LITE, TYPES),
         level: str | None = None) -> tuple[list[tuple[str, str]], dict[str, str]]:
  """[(tier, text)] to try in order, ending with the original; and why tiers were skipped.
  `level`: the source's level (default: cuda.cu's, from its includes)."""
  skipped = {}
  variants = []
  level = level or original_level(text)
  if env is not None and env.level == level:
    for tier in tiers:
      block = env.blocks.get(tier)
      if block is None:
        skipped[tier] = env.unavailable.get(tier, f"not applicable to a {level}-level source")
        continue
      reason = refusal(text, tier, env)
      if reason:
        skipped[tier] = reason
        continue
      variants.append((tier, rewrite(text, tier, level)))
  variants.append((ORIGINAL, text))
  return variants, skipped


def environment_key(fingerprint: str, argv: list[str], level: str) -> str:
  """Cache key of an environment: toolchain, compiler command, level, and VERSION (which covers
  the rules, the generated text and the lite header)."""
  blob = json.dumps([VERSION, fingerprint, argv, level])
  return hashlib.sha256(blob.encode()).hexdigest()


_HERE = pathlib.Path(__file__).parent
LITE_HEADER = _HERE / "torch_lite.h"
# The modules whose code decides what a tier holds and which sources may use it.
RULE_MODULES = (pathlib.Path(__file__), _HERE / "tier_environment.py")
_FACTORY_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<ATen/ops/(\w+)\.h>", re.M)


def lite_factories(lite_text: str) -> tuple[str, ...]:
  """The lite tier's factory ops: every `#include <ATen/ops/NAME.h>` of torch_lite.h, in order."""
  names = tuple(_FACTORY_INCLUDE_RE.findall(lite_text))
  if not names or len(set(names)) != len(names):
    raise ValueError(f"torch_lite.h must include each factory op's ATen/ops header once: {names}")
  return names


def content_version(lite_text: str, rule_sources: list[str]) -> str:
  """A digest of the lite header, its factory ops and the rules' code (syntax trees only)."""
  trees = [ast.dump(checks.parse_python(source)) for source in rule_sources]
  blob = json.dumps([lite_factories(lite_text), lite_text, trees])
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


LITE_FACTORIES = lite_factories(LITE_HEADER.read_text())
VERSION = content_version(LITE_HEADER.read_text(), [path.read_text() for path in RULE_MODULES])


