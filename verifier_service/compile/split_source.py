"""A cuda.cu cut in two: its device code for nvcc without torch, its host code for g++ with torch.

Why: a phase-1 candidate's cuda.cu is a few kernels and their launchers, and nearly all of its
compile is torch's headers, parsed three times by nvcc (host front end, device front end, host
compiler). Its device code needs none of them. So (device_split.py builds it):

  device TU   the include block without torch's headers, the macros, types and constants, the
              device functions and variables, the kernels; plus, per kernel, a launcher
              `__dice_launch_<kernel>` (below). nvcc, torch's flags, no torch: ~1 CPU-s.
  host TU     the same text with the device code blanked and each kernel replaced by its
              launcher's declaration, each `k<<<cfg>>>(args)` rewritten; compiled by g++ against
              a precompiled header of the lite tier's torch headers (header_tiers.py): ~2 CPU-s.

Both keep the file name (cuda.cu) and every line number, so `__FILE__`/`__LINE__` in host code
(TORCH_CHECK's messages) read as in the source as written.

A launch is what nvcc itself makes of it: nvcc turns `k<<<g, b, s, st>>>(a, c)` into
`(__cudaPushCallConfiguration(g, b, s, st)) ? (void)0 : k(a, c)`, where `k` is the kernel's host
stub, which pops the configuration and calls cudaLaunchKernel. The host TU gets exactly that
expression with `__dice_launch_k` for `k`: the configuration is evaluated first and converted by
the same declaration, the arguments are converted to the kernel's own parameter types (the
launcher's parameters are the kernel's, verbatim), and the launcher (device TU) pops the
configuration and launches `k` with it through nvcc's own stub.

What is refused (`plan` says why; the build then takes the usual path, header_tiers.py), so that
the two halves mean what the whole does:
- anything whose meaning depends on sharing one translation unit with the other half: host code
  naming a device function, variable or type, or a kernel other than to launch it (its address,
  cudaFuncSetAttribute, occupancy queries, cudaMemcpyToSymbol); kernels launched from device code
  (relocatable device code); a name declared in both halves (overloads across them);
- templated, overloaded, extern "C" or defaulted-parameter kernels; `__host__` code (it would
  belong to both); namespaces, asm, extern (but `extern __shared__`), pragmas other than loop
  unrolling, includes after the code began, quoted, or outside what the lite header block holds
  and the names were computed with (`Names.extras`: the source's own further `<...>` includes,
  kept in both halves but for torch's, which the device half leaves out);
- launches whose configuration holds `<` or `>`, or that sit in a macro;
- device code (device functions, kernels, shared types, macros) using a name that only torch's
  headers bring (`SplitNames.device`): without torch it would mean something else or nothing;
- host code (launchers, shared types, macros) using a name whose declaration differs between
  nvcc's view of the headers and g++'s (`SplitNames.host`: execution-space-dependent code,
  `__CUDACC__` branches, CUDA-only declarations), or any `__`-name but a few plain C++ ones;
- names we generate (`__dice...`).
"""

from __future__ import annotations

import dataclasses
import re

from verifier_service.compile import batch as batch_lib

LAUNCHER = "__dice_launch_"
# Declared in the host TU's precompiled header: nvcc's own declaration (crt/device_functions.h),
# which nvcc's host front end gives every translation unit.
PUSH_DECLARATION = ('extern "C" unsigned __cudaPushCallConfiguration(dim3 gridDim, '
                    'dim3 blockDim = 1, size_t sharedMem = 0, struct CUstream_st *stream = 0);\n')
_POP_DECLARATION = ('extern "C" cudaError_t __cudaPopCallConfiguration(dim3 *, dim3 *, size_t *, '
                    'void *);\n')

