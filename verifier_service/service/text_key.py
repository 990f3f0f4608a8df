"""One key for candidates that are the same program laid out otherwise: the scheduler's text cache.

An RL policy repeats itself, within a step's group and across steps, and not always to the byte:
a comment changed, a line re-indented. The scheduler answers a candidate whose key it has seen
for the same problem and options with the verdict already given (service/scheduler.py), so only
a change of program reaches the compiler and a GPU. A key is a sha256 over the reference, the
request's options and the candidate reduced to what its execution depends on:

- Python: the syntax tree without positions (`ast.dump`), so comments, blank lines, indentation
  width and line breaks inside brackets do not count; every literal, name and docstring does.
- C/C++/CUDA sources, only in the strings that reach load_inline's `cpp_sources`/`cuda_sources`
  and nothing else (a literal in the call, or a module-level name bound once to a literal and
  read nowhere but in such an argument): what the preprocessor itself discards, as it discards
  it. Each comment becomes one space (a block comment keeps its newlines, so `__LINE__` and
  diagnostics keep their lines), a run of spaces and tabs becomes one space (stringification
  `#x` sees one space for any run, and never none for some), and spaces at a line's ends go.
  Literals ("...", '...', raw strings) are copied as they are.

Checked, not assumed: where the reading is not certain, the source string is kept exactly
(`_Unsure`): `#include` lines and every line continued with a backslash (and the one after) are
copied as they are, so header names and spliced tokens cannot change; a comment or literal that
runs into such a line, an unterminated literal, a digit separator (`1'000`), a trigraph or a
character literal longer than a few characters keeps the whole string as written. A candidate
that does not parse gets no key (it is decided, not cached, by the static checks).

What it deliberately leaves out: a program that reads its own source text or the positions of
its own code (frame line numbers) could tell two such candidates apart; candidates are programs,
and the verdict of the first text stands for both. Messages quoting a line number quote the first
text's.
"""

from __future__ import annotations

import ast
import hashlib
import re
import typing

from verifier_service.compile import checks

_SOURCE_ARGS = {"cpp_sources": 1, "cuda_sources": 2}  # keyword -> position in load_inline
_LITERAL_MAX = 16  # a char literal longer than this is not one we understand
_HORIZONTAL = " \t\f\v"
_INCLUDE = re.compile(r"[ \t]*#[ \t]*(include|include_next|import)\b")
_INCLUDE_NAME = re.compile(r"[ \t]*#[ \t]*(include|include_next|import)[ \t]*(<[^>\n]*>|\"[^\"\n]*\")")


class _Unsure(Exception):
  """This source cannot be reduced safely; it is compared exactly."""


def _line_kinds(text: str) -> tuple[list[bool], list[bool]]:
  """Per physical line: whether it is copied as written (an #include, a line ending with a
  backslash, a line continued from the one before), and whether it is a directive."""
  verbatim, directive, continued = [], [], False
  for line in text.split("\n"):
    ends_continued = line.rstrip(_HORIZONTAL).endswith("\\")
    verbatim.append(continued or ends_continued or bool(_INCLUDE.match(line)))
    directive.append(line.lstrip(_HORIZONTAL).startswith("#"))
    continued = ends_continued
  return verbatim, directive


def normalise_c(text: str) -> str:
  """The C/C++ text with comments and layout reduced as the preprocessor would reduce them, or
  the text itself where that is not certain."""
  try:
    return _normalise_c(text)
  except _Unsure:
    return text


def _normalise_c(text: str) -> str:
  if "??" in text or re.search(r"[0-9A-Fa-f]'[0-9A-Fa-f]", text):
    raise _Unsure("trigraph or digit separator")
  verbatim, directive = _line_kinds(text)
  out: list[str] = []
  line, i, n = 0, 0, len(text)
  pending_space = False  # a run of horizontal whitespace or a comment, not yet written

  def flush_space() -> None:
    nonlocal pending_space
    if pending_space and out and not out[-1].endswith("\n"):
      out.append(" ")
    pending_space = False

  while i < n:
    ch = text[i]
    if verbatim[line]:
      end = text.find("\n", i)
      end = n if end < 0 else end
      _check_closed_on_line(_INCLUDE_NAME.sub("", text[i:end], count=1))
      flush_space()
      out.append(text[i:end + 1])
      line += 1
      i = end + 1
      continue
    if ch == "\n":
      pending_space = False  # spaces at the end of a line go
      out.append("\n")
      line += 1
      i += 1
    elif ch in _HORIZONTAL:
      pending_space = True
      i += 1
    elif text.startswith("//", i):
      end = text.find("\n", i)
      i = n if end < 0 else end
      pending_space = True
    elif text.startswith("/*", i):
      end = text.find("*/", i + 2)
      if end < 0:
        raise _Unsure("unterminated comment")
      newlines = text.count("\n", i, end)
      if newlines and directive[line]:
        raise _Unsure("a comment spans lines inside a directive")
      if any(verbatim[line + k] for k in range(1, newlines + 1)):
        raise _Unsure("a comment runs into a line kept as written")
      if newlines:
        out.append("\n" * newlines)  # the comment's space: the newline stands for it
        line += newlines
        pending_space = False
      else:
        pending_space = True
      i = end + 2
    elif ch in "\"'" or _raw_string_start(text, i):
      flush_space()
      end = _literal_end(text, i)
      if text.count("\n", i, end):
        raise _Unsure("a literal spans lines")
      out.append(text[i:end])
      i = end
    else:
      flush_space()
      out.append(ch)
      i += 1
  if pending_space:
    out.append(" ")  # at the very end: kept, as one space
  return "".join(out)


