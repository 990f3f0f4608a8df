"""Many candidates' cuda.cu compiled as one nvcc translation unit: the headers are parsed once.

Why: nearly all of a cuda.cu compile is torch's and the C++ library's headers (BENCHMARKS.md,
"where a compile's seconds go"). Eight DICE kernels in one translation unit cost what one does:
24.2 CPU-s for the eight against 24.6 for one (nvcc 13.0 -c, lite tier, CPU VM, 2026-12-02).

Each member keeps the meaning it has alone, and cannot reach another member's process:
- Its source is its own file (`m<i>/cuda.cu`), #included inside a namespace whose name carries a
  random per-batch nonce (`dice_<nonce>_<i>`). Its include lines are blanked: every member of a
  batch starts with the same include block, which the batch file includes once, first (a member
  whose own block leaves the same preprocessed tokens and macros joins a group with another
  block: `Batcher._group_includes`). Each macro it defines is #undef'd after it. Its file ends
  with a marker declaration that the batch checks at global scope, so a member that closes or
  opens braces of its own (leaving its namespace, or leaving one open) fails the batch.
  Conditional directives must balance within each file (the preprocessor checks that per file).
- `refusal` keeps off every source whose meaning could change inside a namespace or leak past its
  file: extern "C", asm, attributes and pragmas other than loop unrolling, operators, explicit
  specialisations, using-declarations, __COUNTER__, the file macros (__FILE__, __BASE_FILE__,
  __INCLUDE_LEVEL__, ...: a member's file is not the source's), macros the headers also define,
  macros used where they could declare names, and any name it declares at namespace scope that
  the headers also use at global scope (inside a namespace it would hide the global overloads it
  joins alone), unless the compiler says the headers declare no such global (`using ::name;`
  fails in both front ends: the name was a parameter's, a struct member's, a literal's suffix;
  asked once per include block and name, in the background, after the first refusal). Header
  macros that expand to __FILE__ (TORCH_CHECK's message) still name the member's file in a batch:
  a member that reads such a message can tell it is batched, and what it then does is what its
  verdict checks (the batched module is the one that runs).
- The batch object runs no member code when loaded: its initialisation and finalisation entries
  and the translation unit's initialiser must match, instruction for instruction and symbol for
  symbol, those of an object of the include block alone (compiled once per group), and it has no
  indirect (ifunc) symbols. The other members' code in a member's module is then inert: nothing
  calls it, and only the CUDA runtime knows its kernels, which nobody launches.
- A batch holds at most one member per problem (the reference it is verified against), so the
  code a member's module carries besides its own never answers the member's own problem; and a
  candidate that goes looking for the other members' kernels in its own module (by symbol or
  through the CUDA driver) and launches one is REJECTED with FOREIGN_KERNEL (the kernel profile
  names every launched kernel; each member's job knows its own namespace).
- A member's module is the batch object linked with its own main.o; the global names main.o
  needs are bound to the member's namespace with --defsym (compiler.py).
Whatever fails falls back to the member's own build (the tiers, ending with the source as
written): a member whose errors name its file is dropped and the batch retried once without it,
so that member's verdict comes from its own build and log (compiler.py builds it at once by the
usual path, `NAMED_IN_ERRORS`, not split). A batch that goes over a bound
(limits.py: memory, CPU time, output, ...) sends every member to build alone, bounded as well:
only the member that did it fails, with its own message; the others' verdicts are unchanged. A
batch's own log quotes every member's source, so none of it goes into a member's notes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
import pathlib
import re
import secrets
import shutil
import subprocess
import tempfile
from typing import Awaitable, Callable

from verifier_service.compile import header_tiers
from verifier_service.compile import procs as compile_procs

log = logging.getLogger(__name__)

# (argv, cwd) -> (return code, output): the compile pool's runner.
RunFn = Callable[[list[str], pathlib.Path], Awaitable[tuple[int, str]]]
# (argv, files it reads) -> the argv to run: confine.Confinement.tool (confined and bounded).
ToolFn = Callable[[list[str], tuple[str, ...]], list[str]]


def _as_is(argv: list[str], reads: tuple[str, ...]) -> list[str]:
  del reads
  return argv

MAX_MEMBERS = 16
# A batch of at most this many is not built when every member has a cheaper way alone (the
# split path, device_split.py). Decision, H200-16 RL bursts of 2026-12-05 (BENCHMARKS.md, "Runs
# 9-12"): a batch of 2 cost 6.9-17.3 CPU-s (median 11.6, ten batches: three gcc runs over the
# headers, cudafe++ and cicc, cold when no warm front end matched), a split build's cuda.cu
# 3.1-3.8 (means); batches of 3 cost 6.7 and 11.3, four of 5-10 (32 members) 49.7 together.
SMALL_BATCH = 2
# A refused member's clashing names asked of the compiler at once (`Batcher._check_names`): an
# EDG front end stops after 100 errors, one per name not declared.
NAMES_PER_CHECK = 64
GATHER_S = 0.15  # a burst's requests arrive within this of each other
GATHER_MAX_S = 1.0
# Why a member was not batched when the batch's own errors name its code: it most likely does not
# compile at all (compiler.py then builds it the usual way at once, which gives its own log).
NAMED_IN_ERRORS = "its code is named in its batch's errors; built alone"
SMALL = f"a batch of {SMALL_BATCH} or fewer costs more than the split path alone"
MEMBER_FILE = "m{index}/cuda.cu"

_COMMENT_RE = header_tiers.STRIP_RE  # comments and literals
_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"\n]+[>\"][ \t]*$")
_DIRECTIVE_RE = re.compile(r"^[ \t]*#[ \t]*(\w*)(.*)$")
_TOKEN_RE = re.compile(r"[A-Za-z_]\w*|::|\[\[|[{}()\[\];,=:<>.]|->|\S")
_ALLOWED_DIRECTIVES = {"define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif",
                       "error", "warning", ""}
# The file macros too: in a batch a member is `m<i>/cuda.cu`, included one level down from the
# batch's file, so __FILE__, __BASE_FILE__, __INCLUDE_LEVEL__ and __TIMESTAMP__ would read
# otherwise than alone (a member could tell it is batched).
_FORBIDDEN_TOKENS = {"asm", "__asm", "__asm__", "__attribute__", "__attribute", "__declspec",
                     "_Pragma", "__pragma", "__COUNTER__", "TORCH_EXTENSION_NAME", "operator",
                     "thread_local", "__thread", "export", "__FILE__", "__BASE_FILE__",
                     "__FILE_NAME__", "__INCLUDE_LEVEL__", "__TIMESTAMP__"}
# Header macros a member may use at namespace scope: declaration specifiers and attributes that
# declare no name of their own.
_SCOPE_MACROS = {"__global__", "__device__", "__host__", "__forceinline__", "__noinline__",
                 "__inline__", "__launch_bounds__", "__constant__", "__shared__", "__managed__",
                 "__restrict__", "__align__", "__grid_constant__", "__cluster_dims__",
                 "__maxnreg__", "C10_HOST_DEVICE", "C10_DEVICE", "C10_HOST", "C10_ALWAYS_INLINE",
                 "C10_NOINLINE", "C10_UNUSED", "C10_API", "TORCH_API", "NULL"}
_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case catch
char char8_t char16_t char32_t class compl concept const consteval constexpr constinit const_cast
continue co_await co_return co_yield decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace new
noexcept not not_eq nullptr operator or or_eq private protected public register reinterpret_cast
requires return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq""".split())
KEYWORDS = _KEYWORDS
_DECL_FOLLOW = {"(", "=", ";", "[", ",", "{", ":"}
_ERROR_LINE_RE = re.compile(r"\berror\b", re.I)
_MEMBER_IN_LINE_RE = re.compile(r"\bm(\d+)/cuda\.cu\b")