_TOKEN_RE = re.compile(r"<<<|>>>|::|->|[A-Za-z_]\w*|\d[\w.']*|\S")
_IDENT_RE = re.compile(r"[A-Za-z_]\w*$")
_DIRECTIVE_RE = re.compile(r"^[ \t]*#[ \t]*(\w*)(.*)$")
_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"\n]+)[>\"][ \t]*$")
_TIER_INCLUDES = {"torch/extension.h", "torch/torch.h", "torch/types.h", "ATen/ATen.h"}
_TORCH_FOLDERS = {"ATen", "c10", "torch", "caffe2"}
_DEVICE_SPACE = {"__device__", "__constant__", "__shared__", "__managed__"}
_CUDA_WORDS = _DEVICE_SPACE | {"__global__", "__host__", "__grid_constant__", "__launch_bounds__",
                               "__cluster_dims__", "__maxnreg__", "__noinline__",
                               "__forceinline__", "__CUDA_ARCH__", "__CUDACC__", "__NVCC__"}
_PLAIN_DUNDER = {"__restrict__", "__restrict", "__func__", "__FILE__", "__LINE__",
                 "__FUNCTION__", "__PRETTY_FUNCTION__", "__VA_ARGS__", "__inline__"}
_TYPE_KEYS = {"struct", "class", "union", "enum", "typedef", "using"}
_TYPE_WORDS = {"void", "bool", "char", "short", "int", "long", "float", "double", "signed",
               "unsigned", "const", "volatile", "auto", "struct", "class", "union", "enum",
               "typename", "static", "inline", "constexpr", "extern", "template"}
_DIRECTIVES = {"include", "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif",
               "error", ""}
_VISIBILITY = '__attribute__((visibility("hidden")))'
_FORBIDDEN = {"namespace": "opens a namespace", "asm": "has inline assembly",
              "__asm__": "has inline assembly", "__asm": "has inline assembly",
              "__attribute__": "has an __attribute__", "_Pragma": "has a _Pragma",
              "operator": "declares an operator", "thread_local": "has a thread_local"}


class Refused(Exception):
  """Why a source cannot be split."""


@dataclasses.dataclass(frozen=True)
class Names:
  """What the split must not meet (split_names.py computes them per toolchain and flags)."""
  device: frozenset[str]  # names only torch's headers bring (device code must not use them)
  host: frozenset[str]  # names whose meaning differs between nvcc's and g++'s view of the headers
  block_includes: frozenset[str]  # headers the host TU's precompiled header already includes
  # The source's own includes beyond those (`extra_includes`) the names were computed with: both
  # halves keep their lines but for torch's (`torch_header`), which the device half leaves out.
  extras: tuple[str, ...] = ()

  @property
  def allowed(self) -> frozenset[str]:
    return self.block_includes | frozenset(self.extras)


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str
  params: str  # the parameter list, verbatim (whitespace folded)
  param_names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Split:
  """The two translation units (each named cuda.cu, line for line the source's)."""
  device: str
  host: str
  kernels: tuple[Kernel, ...]


@dataclasses.dataclass
class _Item:
  start: int  # offsets in the text
  end: int
  kind: str  # "directive", "kernel", "device", "shared", "host"
  tokens: list[tuple[str, int]]  # (token, offset); comments and literals are not tokens
  declared: set[str] = dataclasses.field(default_factory=set)

  @property
  def words(self) -> list[str]:
    return [t for t, _ in self.tokens]

  def head(self) -> list[str]:
    """The tokens before the body's brace (all of them if there is none)."""
    words = self.words
    return words[:words.index("{")] if "{" in words else words


def _tokens(code: str, start: int, end: int) -> list[tuple[str, int]]:
  return [(m.group(), start + m.start()) for m in _TOKEN_RE.finditer(code[start:end])]


