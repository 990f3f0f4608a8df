"""Reads candidate and reference Python with `ast`, never executing it.

The compile stage must know what a candidate will pass to `load_inline` before any candidate code
runs (the server never executes candidate code). Candidates build their sources from module-level
string constants, concatenation, f-strings, `"\\n".join([...])` and similar; `fold` evaluates that
small, side-effect-free subset of Python over the module's simple assignments. Anything else (a
source read from a file, built in a loop) is reported as unresolvable and the candidate is
rejected with the reason.

`InlineExtension.from_call` normalises load_inline's arguments exactly as torch does (str or list,
functions as list or dict); both the static side and the worker's patched `load_inline` go through
it, so the worker finds the prebuilt module by `InlineExtension.fingerprint`.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import textwrap
import typing
from typing import Any

MAX_FOLDED_CHARS = 8 << 20  # bound on any folded value: no "x" * 10**12 from a hostile candidate


class Unresolvable(ValueError):
  """A value the static folder cannot compute without running the candidate."""

  def __init__(self, reason: str, node: ast.AST | None = None):
    line = getattr(node, "lineno", None)
    super().__init__(f"line {line}: {reason}" if line else reason)


def _bind_load_inline(name, cpp_sources, cuda_sources=None, sycl_sources=None, functions=None,
                      extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None,
                      extra_ldflags=None, extra_include_paths=None, build_directory=None,
                      verbose=False, with_cuda=None, with_sycl=None, is_python_module=True,
                      with_pytorch_error_handling=True, keep_intermediates=True, use_pch=False,
                      no_implicit_headers=False) -> dict[str, Any]:
  """torch.utils.cpp_extension.load_inline's signature (torch 2.11-2.14), used only to bind."""
  del build_directory, verbose, keep_intermediates, use_pch, with_sycl, extra_sycl_cflags
  return dict(locals())


