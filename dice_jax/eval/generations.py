"""The generations layout `DIR/<problem id>/<sample index>.py|.txt`, and candidates built from it.

So the evaluator is useful without our model, kernels made by anything else are read from a
folder: one subfolder per problem (the id: a KernelBench file stem, or the `id`/`idx` field of
the DICE JSON formats), one file per sample, named by its index:
- `<i>.py` is a candidate file, graded as written (end-to-end mode);
- `<i>.txt` is a model's raw output; the candidate is extracted from it exactly as the trainer
  extracts it (`dice_jax.data.extract`), so prose and code fences are fine.
In infilling mode (phase-1 items, as DICE reports its infilling evaluation) every file, .py or
.txt, is treated as a generation: its `source = \"\"\"...\"\"\"` assignment is taken and the graded
file is the problem's own `prefix + middle + suffix`, so nothing else the file says is graded. A
known-good `cuda_code` therefore reassembles to itself byte for byte.

`dice eval --model` writes its generations here as .txt files, which is also what lets it resume.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import Sequence

from dice_jax.data import extract
from dice_jax.data.problems import Problem

INFILLING, END_TO_END = "infilling", "end-to-end"
MODES = (INFILLING, END_TO_END)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SAMPLE_FILE = re.compile(r"^(0|[1-9]\d*)\.(py|txt)$")


class GenerationsError(ValueError):
  """The generations folder does not match the problems or the layout."""


@dataclasses.dataclass(frozen=True)
class Generation:
  """One sample of one problem: the file it came from and its text."""

  problem_id: str
  sample: int
  path: pathlib.Path
  text: str

  @property
  def raw(self) -> bool:
    """A model's raw output (.txt), as opposed to a candidate file (.py)."""
    return self.path.suffix == ".txt"


def folder_name(problem_id: str) -> str:
  """The problem's folder name: its id, which must be a plain file name."""
  if not _SAFE_ID.match(problem_id) or problem_id in (".", ".."):
    raise GenerationsError(f"problem id {problem_id!r} cannot name a folder; ids in the generations "
                           "layout use letters, digits, '.', '_' and '-'")
  return problem_id


ID_NOTE = ("the folder is the problem id: a KernelBench file's stem (level1/19_ReLU.py -> 19_ReLU), or "
           "a DICE item's id/idx field")


def layout_example(root: str | os.PathLike[str], problem_ids: Sequence[str] = ("19_ReLU", "20_LeakyReLU")) -> str:
  """The layout drawn with real folder names (the first problems' ids), for help and errors."""
  ids = [folder_name(i) for i in list(problem_ids)[:2]] or ["19_ReLU"]
  root = str(root).rstrip("/") or "."
  width = len(f"{root}/{ids[0]}/0.txt") + 2
  lines = [f"{root}/{ids[0]}/0.py".ljust(width) + "a candidate file (ModelNew + load_inline), graded as written",
           f"{root}/{ids[0]}/1.txt".ljust(width) + "a raw model output; the code is extracted as in training"]
  lines += [f"{root}/{pid}/0.py" for pid in ids[1:]]
  return "\n".join(["expected layout: one folder per problem, one file per sample named by its index, e.g.",
                    *(f"  {line}" for line in lines), f"({ID_NOTE})"])


def resolve_mode(problems: Sequence[Problem], mode: str) -> str:
  """`auto` is infilling when every problem has a phase-1 scaffold, else end-to-end."""
  if mode == "auto":
    return INFILLING if all(p.has_scaffold for p in problems) else END_TO_END
  if mode not in MODES:
    raise ValueError(f"mode must be auto, {INFILLING} or {END_TO_END}, got {mode!r}")
  if mode == INFILLING:
    missing = [p.id for p in problems if not p.has_scaffold]
    if missing:
      raise ValueError(f"infilling mode needs phase-1 items (prefix/middle/suffix); {len(missing)} "
                       f"problem(s) have none, e.g. {missing[:5]}")
  return mode