@dataclasses.dataclass(frozen=True)
class Member:
  """A cuda.cu that may join a batch: its include block and the rest of its text."""
  includes: tuple[str, ...]  # the leading #include lines, whitespace-normalised
  body: str  # the source with those lines blanked (line numbers unchanged)
  macros: tuple[str, ...]  # macros it #defines
  declared: frozenset[str]  # names it declares at namespace scope (over-approximated)
  scope_names: frozenset[str]  # identifiers it uses at namespace scope (macro check)
  problem: str = ""  # the reference it is verified against: one member per problem in a batch
  alone_ok: bool = False  # it has a cheaper way alone than a small batch (the split path)


@dataclasses.dataclass(frozen=True)
class Batched:
  """A member's object: the batch's, and the namespace its code lives in."""
  path: str
  namespace: str
  size: int


def _blank(match: re.Match) -> str:
  return re.sub(r"[^\n]", " ", match.group())


def strip(text: str) -> str:
  """The text without comments and literals (each replaced by spaces; newlines kept)."""
  return _COMMENT_RE.sub(_blank, text)


def split_member(text: str) -> tuple[Member | None, str]:
  """The member a cuda.cu (at a light tier) would be in a batch, or None and why not."""
  code = strip(text)
  lines, code_lines = text.split("\n"), code.split("\n")
  includes, first = [], len(code_lines)
  for i, line in enumerate(code_lines):
    if not line.strip():
      continue
    if _INCLUDE_RE.match(line):
      include = " ".join(line.split())
      if include not in includes or "assert" in include:  # again: a no-op behind its guard
        includes.append(include)
      continue
    first = i
    break
  body_lines = list(lines)
  for i in range(first):
    if code_lines[i].strip():
      body_lines[i] = ""
  macros: list[str] = []
  for line in code_lines[first:]:
    match = _DIRECTIVE_RE.match(line)
    if not match:
      continue
    name, rest = match.group(1), match.group(2).split()
    if name == "pragma" and rest and rest[0] in ("unroll", "nounroll"):
      continue
    if name not in _ALLOWED_DIRECTIVES:
      return None, f"has a #{name} directive after its code began"
    if name == "define" and rest:
      macros.append(re.match(r"\w*", rest[0]).group())
    if name == "undef" and rest and rest[0] not in macros:
      return None, f"#undefs {rest[0]}, which it did not define"
  if re.search(r"\bextern\s*\"", _COMMENT_RE.sub(
      lambda m: m.group() if m.group().startswith('"') else _blank(m), text)):
    return None, "has an extern \"C\" (or other language) linkage"
  every = _TOKEN_RE.findall("\n".join(code_lines[first:]))  # macro bodies too
  bad = sorted(set(every) & _FORBIDDEN_TOKENS)
  if bad:
    return None, f"uses {bad[0]}"
  if "[[" in every:
    return None, "has a [[...]] attribute"
  if "namespace" in every:  # an anonymous or inline one would declare into the member's scope
    return None, "opens a namespace"
  tokens = _TOKEN_RE.findall("\n".join(_without_directives(code_lines[first:])))
  declared, scope_names, reason = _namespace_scope(tokens)
  if reason:
    return None, reason
  return Member(tuple(includes), "\n".join(body_lines), tuple(dict.fromkeys(macros)),
                frozenset(declared), frozenset(scope_names)), ""


