"""Static checks (stage 1): milliseconds of `ast` work that refuse hopeless requests early.

A reference that cannot be used is BAD_REFERENCE (not the candidate's fault). A candidate is
REJECTED, with one clear reason, when it is not Python, defines no `ModelNew`, subclasses or uses
the reference `Model` (INHERITS_REFERENCE), catches an exception inside a function and then
computes with torch or the reference instead, or carries on after its custom op failed
(TRY_EXCEPT_FALLBACK), computes through another kernel runtime (Triton, CuPy, Numba, torch.compile:
TORCH_FALLBACK), registers kernels for torch's own operators (`torch.library` or the dispatcher's
private API from Python, TORCH_LIBRARY_IMPL / TORCH_LIBRARY_FRAGMENT / raw `torch::Library` for a
namespace it did not define, in its C++: DISPATCH_OVERRIDE), never calls `load_inline`, passes it
arguments we cannot resolve without running it, or compiles no CUDA `__global__` kernel that is launched anywhere (decoy kernels).

`allow_cpu_only` exists for the worker's CPU test mode (see `worker/process.py`): there a candidate
whose load_inline has only C++ sources is accepted so worker logic can be exercised without a GPU.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import re
import threading

from verifier_service import enums
from verifier_service.compile import sources

_PARSE_LOCK = threading.Lock()  # parse_python


@dataclasses.dataclass
class StaticReport:
  """What stage 1 found. `outcome` is None when the request may go on to compile."""
  outcome: str | None = None  # "REJECTED" or "BAD_REFERENCE" (proto Outcome names)
  stage: str = enums.STAGE_STATIC_CHECK
  message: str = ""
  extensions: list[sources.InlineExtension] = dataclasses.field(default_factory=list)
  kernel_names: list[str] = dataclasses.field(default_factory=list)
  launched_kernels: list[str] = dataclasses.field(default_factory=list)
  exploits: list[tuple[str, str]] = dataclasses.field(default_factory=list)

  @property
  def exported_functions(self) -> list[str]:
    return [f for ext in self.extensions for f, _ in (ext.functions or ())]


def _module_names(tree: ast.Module) -> dict[str, ast.AST]:
  """Top-level names bound by def, class, assignment or import."""
  names: dict[str, ast.AST] = {}
  for stmt in tree.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names[stmt.name] = stmt
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
      targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
      for target in targets:
        for node in ast.walk(target):
          if isinstance(node, ast.Name):
            names[node.id] = stmt
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
      for alias in stmt.names:
        names[(alias.asname or alias.name).split(".")[0]] = stmt
  return names


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
  """`ast.parse`, one at a time in this process and with the garbage collector paused. CPython
  3.11's AST constructor keeps one depth counter per interpreter: a parse in another thread, or
  one run by a finalizer during a collection, shifts it under a parse in progress, which then
  fails with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905).
  Seen in CI in a layout test's parse and (2026-12-04) in the program key's parse on a test
  server's thread, beside another server's in the same process; which of the two causes it was
  is not known, so both are excluded. Every parse of the service goes through here."""
  with _PARSE_LOCK:
    enabled = gc.isenabled()
    gc.disable()
    try:
      return ast.parse(source, filename=filename)
    finally:
      if enabled:
        gc.enable()


def _parse(source: str, what: str) -> tuple[ast.Module | None, str]:
  try:
    return parse_python(source, what), ""
  except SyntaxError as e:
    return None, f"{what} is not valid Python: line {e.lineno}: {e.msg}"
  except ValueError as e:  # e.g. NUL bytes
    return None, f"{what} is not valid Python: {e}"


def check_reference(reference: str) -> StaticReport | None:
  """BAD_REFERENCE report, or None when the reference defines what KernelBench needs."""
  tree, error = _parse(reference, "reference")
  if tree is None:
    return StaticReport(enums.BAD_REFERENCE, enums.STAGE_PARSE, error)
  names = _module_names(tree)
  missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
  if missing:
    return StaticReport(enums.BAD_REFERENCE, enums.STAGE_STATIC_CHECK,
                        f"reference does not define {', '.join(missing)}")
  return None


def _inherits_model(node: ast.AST, names: dict[str, ast.AST]) -> bool:
  """ModelNew's bases reach a class named Model (directly or through classes of this module)."""
  seen: set[str] = set()
  stack = [node]
  while stack:
    current = stack.pop()
    if not isinstance(current, ast.ClassDef) or current.name in seen:
      continue
    seen.add(current.name)
    for base in current.bases:
      if isinstance(base, ast.Name) and base.id == "Model":
        return True
      if isinstance(base, ast.Name) and base.id in names:
        stack.append(names[base.id])
  return False