def _items(code: str) -> list[_Item]:
  """The top-level items in order: directive lines (with their continuations), and declarations
  ending at `;` or at the `}` that closes a function body, at brace and parenthesis depth 0."""
  items: list[_Item] = []
  pending: list[tuple[str, int]] = []
  depth = parens = 0
  aggregate = continued = False
  base = 0
  for line in code.split("\n"):
    end = base + len(line)
    directive = _DIRECTIVE_RE.match(line)
    if continued or (directive and not pending):
      if continued:
        items[-1].end = end
        items[-1].tokens += _tokens(code, base, end)
      else:
        items.append(_Item(base, end, "directive", _tokens(code, base, end)))
      continued = line.rstrip().endswith("\\")
    elif directive:
      word, rest = directive.group(1), directive.group(2).split()
      if word != "pragma" or not rest or rest[0] not in ("unroll", "nounroll"):
        raise Refused(f"has a #{word} directive inside a declaration")
    else:
      for tok, at in _tokens(code, base, end):
        pending.append((tok, at))
        if tok in ("(", "["):
          parens += 1
        elif tok in (")", "]"):
          parens -= 1
        elif tok == "{":
          if depth == 0:
            head = {t for t, _ in pending}
            aggregate = "=" in head or ("(" not in head and bool(head & _TYPE_KEYS))
          depth += 1
        elif tok == "}":
          depth -= 1
          if depth < 0:
            raise Refused("closes a brace it did not open")
        if depth == 0 and parens == 0 and (tok == ";" or (tok == "}" and not aggregate)):
          items.append(_Item(pending[0][1], at + 1, "", pending))
          pending = []
    base = end + 1
  if pending or depth or parens:
    raise Refused("its braces or parentheses do not balance")
  return items


def _classify(item: _Item) -> None:
  words, head = item.words, item.head()
  if "__global__" in head:
    item.kind = "kernel"
  elif "__host__" in words:
    raise Refused("has __host__ code")
  elif set(words) & _DEVICE_SPACE:
    item.kind = "device"
  elif head and (head[0] in _TYPE_KEYS or (head[0] == "template" and "(" not in head and
                                           set(head) & _TYPE_KEYS)):
    item.kind = "shared"  # a type: the same definition in both halves
  elif "(" not in head and {"const", "constexpr"} & set(head):
    item.kind = "shared"  # a constant: internal linkage, the same in both halves
  elif "(" in head and "constexpr" in head[:head.index("(")]:
    item.kind = "shared"  # a constexpr function: inline; device code may call it (relaxed)
  elif head and head[0] == "static_assert":
    item.kind = "shared"
  else:
    item.kind = "host"
  if "using" in head and "namespace" in head:
    raise Refused("has a using-directive")
  if item.kind == "kernel" and "template" in words:
    raise Refused("has a templated kernel")
  if "extern" in head and not (item.kind == "device" and "__shared__" in head):
    raise Refused("has an extern declaration")
  item.declared = _declared(head)


def _declared(head: list[str]) -> set[str]:
  """Names a top-level declaration introduces (over-approximated)."""
  names, parens = set(), 0
  for i, tok in enumerate(head):
    if tok in ("(", "["):
      parens += 1
    elif tok in (")", "]"):
      parens -= 1
    elif parens == 0 and _IDENT_RE.match(tok) and tok not in _TYPE_WORDS:
      following = head[i + 1] if i + 1 < len(head) else ";"
      previous = head[i - 1] if i else ""
      if following in ("(", "=", ";", "[", ",", ":", "{") or previous in (
          "struct", "class", "union", "enum"):
        names.add(tok)
  return names


def _param_span(item: _Item) -> tuple[int, int]:
  """Indexes (in item.tokens) of a kernel's parameter list's parentheses."""
  words = item.head()
  for i, tok in enumerate(words):
    if tok == "(" and i and _IDENT_RE.match(words[i - 1]) and words[i - 1] not in _CUDA_WORDS:
      depth = 0
      for j in range(i, len(words)):
        depth += {"(": 1, ")": -1}.get(words[j], 0)
        if depth == 0:
          return i, j
  raise Refused("has a kernel whose parameters cannot be read")