def _check_closed_on_line(segment: str) -> None:
  """A line kept as written may hold comments and literals only if they close on it."""
  i = 0
  while i < len(segment):
    if segment.startswith("/*", i):
      end = segment.find("*/", i + 2)
      if end < 0:
        raise _Unsure("a comment leaves a line kept as written")
      i = end + 2
    elif segment.startswith("//", i):
      return
    elif segment[i] in "\"'" or _raw_string_start(segment, i):
      i = _literal_end(segment, i)
    else:
      i += 1


_RAW = re.compile(r'(?:u8|[uUL])?R"([^()\\ \t\n]{0,16})\(')


def _raw_string_start(text: str, i: int) -> bool:
  if text[i] not in "uULR" or (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
    return False
  return bool(_RAW.match(text, i))


def _literal_end(text: str, i: int) -> int:
  """Index just past the string, char or raw string literal starting at `i`."""
  raw = _RAW.match(text, i) if text[i] != '"' and text[i] != "'" else None
  if raw is not None:
    close = ")" + raw.group(1) + '"'
    end = text.find(close, raw.end())
    if end < 0:
      raise _Unsure("unterminated raw string")
    return end + len(close)
  quote, j = text[i], i + 1
  while j < len(text) and text[j] != quote:
    if text[j] == "\n":
      raise _Unsure("unterminated literal")
    j += 2 if text[j] == "\\" else 1
  if j >= len(text):
    raise _Unsure("unterminated literal")
  if quote == "'" and j - i > _LITERAL_MAX:
    raise _Unsure("not a character literal")
  return j + 1


def _is_load_inline(node: ast.AST) -> typing.TypeGuard[ast.Call]:
  return isinstance(node, ast.Call) and (
      (isinstance(node.func, ast.Name) and node.func.id == "load_inline")
      or (isinstance(node.func, ast.Attribute) and node.func.attr == "load_inline"))


def _source_groups(tree: ast.Module) -> list[list[ast.Constant]]:
  """The string literals that are whole C/C++ sources of load_inline and nothing else, grouped
  by argument (a list's elements are reduced all or none: torch joins them, and a comment left
  open in one would reach into the next).

  A source is a literal given as the argument or as an element of a list or tuple given there,
  or a module-level name bound once, to a literal, and read only in such places. Any other
  shape (a concatenation, an f-string, a call) keeps its text."""
  direct: list[list[ast.expr]] = []
  for call in filter(_is_load_inline, ast.walk(tree)):
    args = [k.value for k in call.keywords if k.arg in _SOURCE_ARGS]
    args += [a for p, a in enumerate(call.args) if p in _SOURCE_ARGS.values()]
    for arg in args:
      items = list(arg.elts) if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
      if all(isinstance(x, ast.Name) or (isinstance(x, ast.Constant) and isinstance(x.value, str))
             for x in items):
        direct.append(items)
  places = {id(x) for items in direct for x in items}
  bound = {}
  for stmt in tree.body:
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)):
      bound.setdefault(stmt.targets[0].id, []).append(stmt.value)
  uses: dict[str, list[ast.AST]] = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      uses.setdefault(node.id, []).append(node)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
      for name in node.names:
        uses.setdefault(name, []).append(node)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      for alias in node.names:
        uses.setdefault(alias.asname or alias.name.split(".")[0], []).append(node)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      uses.setdefault(node.name, []).append(node)
    elif isinstance(node, ast.arg):
      uses.setdefault(node.arg, []).append(node)

  def literal(name: str) -> ast.Constant | None:
    """The literal `name` stands for, if it is bound once to one and read only as a source."""
    if len(bound.get(name, [])) != 1:
      return None
    stores = [u for u in uses[name] if not (isinstance(u, ast.Name) and isinstance(u.ctx, ast.Load))]
    loads = [u for u in uses[name] if isinstance(u, ast.Name) and isinstance(u.ctx, ast.Load)]
    ok = len(stores) == 1 and all(id(u) in places for u in loads)
    return bound[name][0] if ok else None

  groups = []
  for items in direct:
    group = [literal(x.id) if isinstance(x, ast.Name) else x for x in items]
    constants = [c for c in group if isinstance(c, ast.Constant)]
    if len(constants) == len(group):  # every name bound to a literal
      groups.append(constants)
  return groups


def candidate_key(reference: str, candidate: str, options: bytes) -> str | None:
  """The text cache's key for a request (None: the candidate does not parse)."""
  try:
    tree = checks.parse_python(candidate)
  except (SyntaxError, ValueError, MemoryError, RecursionError):
    return None
  for group in _source_groups(tree):
    try:
      reduced = [_normalise_c(typing.cast(str, node.value)) for node in group]  # str: checked
    except _Unsure:
      continue
    for node, text in zip(group, reduced):
      node.value = text
  h = hashlib.sha256()
  for part in (reference.encode(), options, ast.dump(tree).encode()):
    h.update(len(part).to_bytes(8, "little"))
    h.update(part)
  return h.hexdigest()
