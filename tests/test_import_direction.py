"""Imports point down the layers of ARCHITECTURE.md ("Layers"); this table is the one that counts.

Every module of dice_jax is parsed (ast, so function-level and TYPE_CHECKING imports count too)
and each `dice_jax...` import is checked: a module may import its own layer or one below it,
never one above; and the units of one layer must not import each other in a circle (so a
same-layer import goes one way, e.g. generation -> eval, never back). A module belongs to the
unit named by the longest entry of LAYERS that is a prefix of its dotted name.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dice_jax"

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
_UNITS = {unit: depth for depth, (_, units) in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
  """The LAYERS entry that owns `module` (its longest prefix, on dotted boundaries)."""
  parts = module.split(".")
  for n in range(len(parts), 0, -1):
    name = ".".join(parts[:n])
    if name in _UNITS:
      return name
  raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to ARCHITECTURE.md)")


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
  """(line, imported dice_jax module) for every import statement of `source`, nested ones too."""
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
  return [(line, name) for line, name in found if name == "dice_jax" or name.startswith("dice_jax.")]


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
  return imports_in(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py")


def _all_imports() -> list[tuple[str, int, str]]:
  out = []
  for path in sorted(PACKAGE.rglob("*.py")):
    out += [(_module_name(path), line, target) for line, target in imports_of(path)]
  return out


def test_every_module_has_a_layer():
  for path in PACKAGE.rglob("*.py"):
    unit_of(_module_name(path))


def test_no_module_imports_a_layer_above_its_own():
  upward = []
  for module, line, target in _all_imports():
    here, there = unit_of(module), unit_of(target)
    if _UNITS[there] < _UNITS[here]:
      upward.append(f"{module}:{line} imports {target} ({LAYERS[_UNITS[there]][0]}), above "
                    f"{LAYERS[_UNITS[here]][0]}")
  assert not upward, "\n".join(upward)


def test_units_of_a_layer_import_each_other_one_way():
  edges: dict[str, set[str]] = {}
  for module, _, target in _all_imports():
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
