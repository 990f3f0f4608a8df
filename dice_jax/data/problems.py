"""Problems in KernelBench format (ARCHITECTURE.md, "Kernel format") and loaders for their files.

A `Problem` is a PyTorch reference (`Model`, `get_inputs`, `get_init_inputs`). Phase-1 items also
carry a known-good candidate split into `prefix` (imports), `middle` (the CUDA string assignment
`source = '''...'''`) and `suffix` (`cpp_src`, `load_inline`, a fixed `ModelNew`); the trainer
asks the model for the middle only and grades `prefix + middle + suffix`.

Formats read (`load_problems` picks one from the path):
- DICE infilling JSON (`kernel_infilling_evaluation.json`): a list of
  `{id, pytorch_code, cuda_code, prefix, middle, suffix}`;
- DICE end-to-end JSON (`end_to_end_kernel_generation_4000.json`): a list of
  `{idx, level, pytorch_code, ...}`;
- JSONL with one such object per line (either kind, mixed);
- a KernelBench directory `levelN/<id>_<name>.py`; the id is the file stem;
- the bundled sets shipped inside dice_jax (`bundled:tiny`);
- synthetic problems generated on the fly (`synthetic:all?split=train`; see dice_jax.data.synthetic).

Any file or directory path may end in `?split=train` or `?split=heldout` (optionally
`&heldout_fraction=F`, default 1/3): a deterministic part of its items, chosen by a hash of each
item's id, so an item's side never changes when the file grows and the two sides never overlap.
This is how a phase-1 recipe trains on part of DICE's 99 infilling *evaluation* items and is
evaluated on the rest (`kernel_infilling_evaluation.json?split=train` / `?split=heldout`).

A relative file or directory path that does not exist where the command runs is looked up under the
data directory, $DICE_DATA_DIR (dice_jax.data.data_dir); a path found in neither is one error that
names both places and the setting.

Every error is a `ProblemLoadError` naming the file and the item, so a typo in a 4,000-item file
is found without a debugger. Loading never executes the reference (that needs torch; the verifier
does it).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.resources
import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from dice_jax.data import data_dir, synthetic

BUNDLED_PREFIX = "bundled:"
SYNTHETIC_PREFIX = synthetic.PREFIX
FILE_SPLITS = ("train", "heldout")
DEFAULT_HELDOUT_FRACTION = 1 / 3
_LEVEL_DIR = re.compile(r"^level(\d+)$")
_BUNDLED_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProblemLoadError(ValueError):
  """A problem file is missing or malformed; the message names the file and the item."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """One RL/eval problem. Phase-1 fields are None for reference-only (phase-2) problems."""

  id: str
  reference_source: str
  level: int | None = None
  prefix: str | None = None
  middle: str | None = None
  suffix: str | None = None
  # Where it came from ("path#item"), for error messages and reports.
  origin: str = ""

  @property
  def has_scaffold(self) -> bool:
    """True when the problem can be used for phase-1 infilling."""
    return self.prefix is not None and self.middle is not None and self.suffix is not None

  @property
  def known_good(self) -> str | None:
    """The complete known-good candidate (prefix + middle + suffix), when there is one."""
    if not self.has_scaffold:
      return None
    return self.prefix + self.middle + self.suffix


def check_reference(source: str, where: str) -> None:
  """Raises ProblemLoadError unless `source` parses and defines Model, get_inputs, get_init_inputs.

  Only a parse: the reference is never executed here.
  """
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError) as e:
    raise ProblemLoadError(f"{where}: reference does not parse as Python: {e}") from None
  defined = {node.name for node in tree.body
             if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
  missing = [name for name in _REQUIRED_NAMES if name not in defined]
  if missing:
    raise ProblemLoadError(
        f"{where}: reference must define {', '.join(_REQUIRED_NAMES)} at top level; "
        f"missing {', '.join(missing)}")


def _text(record: Mapping[str, Any], key: str, where: str, *, allow_empty: bool = False) -> str:
  if key not in record:
    raise ProblemLoadError(f"{where}: missing field {key!r} (fields present: {sorted(record)})")
  value = record[key]
  if not isinstance(value, str):
    raise ProblemLoadError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
  if not allow_empty and not value.strip():
    raise ProblemLoadError(f"{where}: field {key!r} is empty")
  return value


def _level(value: Any, where: str) -> int | None:
  if value is None or value == "":
    return None
  try:
    level = int(value)
  except (TypeError, ValueError):
    raise ProblemLoadError(f"{where}: field 'level' must be an integer, got {value!r}") from None
  if level < 0:
    raise ProblemLoadError(f"{where}: field 'level' must be >= 0, got {level}")
  return level


def problem_from_record(record: Any, where: str, *, validate: bool = True) -> Problem:
  """One problem from a DICE-format object: infilling (`id` + prefix/middle/suffix) or `idx`.

  An object with any of prefix/middle/suffix must have all three, and when it also has a non-empty
  `cuda_code` the three must concatenate to it (DICE's own invariant), so a split that lost text
  is caught at load time rather than graded wrong.
  """
  if not isinstance(record, Mapping):
    raise ProblemLoadError(f"{where}: expected a JSON object, got {type(record).__name__}")
  key = "id" if "id" in record else "idx"
  if key not in record:
    raise ProblemLoadError(f"{where}: missing field 'id' (or 'idx'); fields present: {sorted(record)}")
  raw_id = record[key]
  if isinstance(raw_id, bool) or not isinstance(raw_id, (int, str)) or str(raw_id).strip() == "":
    raise ProblemLoadError(f"{where}: field {key!r} must be a non-empty string or integer, got {raw_id!r}")
  problem_id = str(raw_id).strip()
  where = f"{where} (id {problem_id})"
  reference = _text(record, "pytorch_code", where)
  if validate:
    check_reference(reference, where)
  scaffold = [k for k in ("prefix", "middle", "suffix") if k in record]
  prefix = middle = suffix = None
  if scaffold:
    if len(scaffold) != 3:
      missing = sorted({"prefix", "middle", "suffix"} - set(scaffold))
      raise ProblemLoadError(f"{where}: has {scaffold} but not {missing}; a phase-1 item needs all three")
    prefix = _text(record, "prefix", where, allow_empty=True)
    middle = _text(record, "middle", where)
    suffix = _text(record, "suffix", where)
    cuda_code = record.get("cuda_code") or ""
    if isinstance(cuda_code, str) and cuda_code and prefix + middle + suffix != cuda_code:
      raise ProblemLoadError(f"{where}: prefix + middle + suffix != cuda_code; the split is inconsistent")
  return Problem(id=problem_id, reference_source=reference, level=_level(record.get("level"), where),
                 prefix=prefix, middle=middle, suffix=suffix, origin=where)


def _check_unique(problems: Sequence[Problem], where: str) -> list[Problem]:
  seen: dict[str, str] = {}
  for p in problems:
    if p.id in seen:
      raise ProblemLoadError(f"{where}: duplicate problem id {p.id!r} ({seen[p.id]} and {p.origin})")
    seen[p.id] = p.origin
  return list(problems)


def _records_to_problems(records: Any, path: str, validate: bool) -> list[Problem]:
  if not isinstance(records, list):
    raise ProblemLoadError(f"{path}: expected a list of problem objects, got {type(records).__name__}")
  if not records:
    raise ProblemLoadError(f"{path}: contains no problems")
  problems = [problem_from_record(r, f"{path} item {i}", validate=validate) for i, r in enumerate(records)]
  return _check_unique(problems, path)


def _read_text(path: pathlib.Path) -> str:
  if not path.is_file():
    raise ProblemLoadError(f"{path}: no such file")
  try:
    return path.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise ProblemLoadError(f"{path}: not UTF-8 text ({e})") from None


def load_json(path: str | os.PathLike[str], *, validate: bool = True) -> list[Problem]:
  """A DICE JSON file: a list of infilling (`id`, prefix/middle/suffix) or end-to-end (`idx`) items."""
  path = pathlib.Path(path)
  text = _read_text(path)
  try:
    records = json.loads(text)
  except json.JSONDecodeError as e:
    raise ProblemLoadError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
  return _records_to_problems(records, str(path), validate)


def load_jsonl(path: str | os.PathLike[str], *, validate: bool = True) -> list[Problem]:
  """JSONL: one DICE-format object per line; blank lines are skipped."""
  path = pathlib.Path(path)
  records, where = [], str(path)
  for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
    if not line.strip():
      continue
    try:
      records.append((lineno, json.loads(line)))
    except json.JSONDecodeError as e:
      raise ProblemLoadError(f"{path} line {lineno}: invalid JSON at column {e.colno}: {e.msg}") from None
  if not records:
    raise ProblemLoadError(f"{path}: contains no problems")
  problems = [problem_from_record(r, f"{where} line {n}", validate=validate) for n, r in records]
  return _check_unique(problems, where)


def load_kernelbench_dir(path: str | os.PathLike[str], *, validate: bool = True) -> list[Problem]:
  """A KernelBench tree: `levelN/<id>_<name>.py`, id = file stem, level = N; sorted by level, id.

  Stems are unique across levels in KernelBench only by their number *within* a level, so the id
  is the stem as-is; ids that collide across levels are an error (the id names eval outputs).
  """
  root = pathlib.Path(path)
  if not root.is_dir():
    raise ProblemLoadError(f"{root}: no such directory")
  levels = sorted((int(m.group(1)), d) for d in root.iterdir()
                  if d.is_dir() and (m := _LEVEL_DIR.match(d.name)))
  if not levels:
    raise ProblemLoadError(f"{root}: no levelN/ subdirectories "
                           "(expected the KernelBench layout levelN/<id>_<name>.py)")
  problems = []
  for level, level_dir in levels:
    files = sorted(level_dir.glob("*.py"), key=lambda f: _stem_order(f.stem))
    for file in files:
      where = str(file)
      reference = _read_text(file)
      if not reference.strip():
        raise ProblemLoadError(f"{where}: file is empty")
      if validate:
        check_reference(reference, where)
      problems.append(Problem(id=file.stem, reference_source=reference, level=level, origin=where))
  if not problems:
    raise ProblemLoadError(f"{root}: the levelN/ directories contain no .py files")
  return _check_unique(problems, str(root))


def _stem_order(stem: str) -> tuple[int, str]:
  number = stem.split("_", 1)[0]
  return (int(number) if number.isdigit() else 1 << 30, stem)


def load_bundled(name: str = "tiny") -> list[Problem]:
  """A problem set shipped inside dice_jax (`dice_jax/data/bundled/<name>.yaml`).

  Written by this project (not DICE's data): a few tiny element-wise and reduction ops with small
  shapes, each with a known-good phase-1 split, for the built-in `tiny` config and for tests.
  """
  if not _BUNDLED_NAME.match(name):
    raise ProblemLoadError(f"{BUNDLED_PREFIX}{name}: a bundled set name is letters, digits, '_' or '-'")
  folder = importlib.resources.files("dice_jax.data").joinpath("bundled")
  resource = folder.joinpath(f"{name}.yaml")
  where = f"{BUNDLED_PREFIX}{name}"
  if not resource.is_file():
    available = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    raise ProblemLoadError(f"{where}: no such bundled problem set (available: {', '.join(available)})")
  try:
    records = yaml.safe_load(resource.read_text(encoding="utf-8"))
  except yaml.YAMLError as e:
    raise ProblemLoadError(f"{where}: invalid YAML: {e}") from None
  return _records_to_problems(records, where, validate=True)


def load_synthetic(spec: str) -> list[Problem]:
  """Generated problems (`synthetic:<family>?split=...`, see dice_jax.data.synthetic)."""
  try:
    records = synthetic.records(spec)
  except synthetic.SpecError as e:
    raise ProblemLoadError(str(e)) from None
  if not records:
    raise ProblemLoadError(f"{spec}: selects no problems")
  return _records_to_problems(records, spec, validate=True)


@dataclasses.dataclass(frozen=True)
class FileSplit:
  """`PATH?split=train|heldout[&heldout_fraction=F]`: a deterministic part of a file's items."""

  path: str
  split: str | None = None  # None: every item
  heldout_fraction: float = DEFAULT_HELDOUT_FRACTION

  @classmethod
  def parse(cls, text: str) -> FileSplit:
    if "?" not in text or _exists(text):
      return cls(text)
    path, _, query = text.rpartition("?")
    fields: dict[str, str] = {}
    for part in filter(None, query.split("&")):
      key, eq, value = part.partition("=")
      if not eq or key in fields or key not in ("split", "heldout_fraction"):
        raise ProblemLoadError(f"{text}: bad or repeated option {part!r}; expected "
                               "PATH?split=train|heldout[&heldout_fraction=F]")
      fields[key] = value
    if fields.get("split") not in FILE_SPLITS:
      raise ProblemLoadError(f"{text}: split must be one of {', '.join(FILE_SPLITS)}")
    try:
      fraction = float(fields.get("heldout_fraction", DEFAULT_HELDOUT_FRACTION))
    except ValueError:
      fraction = -1.0
    if not 0 < fraction < 1:
      raise ProblemLoadError(f"{text}: heldout_fraction must be a number in (0, 1), got "
                             f"{fields['heldout_fraction']!r}")
    return cls(path, fields["split"], fraction)

  def keeps(self, problem_id: str) -> bool:
    """Whether `problem_id` is on this split's side (always, with no split)."""
    if self.split is None:
      return True
    digest = hashlib.sha256(f"heldout:{problem_id}".encode()).digest()
    heldout = int.from_bytes(digest[:8], "big") < self.heldout_fraction * 2.0**64
    return heldout == (self.split == "heldout")


def check_source(path: str | os.PathLike[str]) -> None:
  """Cheap checks of a problem path before anything loads it (for config validation): a well-formed
  `bundled:`/`synthetic:` name, or an existing file/directory with a well-formed `?split=` query.
  Raises ProblemLoadError."""
  text = os.fspath(path)
  if text.startswith(BUNDLED_PREFIX):
    if not _BUNDLED_NAME.match(text[len(BUNDLED_PREFIX):]):
      raise ProblemLoadError(f"{text}: a bundled set name is letters, digits, '_' or '-'")
  elif text.startswith(SYNTHETIC_PREFIX):
    try:
      synthetic.parse_spec(text)
    except synthetic.SpecError as e:
      raise ProblemLoadError(str(e)) from None
  else:
    _locate(FileSplit.parse(text).path)


def load_problems(path: str | os.PathLike[str], *, validate: bool = True) -> list[Problem]:
  """Problems from `bundled:<name>`, `synthetic:<family>?split=...`, a KernelBench directory, a
  `.jsonl` file or a DICE `.json` file; a file or directory may end in `?split=train|heldout`.

  `validate` parses every reference and checks it defines Model, get_inputs and get_init_inputs;
  turn it off only for trusted, very large files (it costs ~0.1 ms per problem).
  """
  text = os.fspath(path)
  if text.startswith(BUNDLED_PREFIX):
    return load_bundled(text[len(BUNDLED_PREFIX):])
  if text.startswith(SYNTHETIC_PREFIX):
    return load_synthetic(text)
  split = FileSplit.parse(text)
  problems = _load_path(split.path, validate)
  if split.split is None:
    return problems
  kept = [p for p in problems if split.keeps(p.id)]
  if not kept:
    raise ProblemLoadError(f"{text}: the {split.split} side of its {len(problems)} problems is empty")
  return kept


def _exists(text: str) -> bool:
  try:
    data_dir.locate(text)
  except data_dir.MissingDataError:
    return False
  return True


def _locate(text: str) -> pathlib.Path:
  """The file or directory `text` names, as given or under $DICE_DATA_DIR (dice_jax.data.data_dir)."""
  try:
    return data_dir.locate(text)
  except data_dir.MissingDataError as e:
    raise ProblemLoadError(str(e)) from None


def _load_path(text: str, validate: bool) -> list[Problem]:
  p = _locate(text)
  if p.is_dir():
    return load_kernelbench_dir(p, validate=validate)
  if p.suffix == ".jsonl":
    return load_jsonl(p, validate=validate)
  if p.suffix == ".json":
    return load_json(p, validate=validate)
  raise ProblemLoadError(f"{p}: unknown problem file type {p.suffix!r}; expected a directory, .json, "
                         f".jsonl or {BUNDLED_PREFIX}<name>")