def _str_list(value: Any, what: str) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
    return tuple(value)
  raise Unresolvable(f"{what} must be a string or a list of strings, got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class InlineExtension:
  """One load_inline call, normalised as torch normalises it."""
  name: str
  cpp_sources: tuple[str, ...]
  cuda_sources: tuple[str, ...]
  functions: tuple[tuple[str, str], ...] | None  # (function, docstring); None when not given
  extra_cflags: tuple[str, ...] = ()
  extra_cuda_cflags: tuple[str, ...] = ()
  extra_ldflags: tuple[str, ...] = ()
  extra_include_paths: tuple[str, ...] = ()
  with_cuda: bool | None = None
  is_python_module: bool = True
  with_pytorch_error_handling: bool = True
  no_implicit_headers: bool = False

  @classmethod
  def from_call(cls, *args: Any, **kwargs: Any) -> InlineExtension:
    """Normalises load_inline(*args, **kwargs); raises Unresolvable on values torch rejects."""
    try:
      bound = _bind_load_inline(*args, **kwargs)
    except TypeError as e:
      raise Unresolvable(f"load_inline arguments do not bind: {e}") from e
    if bound["sycl_sources"]:
      raise Unresolvable("sycl_sources are not supported")
    if not isinstance(bound["name"], str) or not re.fullmatch(r"[A-Za-z_]\w*", bound["name"]):
      raise Unresolvable(f"load_inline name must be a Python identifier, got {bound['name']!r}")
    functions = bound["functions"]
    if functions is not None:
      if isinstance(functions, str):
        functions = [functions]
      if isinstance(functions, (list, tuple)):
        functions = {f: f for f in functions}
      if not isinstance(functions, dict) or not all(
          isinstance(k, str) and isinstance(v, str) for k, v in functions.items()):
        raise Unresolvable("functions must be a string, a list of strings or a dict of strings")
      functions = tuple(functions.items())
    flags = {}
    for key in ("with_cuda", "is_python_module", "with_pytorch_error_handling",
                "no_implicit_headers"):
      if bound[key] is not None and not isinstance(bound[key], bool):
        raise Unresolvable(f"{key} must be a bool")
      flags[key] = bound[key]
    return cls(
        name=bound["name"],
        cpp_sources=_str_list(bound["cpp_sources"], "cpp_sources"),
        cuda_sources=_str_list(bound["cuda_sources"], "cuda_sources"),
        functions=functions,
        extra_cflags=_str_list(bound["extra_cflags"], "extra_cflags"),
        extra_cuda_cflags=_str_list(bound["extra_cuda_cflags"], "extra_cuda_cflags"),
        extra_ldflags=_str_list(bound["extra_ldflags"], "extra_ldflags"),
        extra_include_paths=_str_list(bound["extra_include_paths"], "extra_include_paths"),
        **flags)

  @property
  def fingerprint(self) -> str:
    """Digest of every argument that changes the built module."""
    blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> InlineExtension:
    data = dict(data)
    for key, value in data.items():
      if isinstance(value, list):
        data[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return cls(**data)


# ----------------------------------------------------------------------------- constant folding

_STR_METHODS = {"join", "strip", "lstrip", "rstrip", "replace", "format", "upper", "lower",
                "removeprefix", "removesuffix", "splitlines", "split"}


def _check_size(value: Any, node: ast.AST) -> Any:
  if isinstance(value, (str, list, tuple)) and len(value) > MAX_FOLDED_CHARS:
    raise Unresolvable("value too large", node)
  return value


def fold(node: ast.AST, env: dict[str, Any]) -> Any:
  """Evaluates a side-effect-free constant expression over `env`; raises Unresolvable."""
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, ast.Name):
    if node.id in env:
      return env[node.id]
    raise Unresolvable(f"name {node.id!r} is not a module-level constant", node)
  if isinstance(node, (ast.List, ast.Tuple)):
    if any(isinstance(e, ast.Starred) for e in node.elts):
      raise Unresolvable("starred element", node)
    items = [fold(e, env) for e in node.elts]
    return items if isinstance(node, ast.List) else tuple(items)
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise Unresolvable("dict unpacking", node)
    return {fold(k, env): fold(v, env) for k, v in zip(node.keys, node.values)}
  if isinstance(node, ast.JoinedStr):
    parts: list[str] = []
    for value in node.values:
      if isinstance(value, ast.Constant):  # an f-string's literal parts are str
        parts.append(typing.cast(str, value.value))
        continue
      assert isinstance(value, ast.FormattedValue), value  # an f-string's only other part
      inner = fold(value.value, env)
      if value.conversion == ord("r"):
        inner = repr(inner)
      elif value.conversion == ord("s"):
        inner = str(inner)
      spec = fold(value.format_spec, env) if value.format_spec else ""
      parts.append(format(inner, spec))
    return _check_size("".join(parts), node)
  if isinstance(node, ast.BinOp):
    left, right = fold(node.left, env), fold(node.right, env)
    if isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(
        left, (str, list, tuple, int, float)):
      return _check_size(left + right, node)
    if isinstance(node.op, ast.Mult):
      seq, count = (left, right) if isinstance(right, int) else (right, left)
      if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and not isinstance(
          count, bool):
        if len(seq) * max(count, 0) > MAX_FOLDED_CHARS:
          raise Unresolvable("value too large", node)
        return seq * count
      if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left * right
    if isinstance(node.op, ast.Mod) and isinstance(left, str):
      return _check_size(left % right, node)
    if isinstance(node.op, (ast.Sub, ast.FloorDiv)) and all(
        isinstance(v, int) for v in (left, right)):
      return left - right if isinstance(node.op, ast.Sub) else left // right
    raise Unresolvable(f"unsupported operator {type(node.op).__name__}", node)
  if isinstance(node, ast.Call):
    return _fold_call(node, env)
  raise Unresolvable(f"unsupported expression {type(node).__name__}", node)


def _fold_call(node: ast.Call, env: dict[str, Any]) -> Any:
  if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None
                                                                for k in node.keywords):
    raise Unresolvable("star-arguments", node)
  args = [fold(a, env) for a in node.args]
  kwargs = {k.arg: fold(k.value, env) for k in node.keywords}
  func = node.func
  if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
    target = fold(func.value, env)
    if isinstance(target, str):
      try:
        return _check_size(getattr(target, func.attr)(*args, **kwargs), node)
      except (TypeError, ValueError, IndexError, KeyError) as e:
        raise Unresolvable(f"str.{func.attr} failed: {e}", node) from e
  if isinstance(func, ast.Attribute) and func.attr in ("dedent", "cleandoc") and isinstance(
      func.value, ast.Name) and func.value.id in ("textwrap", "inspect") and len(args) == 1:
    if isinstance(args[0], str):
      return textwrap.dedent(args[0]) if func.attr == "dedent" else _cleandoc(args[0])
  if isinstance(func, ast.Name) and func.id in ("dedent",) and len(args) == 1:
    return textwrap.dedent(args[0])
  if isinstance(func, ast.Name) and func.id in ("str", "list", "tuple", "dict") and func.id not in env:
    builtin = {"str": str, "list": list, "tuple": tuple, "dict": dict}[func.id]
    return builtin(*args, **kwargs)
  raise Unresolvable(f"call to {ast.unparse(func)} cannot be evaluated statically", node)