def _reference_uses(tree: ast.Module, model_new: ast.AST) -> list[str]:
  """Uses of the reference inside ModelNew, or reaching for the reference's module anywhere."""
  found = []
  for node in ast.walk(model_new):
    if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
      found.append(f"ModelNew uses Model (line {node.lineno})")
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and node.value == "dice_reference" or (
        isinstance(node, ast.alias) and node.name.split(".")[0] == "dice_reference"):
      found.append(f"reaches for the reference module (line {getattr(node, 'lineno', '?')})")
  return found[:4]


_TORCH_ROOTS = ("torch", "nn", "F")
_GLUE_CALLS = frozenset("""
empty empty_like zeros zeros_like ones ones_like full full_like arange tensor as_tensor
from_numpy view reshape contiguous clone to cuda cpu float half double bfloat16 int long size
dim numel stride is_contiguous unsqueeze squeeze flatten permute transpose t expand cat stack
device dtype Size Tensor item detach chunk split narrow new_empty new_zeros
""".split())


_COMPUTE_METHODS = frozenset("""
relu matmul mm bmm addmm softmax log_softmax sum mean max min exp log sigmoid tanh conv1d conv2d
conv3d linear mul add sub div pow sqrt rsqrt norm clamp gelu silu einsum layer_norm batch_norm
group_norm argmax argmin cumsum prod var std abs neg sort topk
""".split())


def _call_name(func: ast.AST) -> str:
  try:
    return ast.unparse(func)
  except Exception:  # pylint: disable=broad-except
    return ""


def _falls_back(handler: ast.ExceptHandler) -> bool:
  return not (handler.body and isinstance(handler.body[-1], ast.Raise))


def _compute_call(call: ast.Call, torch_names: set[str]) -> str:
  """The torch/nn/reference call in `call` that computes values, or ""."""
  name = _call_name(call.func)
  root, _, last = name.partition(".")
  leaf = name.rsplit(".", 1)[-1]
  if root in torch_names and leaf not in _GLUE_CALLS:
    return name
  if isinstance(call.func, ast.Attribute) and leaf in _COMPUTE_METHODS:
    return name
  if name in ("Model", "super().forward") or leaf == "forward":
    return name
  return ""


def _try_fallbacks(tree: ast.Module, ext_names: set[str], torch_names: set[str]) -> list[str]:
  """try/except inside functions whose handler computes another way (TRY_EXCEPT_FALLBACK)."""
  found = []
  for func in ast.walk(tree):
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for node in ast.walk(func):
      if not isinstance(node, ast.Try):
        continue
      for handler in node.handlers:
        if not _falls_back(handler):
          continue
        computes = [c for s in handler.body for n in ast.walk(s) if isinstance(n, ast.Call)
                    for c in [_compute_call(n, torch_names)] if c]
        calls_ext = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (
            _call_name(n.func.value).rsplit(".", 1)[-1] in ext_names)
                        for s in node.body for n in ast.walk(s))
        if computes:
          found.append(f"line {handler.lineno}: except handler in {func.name}() computes with "
                       f"{', '.join(sorted(set(computes))[:3])}")
        elif calls_ext:
          found.append(f"line {handler.lineno}: {func.name}() catches a failure of its custom "
                       "op and carries on without it")
  return found[:4]