def _without_directives(lines: list[str]) -> list[str]:
  """The lines that are not directives or their backslash continuations."""
  kept, in_directive = [], False
  for line in lines:
    if in_directive or _DIRECTIVE_RE.match(line):
      in_directive = line.rstrip().endswith("\\")
      continue
    kept.append(line)
  return kept


def _namespace_scope(tokens: list[str]) -> tuple[set[str], set[str], str]:
  """Names declared and identifiers used at the member's namespace scope (outside every brace,
  bracket and parenthesis), with enumerators; or why the source is refused."""
  declared, used = set(), set()
  depth, parens, enum_at = 0, 0, None
  pending_enum = False
  for i, tok in enumerate(tokens):
    nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
    prev = tokens[i - 1] if i else ""
    if tok == "{":
      if depth == 0 and parens == 0 and pending_enum:
        enum_at = 1
      depth += 1
      pending_enum = False
      continue
    if tok == "}":
      depth -= 1
      if depth < 0:
        return set(), set(), "closes a brace it did not open"
      if enum_at is not None and depth < enum_at:
        enum_at = None
      continue
    if depth == 0 and tok in ("(", "["):
      parens += 1
    elif depth == 0 and tok in (")", "]"):
      parens -= 1
    if depth == 0 and tok == ";":
      pending_enum = False
    if not re.match(r"[A-Za-z_]", tok):
      continue
    if enum_at is not None and depth == enum_at and nxt in (",", "=", "}"):
      declared.add(tok)
      continue
    if depth != 0 or parens != 0:
      continue
    if tok == "enum":
      pending_enum = True
    if tok == "template" and nxt == "<" and i + 2 < len(tokens) and tokens[i + 2] == ">":
      return set(), set(), "has an explicit specialisation"
    if tok == "using" and nxt != "namespace" and not (i + 2 < len(tokens)
                                                       and tokens[i + 2] == "="):
      return set(), set(), "has a using-declaration at namespace scope"
    if tok in _KEYWORDS:
      continue
    used.add(tok)
    if prev in ("::", ".", "->") or nxt == "::":
      continue
    if nxt in _DECL_FOLLOW:
      declared.add(tok)
  if depth != 0 or parens != 0:
    return set(), set(), "its braces or parentheses do not balance"
  # A block-scope extern declaration names an entity of the enclosing namespace.
  for i, tok in enumerate(tokens):
    if tok == "extern":
      for name in itertools.takewhile(lambda t: t != ";", tokens[i + 1:]):
        if re.match(r"[A-Za-z_]", name) and name not in _KEYWORDS:
          declared.add(name)
  return declared, used, ""


def refusal(member: Member, global_names: frozenset[str], macros: frozenset[str]) -> str | None:
  """Why `member` must be built alone, given the global names and macros of its include block;
  None if it may join a batch."""
  redefined = set(member.macros) & macros
  if redefined:
    return f"defines a macro the headers define: {sorted(redefined)[0]}"
  macros_here = (member.scope_names & macros) - _SCOPE_MACROS
  if macros_here:
    return f"uses the header macro {sorted(macros_here)[0]} at namespace scope"
  own = member.scope_names & set(member.macros)
  if own:
    return f"uses its own macro {sorted(own)[0]} at namespace scope"
  found = clashes(member, global_names, macros)
  if found:
    return f"declares {sorted(found)[0]}, a name the headers use at global scope"
  return None


def clashes(member: Member, global_names: frozenset[str], macros: frozenset[str]
            ) -> frozenset[str]:
  """The names `member` declares at namespace scope that `global_names` (the include block's)
  holds."""
  return (member.declared - macros - set(member.macros)) & global_names