def _cleandoc(text: str) -> str:
  import inspect  # pylint: disable=import-outside-toplevel
  return inspect.cleandoc(text)


def _bind_targets(target: ast.AST, value: Any, env: dict[str, Any]) -> None:
  if isinstance(target, ast.Name):
    env[target.id] = value
  elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (list, tuple)) and len(
      target.elts) == len(value):
    for t, v in zip(target.elts, value):
      _bind_targets(t, v, env)
  else:
    for name in _target_names(target):
      env.pop(name, None)


def _target_names(target: ast.AST) -> list[str]:
  return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def assignments_env(body: list[ast.stmt], env: dict[str, Any] | None = None,
                    stop_at: ast.AST | None = None) -> dict[str, Any]:
  """Folds the simple assignments of `body` in order (stopping before `stop_at`).

  Names whose value cannot be folded are dropped, so a later use is reported unresolvable
  instead of silently taking an earlier value.
  """
  env = dict(env or {})
  for stmt in body:
    if stop_at is not None and stmt is stop_at:
      break
    if isinstance(stmt, ast.Assign):
      try:
        value = fold(stmt.value, env)
      except Unresolvable:
        for target in stmt.targets:
          for name in _target_names(target):
            env.pop(name, None)
        continue
      for target in stmt.targets:
        _bind_targets(target, value, env)
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
      env.pop(stmt.target.id, None)
      if stmt.value is not None:
        try:
          env[stmt.target.id] = fold(stmt.value, env)
        except Unresolvable:
          pass
    elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
      try:
        env[stmt.target.id] = fold(
            ast.BinOp(left=ast.Name(stmt.target.id), op=stmt.op, right=stmt.value), env)
      except Unresolvable:
        env.pop(stmt.target.id, None)
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      # A definition binds its own name, and whatever its body declares `global`.
      env.pop(stmt.name, None)
      for node in ast.walk(stmt):
        if isinstance(node, ast.Global):
          for name in node.names:
            env.pop(name, None)
    else:
      # Any other binding of a name (import, for, with, if/try bodies) hides a constant.
      for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
          env.pop(node.name, None)
        elif isinstance(node, ast.alias):
          env.pop((node.asname or node.name).split(".")[0], None)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
          env.pop(node.id, None)
  return env


# ----------------------------------------------------------------------------- load_inline calls


@dataclasses.dataclass
class ExtractedCall:
  """A load_inline call site and what it resolves to (or why it does not)."""
  lineno: int
  extension: InlineExtension | None
  error: str = ""


def load_inline_aliases(tree: ast.Module) -> set[str]:
  names = {"load_inline"}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("cpp_extension"):
      for alias in node.names:
        if alias.name == "load_inline":
          names.add(alias.asname or alias.name)
  return names