def candidate(problem: Problem, generation: Generation, mode: str) -> extract.Extraction:
  """The graded file of one generation (or why there is none)."""
  if mode == INFILLING:
    return extract.extract_infilling(generation.text, problem.prefix, problem.suffix)
  if generation.raw:
    return extract.extract_end_to_end(generation.text)
  return extract.Extraction(candidate=generation.text)


def _read(path: pathlib.Path) -> str:
  try:
    return path.read_bytes().decode("utf-8")
  except UnicodeDecodeError as e:
    raise GenerationsError(f"{path}: not UTF-8 text ({e})") from None
  except OSError as e:
    raise GenerationsError(f"{path}: cannot read: {e.strerror}") from None


def read_problem(root: pathlib.Path, problem_id: str) -> list[Generation]:
  """The samples of one problem, by index; [] when its folder does not exist."""
  folder = root / folder_name(problem_id)
  if not folder.is_dir():
    return []
  found: dict[int, pathlib.Path] = {}
  for path in sorted(folder.iterdir()):
    if path.name.startswith("."):
      continue
    m = _SAMPLE_FILE.match(path.name)
    if m is None or not path.is_file():
      raise GenerationsError(f"{path}: expected files named <sample index>.py (a candidate) or "
                             f"<sample index>.txt (a raw model output), e.g. {folder}/0.py or {folder}/0.txt")
    index = int(m.group(1))
    if index in found:
      raise GenerationsError(f"{folder}: sample {index} exists as both {found[index].name} and "
                             f"{path.name}")
    found[index] = path
  return [Generation(problem_id, i, found[i], _read(found[i])) for i in sorted(found)]


def read_generations(root: str | os.PathLike[str], problems: Sequence[Problem], *,
                     allow_missing: bool = False) -> dict[str, list[Generation]]:
  """Every problem's samples. Folders that name no problem are an error (a mismatched --problems);
  problems without samples are an error unless `allow_missing` (then they are left out)."""
  root = pathlib.Path(root)
  ids = {folder_name(p.id): p.id for p in problems}
  example = layout_example(root, list(ids))
  if not root.is_dir():
    raise GenerationsError(f"{root}: no such directory\n{example}")
  unknown = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
                   and d.name not in ids)
  if unknown:
    raise GenerationsError(f"{root}: {len(unknown)} folder(s) name no problem of the problem set, "
                           f"e.g. {unknown[:5]}; is --problems the set these were generated for?\n{example}")
  loose = sorted(f.name for f in root.iterdir() if f.is_file() and not f.name.startswith("."))
  out = {p.id: read_problem(root, p.id) for p in problems}
  missing = [pid for pid, gens in out.items() if not gens]
  if missing and not allow_missing:
    hint = f" (files directly in {root}, e.g. {loose[:3]}, belong in a folder per problem)" if loose else ""
    raise GenerationsError(f"{root}: {len(missing)} of {len(problems)} problems have no samples, "
                           f"e.g. {missing[:5]}{hint}; pass --allow-missing to score only the "
                           f"{len(problems) - len(missing)} that do\n{example}")
  return {pid: gens for pid, gens in out.items() if gens}


def write_generation(root: str | os.PathLike[str], problem_id: str, sample: int, text: str, *,
                     raw: bool) -> pathlib.Path:
  """Writes one sample atomically (a half-written file never looks like a finished sample)."""
  folder = pathlib.Path(root) / folder_name(problem_id)
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / f"{sample}.{'txt' if raw else 'py'}"
  tmp = folder / f".{path.name}.tmp"
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, path)
  return path


def write_reference_generations(root: str | os.PathLike[str], problems: Sequence[Problem]) -> int:
  """Each problem's known-good candidate (`cuda_code`) as sample 0; returns how many were written.

  For checking the harness and the data themselves: evaluated in infilling mode they reassemble to
  exactly the published candidate.
  """
  missing = [p.id for p in problems if p.known_good is None]
  if missing:
    raise GenerationsError(f"{len(missing)} problem(s) have no known-good candidate (cuda_code / "
                           f"prefix+middle+suffix), e.g. {missing[:5]}; reference generations "
                           "need phase-1 items such as kernel_infilling_evaluation.json")
  for p in problems:
    write_generation(root, p.id, 0, p.known_good, raw=False)
  return len(problems)