def global_names(preprocessed: str) -> frozenset[str]:
  """Every identifier a preprocessed translation unit uses outside all namespaces (over-
  approximates the names it declares at global scope: also members, parameters and locals of
  global functions and classes). An inline namespace counts as global scope; a using-directive
  at global scope makes every identifier count."""
  text = "\n".join(l for l in preprocessed.split("\n") if not l.lstrip().startswith("#"))
  text = strip(text)
  names: set[str] = set()
  stack: list[bool] = []  # per open brace: a (non-inline) namespace's?
  in_namespaces = 0
  namespace_head = False
  previous = ""
  for match in re.finditer(r"[A-Za-z_]\w*|[{};]", text):
    tok = match.group()
    if tok == "{":
      stack.append(namespace_head)
      in_namespaces += namespace_head
      namespace_head = False
    elif tok == "}":
      if stack:
        in_namespaces -= stack.pop()
    elif tok == ";":
      namespace_head = False  # `namespace a = b;`
    else:
      if tok == "namespace":
        if previous == "using" and not in_namespaces:
          return frozenset(re.findall(r"[A-Za-z_]\w*", text)) - _KEYWORDS
        namespace_head = previous != "inline"
      if not in_namespaces:
        names.add(tok)
    previous = tok
  return frozenset(names - _KEYWORDS)


def batch_files(nonce: str, includes: tuple[str, ...], members: list[Member]
                ) -> tuple[str, dict[str, str]]:
  """The batch translation unit and its members' files."""
  parts = list(includes)
  files = {}
  for index, member in enumerate(members):
    name, marker = f"dice_{nonce}_{index}", f"dice_batch_end_{nonce}"
    path = MEMBER_FILE.format(index=index)
    files[path] = f"{member.body}\nstruct {marker};\n"
    parts += [f"namespace {name} {{", f'#include "{path}"', "}"]
    parts += [f"#undef {macro}" for macro in member.macros]
    parts.append(f'static_assert(sizeof(::{name}::{marker}*) != 0, "batch member {index} '
                 'left its namespace");')
  return "\n".join(parts) + "\n", files


def members_in_errors(log_text: str) -> set[int]:
  """Indices of the members whose files an error line names."""
  found = set()
  for line in log_text.splitlines():
    if _ERROR_LINE_RE.search(line):
      found.update(int(m) for m in _MEMBER_IN_LINE_RE.findall(line))
  return found


# ----------------------------------------------------------------------------- the object


def _tool(tool: ToolFn, name: str, *args: str) -> str:
  reads = tuple(a for a in args if a.endswith(".o"))
  return subprocess.run(tool([name, *args], reads), capture_output=True, text=True,
                        check=True).stdout


def init_signature(obj: str, tool: ToolFn = _as_is) -> tuple:
  """What loading `obj` runs: per entry of its init/fini arrays, the function's instructions
  (mnemonics) and the symbols they refer to (nvcc's registration of the object's own kernels with
  the CUDA runtime by name only); its .init/.fini sections; its indirect (ifunc) symbols."""
  at, bodies = _functions(obj, tool)
  entries: list[tuple] = []  # (section, what runs): a closure, "cuda registration", "unknown"...
  section = ""
  for line in _tool(tool, "readelf", "-rW", obj).splitlines():
    head = re.match(r"Relocation section '\.rela?(\S+)'", line)
    if head:
      section = head.group(1)
      continue
    kind = re.match(r"\.(init_array|fini_array|ctors|dtors|preinit_array)", section)
    entry = re.search(r"\bR_\w+\s+([0-9a-f]+)\s+(\S+)\s*\+\s*([0-9a-f]+)", line)
    if not (kind and entry):
      continue
    symbol, addend = entry.group(2), int(entry.group(3), 16)
    name = (at.get((symbol, addend)) if symbol.startswith(".")
            else symbol if addend == 0 and symbol in bodies else None)
    if name is None:
      entries.append((kind.group(1), "unknown", symbol, addend))
    elif "__cudaRegisterAll" in name:
      entries.append((kind.group(1), "cuda registration"))
    else:
      entries.append((kind.group(1), _closure(name, bodies)))
  sections = tuple(sorted(re.findall(r"\] (\.(?:init|fini)) ", _tool(tool, "readelf", "-SW",
                                                                      obj))))
  ifuncs = tuple(sorted(l.split()[-1] for l in _tool(tool, "readelf", "-sW", obj).splitlines()
                        if " IFUNC " in l))
  return tuple(sorted(entries, key=repr)), sections, ifuncs