def _kernel(text: str, item: _Item) -> Kernel:
  open_at, close_at = _param_span(item)
  name = item.tokens[open_at - 1][0]
  groups, current, depth = [], [], 0
  for tok in item.words[open_at + 1:close_at]:
    if tok in ("(", "[", "<"):
      depth += 1
    elif tok in (")", "]", ">"):
      depth -= 1
    if tok == "," and depth == 0:
      groups.append(current)
      current = []
    else:
      current.append(tok)
  groups += [current] if current else []
  names = []
  for words in groups:
    if words == ["void"]:
      continue
    if "=" in words or "..." in words or "." in words:
      raise Refused(f"kernel {name} has a default or variadic parameter")
    dunder = [w for w in words if w.startswith("__") and w not in _PLAIN_DUNDER]
    if dunder:
      raise Refused(f"kernel {name} has a parameter marked {dunder[0]}")
    while words and words[-1] == "]":  # an array parameter: its name is before the brackets
      words = words[:len(words) - 1 - words[::-1].index("[")]
    if len(words) < 2 or not _IDENT_RE.match(words[-1]) or words[-1] in _TYPE_WORDS:
      raise Refused(f"kernel {name} has an unnamed parameter")
    names.append(words[-1])
  params = text[item.tokens[open_at][1] + 1:item.tokens[close_at][1]]
  return Kernel(name, " ".join(params.split()), tuple(names))


def _launches(item: _Item, kernels: set[str]) -> list[tuple[int, int, int, int, str]]:
  """Per launch in a host item: (offset of the kernel's name, end of `<<<`, start of `>>>`, end
  of the `(` after it, the kernel)."""
  tokens, found = item.tokens, []
  for i, (tok, at) in enumerate(tokens):
    if tok != "<<<":
      continue
    name, name_at = tokens[i - 1] if i else ("", 0)
    if name not in kernels:
      raise Refused(f"launches {name or 'something'}, not a kernel of its own by name")
    j = i + 1
    while j < len(tokens) and tokens[j][0] != ">>>":
      if tokens[j][0] in ("<", ">", "<<<"):
        raise Refused(f"a launch of {name} has < or > in its configuration")
      j += 1
    if j + 1 >= len(tokens) or tokens[j + 1][0] != "(":
      raise Refused(f"a launch of {name} cannot be read")
    found.append((name_at, at + 3, tokens[j][1], tokens[j + 1][1] + 1, name))
  return found


def _macro_tokens(items: list[_Item], used: set[str]) -> set[str]:
  """The tokens of the candidate's macros that `used` names, and of the macros those name."""
  bodies = {}
  for item in items:
    words = item.words
    if item.kind == "directive" and len(words) > 2 and words[1] == "define":
      bodies.setdefault(words[2], set()).update(w for w in words[3:] if _IDENT_RE.match(w))
  seen, todo, out = set(), [n for n in used if n in bodies], set()
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    out |= bodies[name]
    todo += [n for n in bodies[name] if n in bodies]
  return out


# Text the cut's reading of comments, literals and lines could take for something other than
# what the compiler reads (the cut strips with header_tiers.STRIP_RE, line by line).
_MISREAD = (
    (re.compile(r"%:|<%|%>|<:|:>"), "has a digraph"),
    (re.compile(r"\?\?[=/'()!<>\-]"), "has a trigraph"),
    (re.compile(r'(?:\b|(?<=[^A-Za-z0-9_]))(?:u8|[uUL])?R"'), "has a raw string literal"),
    (re.compile(r"[0-9A-Fa-f]'[0-9A-Fa-f]"), "has a digit separator"),
    (re.compile(r"##"), "pastes tokens (##)"),
    (re.compile(r"\\[ \t]*\n"), "splices lines with a backslash outside a directive"),
)


def _misread(text: str) -> None:
  """Refuses text the cut could read otherwise than the compiler: digraphs and trigraphs, raw
  strings, digit separators, token pasting, and backslash-newline anywhere but at the end of a
  directive's line (a comment or an identifier continued on the next line)."""
  splices = "\n".join(line for line in _logical_lines(text) if not _DIRECTIVE_RE.match(line))
  for pattern, why in _MISREAD:
    if pattern.search(splices if why.startswith("splices") else text):
      raise Refused(why)
  for line, code in zip(text.split("\n"), batch_lib.strip(text).split("\n")):
    if line.rstrip().endswith("\\") and not code.rstrip().endswith("\\"):
      raise Refused("splices a comment or literal onto the next line")