def _is_load_inline(func: ast.AST, aliases: set[str]) -> bool:
  if isinstance(func, ast.Name):
    return func.id in aliases
  return isinstance(func, ast.Attribute) and func.attr == "load_inline"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
  return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def find_load_inline_calls(tree: ast.Module) -> list[ExtractedCall]:
  """Every load_inline call in the module with its statically folded arguments."""
  aliases = load_inline_aliases(tree)
  parents = _parents(tree)
  module_env = assignments_env(tree.body)
  calls = []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and _is_load_inline(node.func, aliases)):
      continue
    # Climb to the statement holding the call and the body that statement belongs to.
    stmt: ast.AST = node
    scope = None
    while stmt in parents:
      parent = parents[stmt]
      if isinstance(stmt, ast.stmt) and stmt in getattr(parent, "body", []):
        scope = parent
        break
      stmt = parent
    if isinstance(scope, ast.Module):
      env = assignments_env(tree.body, stop_at=stmt)
    else:
      env = assignments_env(getattr(scope, "body", []), env=module_env, stop_at=stmt)
    try:
      if any(isinstance(a, ast.Starred) for a in node.args) or any(
          k.arg is None for k in node.keywords):
        raise Unresolvable("load_inline called with * or ** arguments", node)
      args = [fold(a, env) for a in node.args]
      kwargs = {k.arg: fold(k.value, env) for k in node.keywords}
      calls.append(ExtractedCall(node.lineno, InlineExtension.from_call(*args, **kwargs)))
    except Unresolvable as e:
      calls.append(ExtractedCall(node.lineno, None, str(e)))
  calls.sort(key=lambda c: c.lineno)
  return calls


# ----------------------------------------------------------------------------- CUDA text

_COMMENT_OR_STRING_RE = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
_GLOBAL_RE = re.compile(r"\b__global__\b")
_TOKEN_RE = re.compile(r"[A-Za-z_]\w*|\(|\)|[;{}]")
_LAUNCH_RE = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<(?:[^<>;]|<(?:[^<>;]|<[^<>;]*>)*>)*>)?\s*<<<")
_LAUNCH_API_RE = re.compile(r"\b(?:cudaLaunch\w*|cuLaunch\w*)\s*\(")


def code_only(code: str) -> str:
  """C++ text with comments and the contents of string/char literals blanked out."""
  def repl(m: re.Match) -> str:
    text = m.group(0)
    if text[0] in "\"'":
      return text[0] * 2
    return " " + "\n" * text.count("\n")
  return _COMMENT_OR_STRING_RE.sub(repl, code)


def global_kernels(cuda_code: str) -> list[str]:
  """Names of `__global__` functions, in order of definition (declarations included once)."""
  code = code_only(cuda_code)
  names: list[str] = []
  for match in _GLOBAL_RE.finditer(code):
    last_ident, depth_skip = None, 0
    for tok in _TOKEN_RE.finditer(code, match.end()):
      t = tok.group(0)
      if depth_skip:
        depth_skip += {"(": 1, ")": -1}.get(t, 0)
        continue
      if t in (";", "{", "}"):
        break
      if t == "(":
        if last_ident in ("__launch_bounds__", "__cluster_dims__", "__maxnreg__",
                          "__attribute__", "__declspec", "alignas"):
          depth_skip = 1
          continue
        if last_ident and last_ident not in names:
          names.append(last_ident)
        break
      if t != ")":
        last_ident = t
  return names


def launched_kernels(cuda_code: str, kernels: list[str]) -> list[str]:
  """Kernels with a `<<<...>>>` launch or a cudaLaunch*/cuLaunch* call naming them."""
  code = code_only(cuda_code)
  known = set(kernels)
  launched = {m.group(1) for m in _LAUNCH_RE.finditer(code) if m.group(1) in known}
  for match in _LAUNCH_API_RE.finditer(code):
    args = code[match.end():match.end() + 2000]
    depth, end = 1, len(args)
    for i, ch in enumerate(args):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        end = i
        break
    launched |= set(re.findall(r"[A-Za-z_]\w*", args[:end])) & known
  return [k for k in kernels if k in launched]