def _functions(obj: str, tool: ToolFn
               ) -> tuple[dict[tuple[str, int], str], dict[str, tuple[str, ...]]]:
  """{(section, offset): name} and {name: body}: each function's instructions (mnemonics), the
  functions it calls or jumps to by name, and its relocation targets; no addresses or addends."""
  functions: dict[tuple[str, int], tuple[str, list[str]]] = {}
  section, body = "", None
  for line in _tool(tool, "objdump", "-dr", "--no-show-raw-insn", obj).splitlines():
    head = re.match(r"Disassembly of section (\S+):", line)
    if head:
      section = head.group(1)
      continue
    start = re.match(r"^([0-9a-f]+) <([^>]+)>:$", line)
    if start:
      body = []
      functions[(section, int(start.group(1), 16))] = (start.group(2), body)
      continue
    if body is None or ":" not in line:
      continue
    rest = line.split(":", 1)[1].strip()
    if not rest:
      continue
    if re.match(r"R_\w+", rest):
      body.append("reloc " + re.sub(r"[-+]0x[0-9a-f]+$", "", rest.split()[-1]))
      continue
    body.append(rest.split()[0])
    target = re.search(r"<([^>+]+)(?:\+0x[0-9a-f]+)?>", rest)
    if target and rest.split()[0].startswith(("call", "jmp", "bl", "b.")):
      body.append("to " + target.group(1))
  return ({k: name for k, (name, _) in functions.items()},
          {name: tuple(body) for name, body in functions.values()})


def _closure(name: str, bodies: dict[str, tuple[str, ...]]) -> tuple:
  """A function's body followed by the bodies of every function of the object it reaches."""
  seen, reached, todo = set(), [], [name]
  while todo:
    current = todo.pop(0)
    if current in seen or current not in bodies:
      continue
    seen.add(current)
    reached.append(bodies[current])
    todo += [line.split(" ", 1)[1] for line in bodies[current]
             if line.startswith(("to ", "reloc "))]
  return tuple(reached)


def undefined_in(obj: str, nonce: str, tool: ToolFn = _as_is) -> list[str]:
  """Symbols `obj` needs from a batch namespace but does not define."""
  return [l.split()[0] for l in _tool(tool, "nm", "-P", "-u", obj).splitlines() if nonce in l]


def defsyms(main_obj: str, batch_obj: str, namespace: str, tool: ToolFn = _as_is) -> list[str]:
  """`-Wl,--defsym` options binding the global functions main.o needs to `namespace`'s."""
  needed = [l.split()[0] for l in _tool(tool, "nm", "-P", "-u", main_obj).splitlines()
            if l.strip()]
  defined = [l.split()[0] for l in _tool(tool, "nm", "-P", "--defined-only", batch_obj
                                         ).splitlines()
             if namespace in l]
  if not needed or not defined:
    return []
  names = _tool(tool, "c++filt", *needed, *defined).splitlines()
  wanted = dict(zip(names[:len(needed)], needed))
  prefix = namespace + "::"
  options = []
  for plain, mangled in zip(names[len(needed):], defined):
    if plain.startswith(prefix) and plain[len(prefix):] in wanted:
      options.append(f"-Wl,--defsym={wanted[plain[len(prefix):]]}={mangled}")
  return options


# ----------------------------------------------------------------------------- the batcher


@dataclasses.dataclass
class _Group:
  """Members waiting to be compiled together (same command, module id and include block)."""
  cmd: list[str]
  module_id: str | None
  includes: tuple[str, ...]
  waiting: list[tuple[Member, asyncio.Future]] = dataclasses.field(default_factory=list)
  arrivals: int = 0
  dispatcher: asyncio.Task | None = None
  names: asyncio.Future | None = None  # (global names, macros) of the include block
  # Of its global names, those the compiler says the block does not declare at global scope (a
  # parameter's, a member's, a literal's suffix), per name asked (`Batcher._check_names`).
  not_declared: set[str] = dataclasses.field(default_factory=set)
  asked: dict[str, asyncio.Future] = dataclasses.field(default_factory=dict)
  prefix_object: asyncio.Future | None = None  # its object's init_signature


