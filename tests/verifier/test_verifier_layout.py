"""The package layout holds together without a GPU: every module imports, every import of a
verifier_service module (also those inside functions that only run on a GPU or in a forked job
child) names something that exists, and so does every `module.name` read through such an import.

Why: much of verifier_service runs only on a GPU (the judge's and the candidate's CUDA setup,
timing, kernel profiling) or only in a job child after fork, where CI never goes. A file moved or
a name renamed would surface there first, as INFRA_ERROR on the GPU box; these checks surface it
here. The same holds for `pb.NAME` reads of the proto module (an enum value spelled wrong).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import verifier_service
from verifier_service.compile import checks

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO = "dice.verifier.v1.verifier_pb2"
# Files whose code reaches verifier_service: the package, its benchmarks and its tests.
SCANNED = sorted([*(ROOT / "verifier_service").rglob("*.py"),
                  *(ROOT / "benchmarks").glob("verifier_*.py"),
                  *(ROOT / "tests" / "verifier").glob("*.py"),
                  *(ROOT / "tests" / "adversarial").glob("*.py")])


def _modules() -> list[str]:
  return sorted(m.name for m in pkgutil.walk_packages(verifier_service.__path__, "verifier_service."))


def test_every_module_imports():
  """In a fresh interpreter, so that nothing imported by earlier tests hides a missing import."""
  modules = _modules()
  assert {"verifier_service.cli", "verifier_service.worker.process", "verifier_service.trusted.judge",
          "verifier_service.untrusted.child", "verifier_service.compile.compiler",
          "verifier_service.service.server"} <= set(modules)
  code = "import importlib, sys\nfor name in sys.argv[1:]:\n  importlib.import_module(name)\n"
  proc = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]


def _is_module(name: str) -> bool:
  try:
    importlib.import_module(name)
    return True
  except ImportError:
    return False


class _Reads(ast.NodeVisitor):
  """Imports of verifier_service (and proto) modules, anywhere in a file, and the attributes read
  through the names they bind, skipping functions where a local of the same name shadows one."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.bound: dict[str, str] = {}  # local name -> module
    self.imports: list[tuple[int, str, str]] = []  # (line, module, name)
    self.reads: list[tuple[int, str, str]] = []  # (line, module, attribute)
    self._shadowed: list[set[str]] = [set()]

  def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
    module = node.module or ""
    if module.split(".")[0] == "verifier_service" or module == PROTO.rsplit(".", 1)[0]:
      for alias in node.names:
        self.imports.append((node.lineno, module, alias.name))
        full = f"{module}.{alias.name}"
        if _is_module(full):
          self.bound[alias.asname or alias.name] = full

  def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
    local = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                             *filter(None, [node.args.vararg, node.args.kwarg])]}
    body = node.body if isinstance(node.body, list) else [node.body]
    for statement in body:
      for sub in ast.walk(statement):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
          local.add(sub.id)
    self._shadowed.append(local)
    self.generic_visit(node)
    self._shadowed.pop()

  visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

  def visit_Attribute(self, node: ast.Attribute) -> None:
    if (isinstance(node.value, ast.Name) and node.value.id in self.bound
        and not any(node.value.id in scope for scope in self._shadowed)):
      self.reads.append((node.lineno, self.bound[node.value.id], node.attr))
    self.generic_visit(node)


def _scan(path: pathlib.Path) -> _Reads:
  reads = _Reads(path)
  reads.visit(checks.parse_python(path.read_text(), str(path)))
  return reads


@pytest.fixture(scope="module")
def scans() -> list[_Reads]:
  assert len(SCANNED) > 60, len(SCANNED)
  return [_scan(path) for path in SCANNED]


def test_every_import_of_the_package_resolves(scans):
  missing = []
  for scan in scans:
    for line, module, name in scan.imports:
      if not (_is_module(f"{module}.{name}") or hasattr(importlib.import_module(module), name)):
        missing.append(f"{scan.path.relative_to(ROOT)}:{line}: from {module} import {name}")
  assert not missing, missing
  assert sum(len(scan.imports) for scan in scans) > 150


def test_every_module_attribute_read_resolves(scans):
  missing, checked = [], 0
  for scan in scans:
    for line, module, attribute in scan.reads:
      checked += 1
      if not hasattr(importlib.import_module(module), attribute):
        missing.append(f"{scan.path.relative_to(ROOT)}:{line}: {module}.{attribute}")
  assert not missing, missing
  assert checked > 600, checked


def test_the_scan_sees_a_wrong_name(tmp_path):
  """The checks above can fail: a misspelt enum and a moved module are reported."""
  bad = tmp_path / "bad.py"
  bad.write_text("from dice.verifier.v1 import verifier_pb2 as pb\n"
                 "from verifier_service.run import wire\n"
                 "def f(wire_):\n  return pb.STAGE_COMPILED, wire.Channel, pb.OK\n"
                 "def g():\n  from verifier_service import wire\n")
  scan = _scan(bad)
  assert (4, PROTO, "STAGE_COMPILED") in scan.reads
  assert not hasattr(importlib.import_module(PROTO), "STAGE_COMPILED")
  assert ("verifier_service", "wire") in [(m, n) for _, m, n in scan.imports]
  assert not _is_module("verifier_service.wire")


# ----------------------------------------------------------------------------- enum names


def _enum_literals(path: pathlib.Path) -> list[tuple[int, str]]:
  """String constants in `path` that spell a proto enum value name (docstrings aside)."""
  names = {n for e in ("Outcome", "Stage", "Exploit", "Precision", "Policy")
           for n in getattr(importlib.import_module(PROTO), e).keys()}
  tree = checks.parse_python(path.read_text(), str(path))
  docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)) and node.body and isinstance(node.body[0], ast.Expr)}
  return [(node.lineno, node.value) for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and node.value in names and id(node) not in docstrings]


def test_enum_names_are_constants_not_literals(tmp_path):
  """Outcomes, stages, exploit kinds, precisions and policies are written `enums.X` (whose reads
  the scan above resolves), so a misspelt one fails in CI rather than as INFRA_ERROR."""
  package = ROOT / "verifier_service"
  literals = [f"{path.relative_to(ROOT)}:{line}: {value!r}"
              for path in sorted(package.rglob("*.py")) if path.name != "enums.py"
              for line, value in _enum_literals(path)]
  assert not literals, literals
  bad = tmp_path / "bad.py"
  bad.write_text('"""OK"""\nx = {"outcome": "INFRA_ERROR"}\n')
  assert _enum_literals(bad) == [(2, "INFRA_ERROR")]


def test_enums_refuse_to_import_out_of_step_with_the_proto():
  from verifier_service import enums  # pylint: disable=import-outside-toplevel
  outcome = importlib.import_module(PROTO).Outcome
  enums._check(enums.OUTCOMES, outcome, "OUTCOME_UNSPECIFIED")  # pylint: disable=protected-access
  with pytest.raises(ImportError, match=r"missing \['OK'\], unknown \['OKAY'\]"):
    enums._check(enums.OUTCOMES - {"OK"} | {"OKAY"}, outcome,  # pylint: disable=protected-access
                 "OUTCOME_UNSPECIFIED")