# Kernel runtimes other than the candidate's own load_inline CUDA: work done through them is not
# the candidate's kernel (and slips past the dispatcher, which only sees ATen ops).
_OTHER_RUNTIMES = frozenset({"triton", "cupy", "numba", "pycuda", "jax", "tensorflow", "tvm",
                             "taichi", "warp", "cuda", "cutlass"})


def _other_runtimes(tree: ast.Module) -> list[str]:
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names if a.name.split(".")[0] in _OTHER_RUNTIMES]
    elif isinstance(node, ast.ImportFrom) and node.module and (
        node.module.split(".")[0] in _OTHER_RUNTIMES) and node.level == 0:
      found.append(node.module)
    elif isinstance(node, ast.Call) and _call_name(node.func) in ("torch.compile",
                                                                   "torch.jit.script"):
      found.append(_call_name(node.func))
  return found


def _names_bound_to(tree: ast.Module, predicate) -> set[str]:
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and predicate(node.value):
      for target in node.targets:
        if isinstance(target, ast.Name):
          names.add(target.id)
        elif isinstance(target, ast.Attribute):
          names.add(target.attr)
  return names


def _torch_names(tree: ast.Module) -> set[str]:
  names = set(_TORCH_ROOTS)
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      module = getattr(node, "module", None) or ""
      for alias in node.names:
        full = f"{module}.{alias.name}" if module else alias.name
        if full.split(".")[0] == "torch":
          names.add((alias.asname or alias.name).split(".")[0])
  return names


# Namespaces torch owns (a candidate's own ops live in a namespace it defines: TORCH_LIBRARY(ns)).
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized", "mkldnn",
                               "cudnn", "c10d", "_c10d_functional", "torchvision", "_",
                               "profiler", "inductor", "higher_order", "debugprims", "rngprims"})
_REGISTERING_CALL = re.compile(r"(library|Library|impl|register|define|fallback|_dispatch)")
_CPP_DEFINES = re.compile(r"\bTORCH_LIBRARY\s*\(\s*(\w+)")
_CPP_EXTENDS = re.compile(r"\b(TORCH_LIBRARY_IMPL|TORCH_LIBRARY_FRAGMENT)\s*\(\s*(\w+)")
_CPP_RAW = re.compile(r"\b(torch::Library\s*\(|torch::Library\s+\w+\s*\(|Library::(IMPL|FRAGMENT)|"
                      r"registerImpl|registerFallback|RegisterOperators|TORCH_LIBRARY_\w*_INIT|"
                      r"Dispatcher::singleton)")


def _torch_namespace(text: str) -> bool:
  return text.split("::")[0].split(".")[0] in _TORCH_NAMESPACES