class Batcher:
  """Gathers the cuda.cu compiles that wait at the same time into batches.

  `compile_fn(cmd, text, filename, module_id, files)` is Objects.compile; `run(argv, cwd)` runs a
  compiler process. A member waits about GATHER_S (at most GATHER_MAX_S) for company; the
  headers' names are read (preprocessing, once per group) only once a group has two members,
  and the headers' own object is compiled (once per group) alongside its first batch. A lone
  member, a refused one, the members of a batch too small to pay (`worth_a_batch`) and every
  member of a failed batch are told to build alone (None)."""

  def __init__(self, compile_fn, run: RunFn, work_dir: pathlib.Path,
               max_members: int = MAX_MEMBERS, gather_s: float = GATHER_S,
               tool: ToolFn = _as_is):
    self._compile = compile_fn
    self._tool = tool
    self._run = run
    self._work_dir = work_dir
    self.max_members = max_members
    self.gather_s = gather_s
    self._groups: dict[tuple, _Group] = {}
    self._tasks: set[asyncio.Task] = set()  # batches in flight (a reference keeps each alive)
    self._digests: dict[tuple, asyncio.Future] = {}  # (cmd, include block): `_digest`
    self.stats = {"batches": 0, "batched": 0, "alone": 0, "refused": 0, "failed": 0,
                  "extended": 0, "names_not_declared": 0}

  async def compile(self, cmd: list[str], module_id: str | None, text: str, problem: str = "",
                    alone_ok: bool = False) -> tuple[Batched | None, str]:
    """The object `text` (a light-tier cuda.cu) gets from a batch, or None and why not. Members
    with the same non-empty `problem` never share a batch; `alone_ok` members (a cheaper way
    alone) share none of SMALL_BATCH or fewer members that are all `alone_ok`."""
    member, reason = split_member(text)
    if member is None:
      self.stats["refused"] += 1
      return None, reason
    includes = await self._group_includes(cmd, module_id, member.includes)
    member = dataclasses.replace(member, problem=problem, includes=includes, alone_ok=alone_ok)
    key = (tuple(cmd), module_id, includes)
    group = self._groups.get(key)
    if group is None:
      group = self._groups[key] = _Group(list(cmd), module_id, includes)
    future = asyncio.get_running_loop().create_future()
    group.waiting.append((member, future))
    group.arrivals += 1
    if group.dispatcher is None or group.dispatcher.done():
      group.dispatcher = asyncio.ensure_future(self._dispatch(group))
    return await future

  async def _group_includes(self, cmd: list[str], module_id: str | None,
                            includes: tuple[str, ...]) -> tuple[str, ...]:
    """`includes`, or the include block of a group (same command) that leaves the code after
    it exactly what `includes` leaves: the same tokens (host and device preprocessing, pragmas
    included) and the same macros, so a member compiles in that group's batches as with its own
    block. E.g. <cmath> or <math.h> after torch's headers, which included them already: 16 of
    DICE's 99 phase-1 answers, which so share the batches of the 66 with the common block. Each
    block is preprocessed once (`_digest`), the first time it meets another group."""
    if (tuple(cmd), module_id, includes) in self._groups:
      return includes
    others = sorted({g.includes for g in self._groups.values()
                     if g.cmd == cmd and g.module_id == module_id}, key=len)
    mine = await self._digest(cmd, includes) if others else None
    for other in others if mine is not None else ():
      if await self._digest(cmd, other) == mine:
        self.stats["extended"] += 1
        return other
    return includes

  async def _digest(self, cmd: list[str], includes: tuple[str, ...]) -> str | None:
    key = (tuple(cmd), includes)
    if key not in self._digests:
      self._digests[key] = asyncio.ensure_future(self._read_digest(cmd, includes))
    return await asyncio.shield(self._digests[key])

  async def _read_digest(self, cmd: list[str], includes: tuple[str, ...]) -> str | None:
    """A hash of what the include block leaves for the code after it: its preprocessed tokens
    (host, device) and its macros at its end. None if it does not preprocess alone."""
    try:
      host, device, macros = await self._preprocessed(
          cmd, includes, (["-Xcompiler", "-P"], ["-D__CUDA_ARCH__=900", "-Xcompiler", "-P"],
                          ["-Xcompiler", "-dM"]))
    except compile_procs.ProcessFailed:
      return None

    def digest() -> str:
      h = hashlib.sha256()
      # Tokens apart from spacing; macros as a set (-dM lists them in no set order).
      for part in (host.split(), device.split(), sorted(macros.splitlines())):
        h.update("\n".join(part).encode() + b"\0")
      return h.hexdigest()
    return await asyncio.to_thread(digest)

  async def _preprocessed(self, cmd: list[str], includes: tuple[str, ...],
                          passes: tuple[list[str], ...]) -> list[str]:
    """The include block alone through `cmd`'s preprocessor, once per pass (extra flags each),
    at once: the outputs. Raises ProcessFailed if a pass fails."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="batch-block-", dir=self._work_dir))
    try:
      (work / "cuda.cu").write_text(_include_text(includes))
      base = [a for a in cmd if a not in ("-c", "{src}", "-o", "{out}")]
      for rc, output in await asyncio.gather(*(
          self._run(base + extra + ["-E", "cuda.cu", "-o", f"out{i}.ii"], work)
          for i, extra in enumerate(passes))):
        if rc != 0:
          raise compile_procs.ProcessFailed(output)
      return await asyncio.to_thread(lambda: [
          (work / f"out{i}.ii").read_text(errors="replace") for i in range(len(passes))])
    finally:
      shutil.rmtree(work, ignore_errors=True)

  async def _dispatch(self, group: _Group) -> None:
    """Gathers the group's arrivals, then hands them to a task of their own and ends, so that
    members arriving while that task compiles start the next gathering."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:  # wait while more arrive, up to GATHER_MAX_S
      seen = group.arrivals
      await asyncio.sleep(self.gather_s)
      if group.arrivals == seen or loop.time() - start > GATHER_MAX_S:
        break
    taken = [(m, f) for m, f in group.waiting if not f.done()]
    group.waiting.clear()
    task = asyncio.ensure_future(self._run_taken_or_alone(group, taken))
    self._tasks.add(task)
    task.add_done_callback(self._tasks.discard)

  async def _run_taken_or_alone(self, group: _Group,
                                taken: list[tuple[Member, asyncio.Future]]) -> None:
    compile_procs.WHAT.set("batch")  # this task's own context: its processes are the batch's
    try:
      await self._run_taken(group, taken)
    except Exception as e:  # pylint: disable=broad-except  (a speed-up: each builds alone)
      log.exception("batching failed")
      self._alone(taken, f"batching failed: {e!r}")

  async def _run_taken(self, group: _Group, taken: list[tuple[Member, asyncio.Future]]) -> None:
    if len(taken) < 2:
      self._alone(taken, "no other compile to share one with")
      return
    if not worth_a_batch(taken):
      self._alone(taken, SMALL)
      return
    try:
      names, macros = await self._names(group)
    except compile_procs.ProcessFailed as e:
      self._alone(taken, "its include block does not preprocess alone: " + e.log[-200:])
      return
    names = names - group.not_declared
    members = []
    for member, future in taken:
      reason = refusal(member, names, macros)
      if reason:
        self.stats["refused"] += 1
        self._check_names(group, clashes(member, names, macros))
        _resolve(future, None, reason)
      else:
        members.append((member, future))
    planned = chunks(members, self.max_members)
    if any(worth_a_batch(chunk) for chunk in planned):
      self._prefix_object(group)  # compiles alongside the batches, which check against it
    runs = []
    for chunk in planned:
      if len(chunk) == 1:
        self._alone(chunk, "no other compile (of another problem) to share one with")
      elif not worth_a_batch(chunk):
        self._alone(chunk, SMALL)
      else:
        runs.append(asyncio.ensure_future(self._run_batch(group, chunk)))
    await asyncio.gather(*runs, return_exceptions=True)

  def _alone(self, members: list[tuple[Member, asyncio.Future]], why: str) -> None:
    for _, future in members:
      if not future.done():
        self.stats["alone"] += 1
        _resolve(future, None, why)

  async def _run_batch(self, group: _Group, members: list[tuple[Member, asyncio.Future]],
                       retried: bool = False) -> None:
    nonce = secrets.token_hex(6)
    text, files = batch_files(nonce, group.includes, [m for m, _ in members])
    futures = [f for _, f in members]
    task = asyncio.ensure_future(self._compile(group.cmd, text, "cuda.cu", group.module_id,
                                               files))
    watch = asyncio.ensure_future(_all_done(futures))
    unusable = ""
    try:
      await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
      if not task.done():  # every member gave up (deadline, client gone)
        return
      obj, _ = task.result()
      signature = await asyncio.shield(self._prefix_object(group))
      unusable = await asyncio.to_thread(_check, obj, nonce, signature, self._tool)
    except compile_procs.LimitExceeded as e:  # which member did it is unknown: each builds alone
      unusable = f"it went over a bound ({e.limit.value})"
    except compile_procs.ProcessFailed as e:
      culprits = {i for i in members_in_errors(e.log) if i < len(members)}
      for i in culprits:
        _resolve(members[i][1], None, NAMED_IN_ERRORS)
      rest = [pair for i, pair in enumerate(members) if i not in culprits]
      if culprits and not retried and worth_a_batch(rest):
        await self._run_batch(group, rest, retried=True)
        return
      log.info("a batch of %d did not compile:\n%s", len(members), e.log[-2000:])
      unusable = "it did not compile"  # its log quotes the other members' sources
    except Exception as e:  # pylint: disable=broad-except  (a speed-up: each builds alone)
      log.exception("batch compile failed to run")
      unusable = repr(e)
    finally:
      watch.cancel()
      if not task.done():
        task.cancel()
    if unusable:
      log.info("a batch of %d was not used (%s); its members build alone", len(members),
               unusable[:300])
      self.stats["failed"] += 1
      for f in futures:
        _resolve(f, None, "its batch was not used: " + unusable[:200])
      return
    self.stats["batches"] += 1
    self.stats["batched"] += len(members)
    for index, f in enumerate(futures):
      _resolve(f, Batched(obj, f"dice_{nonce}_{index}", len(members)), "")

  async def _names(self, group: _Group) -> tuple[frozenset[str], frozenset[str]]:
    if group.names is None:
      group.names = asyncio.ensure_future(self._read_names(group))
    return await asyncio.shield(group.names)

  async def _read_names(self, group: _Group) -> tuple[frozenset[str], frozenset[str]]:
    """The include block's global names (host and device preprocessing) and macros."""
    host, device, macros = await self._preprocessed(
        group.cmd, group.includes, ([], ["-D__CUDA_ARCH__=900"], ["-Xcompiler", "-dM"]))
    names = await asyncio.to_thread(lambda: global_names(host) | global_names(device))
    return names, frozenset(re.findall(r"^#define (\w+)", macros, re.M))

  def _check_names(self, group: _Group, names: frozenset[str]) -> None:
    """Asks the compiler, in the background, which of `names` (global names of the group's block
    that a refused member declares) the block really declares at global scope; those it does
    not stop keeping members out of later batches. The members refused meanwhile are not made
    to wait (the answer costs two front-end runs over the headers, once per group and name)."""
    fresh = sorted(set(names) - set(group.asked))[:NAMES_PER_CHECK]
    if not fresh:
      return
    task = asyncio.ensure_future(self._read_not_declared(group, fresh))
    group.asked.update((name, task) for name in fresh)
    self._tasks.add(task)
    task.add_done_callback(self._tasks.discard)

  async def names_checked(self) -> None:
    """Waits for every name check started so far (`_check_names`)."""
    await asyncio.gather(*(f for g in self._groups.values() for f in g.asked.values()),
                         return_exceptions=True)

  async def _read_not_declared(self, group: _Group, names: list[str]) -> None:
    """`using ::name;` for each of `names` after the group's include block, through both of
    `cmd`'s front ends (cudafe++ for the host view, then the device view's cicc by `-cubin`),
    followed by a line that is always an error, so that neither goes further. A name is not
    declared when both say "the global scope has no" it and both reached that last line; any
    other outcome (a failed run, a timeout, output cut short) leaves every name declared."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="batch-names-", dir=self._work_dir))
    nonce = secrets.token_hex(6)
    end = f"dice_names_end_{nonce}"
    try:
      await asyncio.to_thread((work / "cuda.cu").write_text, (
          _include_text(group.includes)
          + f"namespace dice_names_{nonce} {{ "
          + " ".join(f"using ::{name};" for name in names) + f" }}\n{end};\n"))
      base = [a for a in group.cmd if a not in ("-c", "{src}", "-o", "{out}")]
      runs = await asyncio.gather(
          self._run(base + ["-c", "cuda.cu", "-o", "cuda.o"], work),
          self._run(base + ["-cubin", "cuda.cu", "-o", "cuda.cubin"], work))
    except Exception:  # pylint: disable=broad-except  (a speed-up: the refusal stays)
      log.exception("checking the headers' global names failed")
      return
    finally:
      await asyncio.to_thread(shutil.rmtree, work, True)
    if any(rc == 0 or end not in output for rc, output in runs):
      return
    found = {name for name in names
             if all(f'the global scope has no "{name}"' in output for _, output in runs)}
    group.not_declared |= found
    self.stats["names_not_declared"] += len(found)

  def _prefix_object(self, group: _Group) -> asyncio.Future:
    """What the include block's own object runs at load time (None if it does not build): a
    future, started once per group when its first batch is planned, so that the object compiles
    alongside that batch rather than after it. Decision: on the H200 box (2026-12-03) starting
    it only once the batch had compiled put a whole compile (16 s under a burst) between every
    group's first batch object and its members' links."""
    if group.prefix_object is None:
      async def build() -> tuple | None:
        try:
          obj, _ = await self._compile(group.cmd, _include_text(group.includes), "cuda.cu",
                                       group.module_id, None)
        except compile_procs.ProcessFailed:
          return None
        return await asyncio.to_thread(init_signature, obj, self._tool)
      group.prefix_object = asyncio.ensure_future(build())
    return group.prefix_object


def chunks(members: list[tuple[Member, asyncio.Future]], size: int
           ) -> list[list[tuple[Member, asyncio.Future]]]:
  """Batches of at most `size`, none holding two members of one problem (a member's module
  holds the other members' code: it must not hold another answer to its own problem)."""
  out: list[list[tuple[Member, asyncio.Future]]] = []
  for pair in members:
    problem = pair[0].problem
    home = next((c for c in out if len(c) < size and not (
        problem and any(m.problem == problem for m, _ in c))), None)
    if home is None:
      out.append([pair])
    else:
      home.append(pair)
  return out


def worth_a_batch(members: list[tuple[Member, asyncio.Future]]) -> bool:
  """Two members or more, and more than SMALL_BATCH unless one has no cheaper way alone."""
  return len(members) > 1 and (len(members) > SMALL_BATCH
                               or not all(m.alone_ok for m, _ in members))


def _include_text(includes: tuple[str, ...]) -> str:
  return "\n".join(includes) + "\n"


def _resolve(future: asyncio.Future, value: Batched | None, why: str) -> None:
  if not future.done():
    future.set_result((value, why))


def _check(obj: str, nonce: str, signature: tuple | None, tool: ToolFn = _as_is) -> str:
  """Why the batch object must not be used, or ''."""
  missing = undefined_in(obj, nonce, tool)
  if missing:
    return f"it needs symbols of a member that no member defines: {missing[:3]}"
  if signature is None or init_signature(obj, tool) != signature:
    return "it runs code at load time that the headers alone do not"
  return ""


async def _all_done(futures: list[asyncio.Future]) -> None:
  while not all(f.done() for f in futures):
    await asyncio.sleep(0.5)
