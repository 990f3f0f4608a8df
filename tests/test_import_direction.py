"""Imports point down the layers of ARCHITECTURE.md ("Layers"); these tables are the ones that count.

Every module of dice_jax and of verifier_service is parsed (ast, so function-level and
TYPE_CHECKING imports count too) and each import of its own package is checked: a module may
import its own layer or one below it, never one above; and the units of one layer must not import
each other in a circle (so a same-layer import goes one way, e.g. generation -> eval, never back).
A module belongs to the unit named by the longest entry of its package's table that is a prefix of
its dotted name. Neither package imports the other: they meet only in the proto.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Top to bottom. A unit is a package or a module; the most specific entry wins.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("command line", ("dice_jax.cli", "dice_jax")),
    ("runs: training loops, evaluation, generation",
     ("dice_jax.rl", "dice_jax.train.sft_loop", "dice_jax.eval", "dice_jax.generation")),
    ("algorithms: RL update and estimators, losses, sampler, train step",
     ("dice_jax.rl.advantages", "dice_jax.rl.batch", "dice_jax.rl.logprobs", "dice_jax.rl.loss",
      "dice_jax.rl.scoring", "dice_jax.rl.update", "dice_jax.diffusion", "dice_jax.sampler", "dice_jax.train")),
    ("model, rewards, data, verifier client, run services",
     ("dice_jax.model", "dice_jax.rewards", "dice_jax.data", "dice_jax.verifier", "dice_jax.checkpoints",
      "dice_jax.metrics_log", "dice_jax.distributed")),
    ("foundation: sharding, config loading, tokenizer",
     ("dice_jax.sharding", "dice_jax.config", "dice_jax.lazy", "dice_jax.model.tokenizer")),
)
# The verifier: the worker process forks and serves both sides of the trust boundary, so it sits
# above both; run/ holds only what both sides share, below them.
VERIFIER_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("command line", ("verifier_service.cli",)),
    ("service: gRPC server, scheduler, worker pool, verdict store", ("verifier_service.service",)),
    ("worker: forks each job's two processes, serves them, merges their reports",
     ("verifier_service.worker",)),
    ("the two sides of the trust boundary", ("verifier_service.trusted", "verifier_service.untrusted")),
    ("what both sides share (job, wire, sandbox, inputs, timing), and the compile stage",
     ("verifier_service.run", "verifier_service.compile")),
    ("foundation: enum names, single flight, the package's version",
     ("verifier_service.enums", "verifier_service.singleflight", "verifier_service")),
)
# Units of one layer that must not import each other in either direction: what judges a candidate
# must not be what runs beside it.
APART = (frozenset({"verifier_service.trusted", "verifier_service.untrusted"}),)

TABLES = {"dice_jax": LAYERS, "verifier_service": VERIFIER_LAYERS}
_UNITS = {unit: depth for table in TABLES.values() for depth, (_, units) in enumerate(table)
          for unit in units}


def _layer(unit: str) -> str:
  return TABLES[unit.split(".")[0]][_UNITS[unit]][0]


def unit_of(module: str) -> str:
  """The table entry that owns `module` (its longest prefix, on dotted boundaries)."""
  parts = module.split(".")
  for n in range(len(parts), 0, -1):
    name = ".".join(parts[:n])
    if name in _UNITS:
      return name
  raise AssertionError(f"{module} is in no layer: add it to its package's table in "
                       f"tests/test_import_direction.py (and to ARCHITECTURE.md)")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
  if not node.level:
    return node.module or ""
  base = module.split(".") if is_package else module.split(".")[:-1]
  base = base[:len(base) - node.level + 1]
  return ".".join(base + ([node.module] if node.module else []))


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
  """(line, imported dice_jax or verifier_service module) for every import statement of
  `source`, nested ones too."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      target = _resolve(module, is_package, node)
      for alias in node.names:  # `from dice_jax import sharding`: a module, if there is one
        candidate = f"{target}.{alias.name}"
        is_module = (ROOT / pathlib.Path(*candidate.split("."))).with_suffix(".py").is_file() or (
            ROOT / pathlib.Path(*candidate.split("."))).is_dir()
        found.append((node.lineno, candidate if is_module else target))
  return [(line, name) for line, name in found if name.split(".")[0] in TABLES]


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
  return imports_in(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")


def _paths() -> list[pathlib.Path]:
  return sorted(path for package in TABLES for path in (ROOT / package).rglob("*.py"))


def _all_imports() -> list[tuple[str, int, str]]:
  out = []
  for path in _paths():
    out += [(_module_name(path), line, target) for line, target in imports_of(path)]
  return out


def upward_imports(imports: list[tuple[str, int, str]]) -> list[str]:
  """Each import of a higher layer (or of the other package), named with both layers."""
  upward = []
  for module, line, target in imports:
    if module.split(".")[0] != target.split(".")[0]:
      upward.append(f"{module}:{line} imports {target}: the packages meet only in the proto")
      continue
    here, there = unit_of(module), unit_of(target)
    if _UNITS[there] < _UNITS[here]:
      upward.append(f"{module}:{line} imports {target} ({_layer(there)}), above {_layer(here)}")
    elif frozenset({here, there}) in APART:
      upward.append(f"{module}:{line} imports {target}: {here} and {there} must stay apart")
  return upward


def test_every_module_has_a_layer():
  """Named by an entry of its own: a new module or package does not fall to its package's front."""
  for path in _paths():
    module = _module_name(path)
    assert unit_of(module) != module.split(".")[0] or module in TABLES, (
        f"{module} has no entry of its own: add it to its package's table (and to ARCHITECTURE.md)")


def test_no_module_imports_a_layer_above_its_own():
  assert len(_paths()) > 150
  upward = upward_imports(_all_imports())
  assert not upward, "\n".join(upward)


def test_units_of_a_layer_import_each_other_one_way():
  edges: dict[str, set[str]] = {}
  for module, _, target in _all_imports():
    if module.split(".")[0] != target.split(".")[0]:
      continue  # the test above names those
    here, there = unit_of(module), unit_of(target)
    if here != there and _UNITS[here] == _UNITS[there]:
      edges.setdefault(here, set()).add(there)

  def reaches(start: str, goal: str, seen: set[str]) -> bool:
    for nxt in edges.get(start, ()):
      if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
        return True
    return False

  circles = sorted(f"{a} <-> {b}" for a, targets in edges.items() for b in targets if reaches(b, a, {b}))
  assert not circles, circles


@pytest.mark.parametrize("source, bad", [
    ("def f():\n  from dice_jax.cli import train\n", "dice_jax.cli.train"),  # hidden in a function
    ("from dice_jax import cli\n", "dice_jax.cli"),
    ("from ..cli import train\n", "dice_jax.cli.train"),
    ("import dice_jax.cli.main as m\n", "dice_jax.cli.main"),
])
def test_the_check_sees_every_form_of_import(source, bad):
  probe = "dice_jax.model.probe"
  assert [target for _, target in imports_in(source, probe)] == [bad]
  assert _UNITS[unit_of(bad)] < _UNITS[unit_of(probe)]  # so the test above would name it


@pytest.mark.parametrize("module, source, why", [
    ("verifier_service.run.pair", "from verifier_service.trusted import judge\n", "above"),
    ("verifier_service.trusted.verdict", "from verifier_service.untrusted import child\n", "apart"),
    ("verifier_service.untrusted.child", "from verifier_service.trusted import judge\n", "apart"),
    ("verifier_service.run.job", "from dice_jax import config\n", "packages"),
    ("dice_jax.verifier.client", "import verifier_service.enums\n", "packages"),
])
def test_the_verifier_table_refuses_what_would_cross_the_boundary(module, source, why):
  imports = [(module, line, target) for line, target in imports_in(source, module)]
  found = upward_imports(imports)
  assert len(found) == 1 and {"above": "above", "apart": "stay apart",
                              "packages": "meet only in the proto"}[why] in found[0], found