def dispatch_overrides(tree: ast.Module, extensions: list[sources.InlineExtension]) -> list[str]:
  """Registrations of kernels for torch's operators, in the Python and in the C++ sources."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr.startswith(("_dispatch_", "py_impl")):
      found.append(f"line {node.lineno}: uses the dispatcher's private API ({node.attr})")
    elif isinstance(node, ast.Call) and _REGISTERING_CALL.search(_call_name(node.func)):
      names = [a.value for a in [*node.args, *(k.value for k in node.keywords)]
               if isinstance(a, ast.Constant) and isinstance(a.value, str)]
      hits = [n for n in names if _torch_namespace(n)]
      if hits:
        found.append(f"line {node.lineno}: {_call_name(node.func)}({hits[0]!r}, ...) registers "
                     "for an operator torch owns")
  for ext in extensions:
    code = "\n".join(ext.cpp_sources + ext.cuda_sources)
    own = set(_CPP_DEFINES.findall(code)) - _TORCH_NAMESPACES
    for match in _CPP_EXTENDS.finditer(code):
      if match.group(2) not in own:
        found.append(f"{match.group(1)}({match.group(2)}, ...) in the C++ sources: kernels for "
                     "a namespace the candidate did not define")
    for match in _CPP_RAW.finditer(code):
      found.append(f"{match.group(1)} in the C++ sources: registers with the dispatcher directly")
  return found[:4]


def check_candidate(candidate: str, allow_cpu_only: bool = False) -> StaticReport:
  """Parses the candidate, resolves its load_inline calls and lists its kernels."""
  tree, error = _parse(candidate, "candidate")
  if tree is None:
    return StaticReport(enums.REJECTED, enums.STAGE_PARSE, error)
  names = _module_names(tree)
  if "ModelNew" not in names:
    return StaticReport(enums.REJECTED, message="candidate does not define ModelNew")
  if _inherits_model(names["ModelNew"], names):
    return StaticReport(enums.REJECTED, message="ModelNew subclasses the reference Model",
                        exploits=[(enums.INHERITS_REFERENCE, "class ModelNew(Model)")])
  uses = _reference_uses(tree, names["ModelNew"])
  if uses:
    return StaticReport(enums.REJECTED, message=f"candidate uses the reference: {uses[0]}",
                        exploits=[(enums.INHERITS_REFERENCE, u) for u in uses])
  runtimes = _other_runtimes(tree)
  if runtimes:
    return StaticReport(enums.REJECTED,
                        message=f"candidate computes through another kernel runtime: "
                        f"{', '.join(runtimes[:3])}; its work must be its own load_inline CUDA",
                        exploits=[(enums.TORCH_FALLBACK, f"uses {r}") for r in runtimes[:3]])
  ext_names = _names_bound_to(tree, lambda v: isinstance(v, ast.Call) and _call_name(
      v.func).rsplit(".", 1)[-1] in sources.load_inline_aliases(tree))
  fallbacks = _try_fallbacks(tree, ext_names, _torch_names(tree))
  if fallbacks:
    return StaticReport(enums.REJECTED, message=f"try/except fallback: {fallbacks[0]}",
                        exploits=[(enums.TRY_EXCEPT_FALLBACK, f) for f in fallbacks])
  calls = sources.find_load_inline_calls(tree)
  if not calls:
    return StaticReport(enums.REJECTED,
                        message="candidate never calls load_inline: no custom kernel")
  for call in calls:
    if call.extension is None:
      return StaticReport(
          enums.REJECTED, message=f"load_inline call on line {call.lineno} cannot be resolved "
          f"without running the candidate ({call.error}); pass literal strings")
  extensions = [c.extension for c in calls]
  overrides = dispatch_overrides(tree, extensions)
  if overrides:
    return StaticReport(enums.REJECTED, message=f"re-registers torch operators: {overrides[0]}",
                        exploits=[(enums.DISPATCH_OVERRIDE, o) for o in overrides])
  report = StaticReport(extensions=extensions)
  for ext in extensions:
    for code in ext.cuda_sources:
      kernels = sources.global_kernels(code)
      report.kernel_names += [k for k in kernels if k not in report.kernel_names]
      report.launched_kernels += [k for k in sources.launched_kernels(code, kernels)
                                  if k not in report.launched_kernels]
  has_cuda = any(ext.cuda_sources for ext in extensions)
  if not has_cuda:
    if allow_cpu_only:
      return report
    report.outcome = enums.REJECTED
    report.message = "load_inline has no cuda_sources: no CUDA kernel to verify"
  elif not report.kernel_names:
    report.outcome = enums.REJECTED
    report.message = "cuda_sources define no __global__ kernel"
    report.exploits.append((enums.NO_CUSTOM_KERNEL_LAUNCHED,
                            "no __global__ function in cuda_sources"))
  elif not report.launched_kernels:
    report.outcome = enums.REJECTED
    report.message = (f"__global__ kernels {', '.join(report.kernel_names)} are never launched "
                      "(no <<<...>>> or cudaLaunchKernel)")
    report.exploits.append((enums.NO_CUSTOM_KERNEL_LAUNCHED,
                            "defined but never launched: " + ", ".join(report.kernel_names)))
  return report


def check_sources(reference: str, candidate: str, allow_cpu_only: bool = False) -> StaticReport:
  """Stage 1 for one request: the reference first (its failure is not the candidate's)."""
  return check_reference(reference) or check_candidate(candidate, allow_cpu_only)