def _logical_lines(text: str) -> list[str]:
  """Physical lines joined where a directive continues (the rest stays as it is)."""
  out: list[str] = []
  continuing = False
  for line in text.split("\n"):
    if continuing:
      out[-1] += "\n" + line
    else:
      out.append(line)
    continuing = line.rstrip().endswith("\\") and bool(_DIRECTIVE_RE.match(out[-1]))
  return out


def extra_includes(text: str, block_includes: frozenset[str]) -> tuple[str, ...]:
  """The headers `text` includes as `<...>` beyond torch's tier headers and `block_includes`, in
  the order of their first include (what `Names.extras` must hold for `plan` to accept it)."""
  found: list[str] = []
  for line in batch_lib.strip(text).split("\n"):  # comments and literals blanked
    include = _INCLUDE_RE.match(line)
    if include and include.group(1) == "<" and include.group(2) not in _TIER_INCLUDES and (
        include.group(2) not in block_includes) and include.group(2) not in found:
      found.append(include.group(2))
  return tuple(found)


def torch_header(name: str) -> bool:
  """A header of torch's (the device half, compiled without torch, leaves its include out)."""
  return name.split("/", 1)[0] in _TORCH_FOLDERS


def plan(text: str, names: Names) -> Split:
  """The two translation units of a cuda.cu (as load_inline writes it); raises Refused."""
  if "__dice" in text:
    raise Refused("uses a name the split generates (__dice...)")
  _misread(text)
  items = _items(batch_lib.strip(text))
  code_began = False
  for item in items:
    bad = next((w for w in item.words if w in _FORBIDDEN), None)
    if bad:
      raise Refused(_FORBIDDEN[bad])
    if item.kind != "directive":
      code_began = True
      _classify(item)
      continue
    line = text[item.start:item.end]
    word = item.words[1] if len(item.words) > 1 and item.words[0] == "#" else ""
    if word not in _DIRECTIVES:
      raise Refused(f"has a #{word} directive")
    include = _INCLUDE_RE.match(line)
    if word == "include" and (code_began or not include):
      raise Refused("has an #include after its code began")
    if include and include.group(2) not in _TIER_INCLUDES and (
        include.group(1) != "<" or include.group(2) not in names.allowed):
      raise Refused(f"includes {include.group(2)}, which the lite headers do not")
  kinds = lambda *wanted: [i for i in items if i.kind in wanted]
  kernels: dict[str, Kernel] = {}
  for item in kinds("kernel"):
    kernel = _kernel(text, item)
    if kernel.name in kernels and kernels[kernel.name].params != kernel.params:
      raise Refused(f"overloads kernel {kernel.name}")
    kernels[kernel.name] = kernel
  if not kernels:
    raise Refused("has no kernel")
  device_names = set().union(set(), *(i.declared for i in kinds("device")))
  host_names = set().union(set(), *(i.declared for i in kinds("host")))
  both = host_names & (device_names | set(kernels))
  if both:
    raise Refused(f"declares {sorted(both)[0]} in host and device code")
  for item in kinds("kernel", "device", "shared", "directive"):
    if "<<<" in item.words:
      raise Refused("launches a kernel from device code, a macro or a shared declaration")
  launches = {id(i): _launches(i, set(kernels)) for i in kinds("host")}
  launched_at = {launch[0] for found in launches.values() for launch in found}
  for item in kinds("host"):
    for tok, at in item.tokens:
      if tok in kernels and at not in launched_at:
        raise Refused(f"names kernel {tok} other than to launch it")
      if tok in device_names:
        raise Refused(f"its host code names device code: {tok}")
  _check_names(items, names)
  return _render(text, items, kernels, launches,
                 frozenset(e for e in names.extras if torch_header(e)))


