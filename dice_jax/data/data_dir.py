"""Where problem files are found: the path as given, else under the data directory ($DICE_DATA_DIR).

Real problem sets (DICE's infilling and end-to-end files, a KernelBench tree) are not shipped with
dice-jax: a user downloads them once and names them on every command (`--problems PATH`,
`data.phase1_files=[...]`). `DICE_DATA_DIR` saves repeating the folder: a relative path that does not
exist from the working directory is looked up there, so with `DICE_DATA_DIR=~/dice-data`,
`--problems kernel_infilling_evaluation.json?split=heldout` reads
`~/dice-data/kernel_infilling_evaluation.json`. Absolute paths, and relative ones that exist where
the command runs, are used as they are; nothing is ever downloaded.

Decision: an environment variable, not a config key, because every command that takes problems
(`dice train`, `dice eval`, `dice rewards check`) reads the same folder,
and one setting in a shell profile covers them all. A path found in neither place is one
ProblemLoadError naming the path, both places looked in and the setting.
"""

from __future__ import annotations

import os
import pathlib

ENV = "DICE_DATA_DIR"
HOW_TO_GET = "README.md, 'Getting real data', says where DICE's and KernelBench's problem files are published"


class MissingDataError(FileNotFoundError):
  """A problem path that is neither where it was given nor under the data directory."""


def data_dir() -> pathlib.Path | None:
  """The data directory named by $DICE_DATA_DIR (`~` expanded), or None when it is not set."""
  value = os.environ.get(ENV, "").strip()
  return pathlib.Path(value).expanduser() if value else None


def locate(path: str | os.PathLike[str]) -> pathlib.Path:
  """The existing file or directory `path` names (as given, else under the data directory).

  Raises MissingDataError, whose message names the path, where it was looked for and the setting.
  """
  given = pathlib.Path(path).expanduser()
  if given.exists():
    return given
  folder = data_dir()
  if not given.is_absolute() and folder is not None and (folder / given).exists():
    return folder / given
  raise MissingDataError(missing_message(given))


def missing_message(given: pathlib.Path) -> str:
  """Why `given` was not found: each place looked in, and how to point the data directory elsewhere."""
  folder = data_dir()
  if given.is_absolute():
    where = ""
  elif folder is None:
    where = (f" (not in the working directory {pathlib.Path.cwd()}; no data directory is set: relative paths are "
             f"also looked up under ${ENV})")
  else:
    where = f" (not in the working directory {pathlib.Path.cwd()} nor in the data directory {folder}, ${ENV})"
  return f"no such file or directory: {str(given)!r}{where}; {HOW_TO_GET}"
