"""Static checks (stage 1): milliseconds of `ast` work that refuse hopeless requests early.

A reference that cannot be used is BAD_REFERENCE (not the candidate's fault). A candidate is
REJECTED, with one clear reason, when it is not Python, defines no `ModelNew`, subclasses the
reference `Model`, never calls `load_inline`, passes it arguments we cannot resolve without running
it, or compiles no CUDA `__global__` kernel that is launched anywhere (decoy kernels).

`allow_cpu_only` exists for the worker's CPU test mode (see `worker.py`): there a candidate whose
load_inline has only C++ sources is accepted so worker logic can be exercised without a GPU.
"""

from __future__ import annotations

import ast
import dataclasses

from verifier_service import sources


@dataclasses.dataclass
class StaticReport:
  """What stage 1 found. `outcome` is None when the request may go on to compile."""
  outcome: str | None = None  # "REJECTED" or "BAD_REFERENCE" (proto Outcome names)
  stage: str = "STAGE_STATIC_CHECK"
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


def _parse(source: str, what: str) -> tuple[ast.Module | None, str]:
  try:
    return ast.parse(source, filename=what), ""
  except SyntaxError as e:
    return None, f"{what} is not valid Python: line {e.lineno}: {e.msg}"
  except ValueError as e:  # e.g. NUL bytes
    return None, f"{what} is not valid Python: {e}"


def check_reference(reference: str) -> StaticReport | None:
  """BAD_REFERENCE report, or None when the reference defines what KernelBench needs."""
  tree, error = _parse(reference, "reference")
  if tree is None:
    return StaticReport("BAD_REFERENCE", "STAGE_PARSE", error)
  names = _module_names(tree)
  missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
  if missing:
    return StaticReport("BAD_REFERENCE", "STAGE_STATIC_CHECK",
                        f"reference does not define {', '.join(missing)}")
  return None


def _inherits_model(node: ast.AST) -> bool:
  if not isinstance(node, ast.ClassDef):
    return False
  return any(isinstance(b, ast.Name) and b.id == "Model" for b in node.bases)


def check_candidate(candidate: str, allow_cpu_only: bool = False) -> StaticReport:
  """Parses the candidate, resolves its load_inline calls and lists its kernels."""
  tree, error = _parse(candidate, "candidate")
  if tree is None:
    return StaticReport("REJECTED", "STAGE_PARSE", error)
  names = _module_names(tree)
  if "ModelNew" not in names:
    return StaticReport("REJECTED", message="candidate does not define ModelNew")
  if _inherits_model(names["ModelNew"]):
    return StaticReport("REJECTED", message="ModelNew subclasses the reference Model",
                        exploits=[("INHERITS_REFERENCE", "class ModelNew(Model)")])
  calls = sources.find_load_inline_calls(tree)
  if not calls:
    return StaticReport("REJECTED", message="candidate never calls load_inline: no custom kernel")
  for call in calls:
    if call.extension is None:
      return StaticReport(
          "REJECTED", message=f"load_inline call on line {call.lineno} cannot be resolved "
          f"without running the candidate ({call.error}); pass literal strings")
  extensions = [c.extension for c in calls]
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
    report.outcome = "REJECTED"
    report.message = "load_inline has no cuda_sources: no CUDA kernel to verify"
  elif not report.kernel_names:
    report.outcome = "REJECTED"
    report.message = "cuda_sources define no __global__ kernel"
    report.exploits.append(("NO_CUSTOM_KERNEL_LAUNCHED", "no __global__ function in cuda_sources"))
  elif not report.launched_kernels:
    report.outcome = "REJECTED"
    report.message = (f"__global__ kernels {', '.join(report.kernel_names)} are never launched "
                      "(no <<<...>>> or cudaLaunchKernel)")
    report.exploits.append(("NO_CUSTOM_KERNEL_LAUNCHED",
                            "defined but never launched: " + ", ".join(report.kernel_names)))
  return report


def check_sources(reference: str, candidate: str, allow_cpu_only: bool = False) -> StaticReport:
  """Stage 1 for one request: the reference first (its failure is not the candidate's)."""
  return check_reference(reference) or check_candidate(candidate, allow_cpu_only)