def _check_names(items: list[_Item], names: Names) -> None:
  idents = lambda found: {t for t in found if _IDENT_RE.match(t)}
  device_side = idents(t for i in items if i.kind in ("kernel", "device", "shared")
                       for t in i.words)
  conditions = idents(t for i in items if i.kind == "directive" and i.words[1:2] in (
      ["if"], ["ifdef"], ["ifndef"], ["elif"]) for t in i.words)
  device_side |= _macro_tokens(items, device_side) | conditions
  clash = sorted(device_side & names.device)
  if clash:
    raise Refused(f"its device code uses {clash[0]}, which only torch's headers declare")
  host_side = idents(t for i in items if i.kind in ("host", "shared") for t in i.words)
  for item in (i for i in items if i.kind == "kernel"):  # the launcher's declaration
    open_at, close_at = _param_span(item)
    host_side |= idents(item.words[open_at + 1:close_at])
  host_side |= _macro_tokens(items, host_side) | conditions
  dunder = sorted(t for t in host_side if t.startswith("__") and t not in _PLAIN_DUNDER)
  if dunder:
    raise Refused(f"its host code uses {dunder[0]}")
  differs = sorted(host_side & names.host)
  if differs:
    raise Refused(f"its host code uses {differs[0]}, which nvcc's and g++'s headers declare "
                  "differently")


def _render(text: str, items: list[_Item], kernels: dict[str, Kernel],
            launches: dict[int, list], host_only: frozenset[str]) -> Split:
  """Both halves, offset for offset the source (each replaced span's text sits in its first
  character's slot), so that launches can be rewritten by their offsets. The includes of
  `host_only` are blanked in the device half."""
  device, host = list(text), list(text)

  def put(chars: list[str], start: int, end: int, new: str) -> None:
    chars[start:end] = [new] + [""] * (end - start - 1)

  def blank(chars: list[str], item: _Item) -> None:
    put(chars, item.start, item.end, re.sub(r"[^\n]", " ", text[item.start:item.end]))

  for item in items:
    include = _INCLUDE_RE.match(text[item.start:item.end]) if item.kind == "directive" else None
    if include and include.group(2) in _TIER_INCLUDES:
      blank(device, item)
      blank(host, item)  # the host TU's precompiled header holds the lite tier's headers
    elif include and include.group(2) in host_only:
      blank(device, item)
    elif item.kind == "host":
      blank(device, item)
    elif item.kind == "device":
      blank(host, item)
    elif item.kind == "kernel":
      open_at, _ = _param_span(item)
      kernel = kernels[item.tokens[open_at - 1][0]]
      lines = text.count("\n", item.start, item.end)
      put(host, item.start, item.end, f"{_VISIBILITY} void {LAUNCHER}{kernel.name}("
                                      f"{kernel.params});" + "\n" * lines)
  for found in launches.values():
    for name_at, open_end, close_at, paren_end, name in found:
      put(host, name_at, open_end, "(__cudaPushCallConfiguration(")
      put(host, close_at, paren_end, f")) ? (void)0 : {LAUNCHER}{name}(")
  return Split(device="".join(device) + "\n" + _POP_DECLARATION +
               "".join(_launcher(k) for k in kernels.values()),
               host="".join(host), kernels=tuple(kernels.values()))


def _launcher(kernel: Kernel) -> str:
  """The host function the host TU calls for `kernel<<<...>>>`: nvcc's stub, one call later."""
  return (f"{_VISIBILITY} void {LAUNCHER}{kernel.name}({kernel.params}) {{\n"
          "  dim3 __dice_grid, __dice_block; size_t __dice_shared; cudaStream_t __dice_stream;\n"
          "  if (__cudaPopCallConfiguration(&__dice_grid, &__dice_block, &__dice_shared, "
          "&__dice_stream) != cudaSuccess) return;\n"
          f"  {kernel.name}<<<__dice_grid, __dice_block, __dice_shared, __dice_stream>>>("
          f"{', '.join(kernel.param_names)});\n}}\n")
