"""The verifier's cache folder: what it holds, how big it is, and least-recently-used pruning.

Location: `--cache-dir`, else $DICE_VERIFIER_CACHE, else $XDG_CACHE_HOME/dice-verifier, else
~/.cache/dice-verifier. Layout (sizes for torch 2.11-2.14, nvcc 13, one DICE-sized candidate):

  pch/<key>/        g++ precompiled headers (pch.py): the lite binding header for main.cpp,
                    ~350 MB, built on first use per toolchain and flag set; torch/extension.h,
                    ~750 MB, only if some main.cpp cannot use the lite header
  headers/<key>/    header-tier environments (tier_environment.py), ~1.5 MB each
  obj/<xx>/<key>/   object files: main.cpp.o ~2.7 MB, cuda.cu.o ~0.5 MB
  so/<xx>/<key>/    linked modules, ~1.7 MB
  builds/<key>.json build records (a module path, or a failed build's log)
  verdicts.sqlite   verdicts by request id (service/verdict_store.py; its own row limit)
  tmp/              scratch of builds in progress

So a new candidate adds ~5 MB: a farm box verifying 3,000 candidates an hour writes ~15 GB/h.

Decisions:
- Bounded by `--cache-max-bytes` (default 10 GiB; 0: unbounded): when a server's estimate of the
  folder's size passes the bound, it deletes least-recently-used entries (pch, headers, obj, so,
  builds; everything but verdicts.sqlite) down to 90% of it, in a thread. Entries are touched
  when used (cache hits, headers in use), so "least recently used" is their mtime.
- The bound is soft: entries used in the last `MIN_AGE_S` (30 min) are never deleted by a running
  server, because a built module must outlive the queue wait and the GPU run that copy it, and the
  headers it uses stay in use; at full load the folder can exceed the bound by that half hour's
  writes.
- `dice-verifier cache prune` deletes without that grace, so it refuses to run while a verifier
  holds the folder (each Compiler holds a shared lock on `<cache>/.in-use`; prune needs it
  exclusively).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fcntl
import logging
import os
import pathlib
import re
import shutil
import tempfile
import time
from typing import AbstractSet, Callable, Iterator

log = logging.getLogger(__name__)

MIN_AGE_S = 30 * 60
DEFAULT_MAX_BYTES = 10 << 30
_TMP_MAX_AGE_S = 24 * 3600
_PRUNE_INTERVAL_S = 60.0
_PARTS = ("pch", "headers", "obj", "so", "builds")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.I)


def partial_path(target: pathlib.Path) -> pathlib.Path:
  """A new empty file beside `target`, to write in full and then os.replace onto it: writers of
  one target at once (two compilers of one process, two servers on one cache) never share it."""
  fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
  os.close(fd)
  return pathlib.Path(name)


def parse_size(text: str) -> int:
  """'10G', '500M', '1.5GiB', '1048576' -> bytes (powers of 1024)."""
  match = _SIZE_RE.match(text)
  if not match:
    raise argparse.ArgumentTypeError(f"expected a size like 10G, 500M or 1048576 (got {text!r})")
  return int(float(match.group(1)) * 1024 ** "_kmgt".index(match.group(2).lower() or "_"))


def format_size(size: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if size < 1024 or unit == "GiB":
      return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
    size /= 1024
  raise AssertionError


@dataclasses.dataclass
class Entry:
  """One prunable unit: a folder (with its .lock file) or a build record."""
  path: pathlib.Path
  part: str
  mtime: float
  size: int


def tree_size(path: pathlib.Path) -> int:
  if path.is_file():
    return path.stat().st_size
  total = 0
  for root, _, files in os.walk(path):
    for name in files:
      try:
        total += os.lstat(os.path.join(root, name)).st_size
      except OSError:
        pass
  return total


def _children(folder: pathlib.Path) -> Iterator[pathlib.Path]:
  try:
    yield from (p for p in folder.iterdir() if not p.name.endswith(".lock"))
  except OSError:
    return


def entries(cache_dir: pathlib.Path) -> list[Entry]:
  """Every prunable entry, least recently used first."""
  found = []
  for part in _PARTS:
    for child in _children(cache_dir / part):
      paths = list(_children(child)) if part in ("obj", "so") and child.is_dir() else [child]
      for path in paths:
        try:
          found.append(Entry(path, part, path.stat().st_mtime, tree_size(path)))
        except OSError:
          pass  # removed meanwhile
  return sorted(found, key=lambda e: e.mtime)


def usage(cache_dir: pathlib.Path) -> dict[str, tuple[int, int]]:
  """part -> (bytes, entries), for every part of the folder (verdicts.sqlite and tmp too)."""
  result = {part: (0, 0) for part in _PARTS}
  for entry in entries(cache_dir):
    size, count = result[entry.part]
    result[entry.part] = (size + entry.size, count + 1)
  verdicts = [p for p in cache_dir.glob("verdicts.sqlite*") if p.is_file()]
  result["verdicts"] = (sum(p.stat().st_size for p in verdicts), 1 if verdicts else 0)
  scratch = list(_children(cache_dir / "tmp"))
  result["tmp"] = (sum(tree_size(p) for p in scratch if p.exists()), len(scratch))
  return result


def remove(path: pathlib.Path) -> None:
  if path.is_dir() and not path.is_symlink():
    shutil.rmtree(path, ignore_errors=True)
  else:
    path.unlink(missing_ok=True)
  path.with_name(path.name + ".lock").unlink(missing_ok=True)


def prune(cache_dir: pathlib.Path, keep_bytes: int, min_age_s: float = MIN_AGE_S,
          protect: AbstractSet[pathlib.Path] = frozenset(),
          above: int | None = None) -> tuple[int, int, int]:
  """Deletes least-recently-used entries until the prunable parts hold at most `keep_bytes` (only
  if they hold more than `above`, when given); never entries used within `min_age_s` or in
  `protect`. Also clears scratch older than a day. Returns (entries removed, bytes removed,
  bytes left)."""
  now = time.time()
  for path in _children(cache_dir / "tmp"):
    try:
      if now - path.stat().st_mtime > _TMP_MAX_AGE_S:
        remove(path)
    except OSError:
      pass
  found = entries(cache_dir)
  total = sum(e.size for e in found)
  removed = freed = 0
  if above is not None and total <= above:
    return 0, 0, total
  for entry in found:
    if total - freed <= keep_bytes:
      break
    if now - entry.mtime < min_age_s or entry.path in protect:
      continue
    remove(entry.path)
    removed, freed = removed + 1, freed + entry.size
  return removed, freed, total - freed


def touch(path: pathlib.Path) -> None:
  try:
    os.utime(path)
  except OSError:
    pass


def hold_shared(cache_dir: pathlib.Path):
  """A shared lock on the folder, held while the returned file stays open."""
  handle = open(cache_dir / ".in-use", "a")  # pylint: disable=consider-using-with
  fcntl.flock(handle, fcntl.LOCK_SH)
  return handle


class Bound:
  """Keeps a running estimate of the folder's size and prunes it in a thread past `max_bytes`."""

  def __init__(self, cache_dir: pathlib.Path, max_bytes: int,
               protect: Callable[[], set[pathlib.Path]]):
    self.cache_dir = cache_dir
    self.max_bytes = max_bytes
    self._protect = protect
    self._estimate: int | None = None
    self._task: asyncio.Task | None = None
    self._next_s = 0.0  # no prune before this (monotonic): a bound held up by fresh entries
    self.pruned_entries = 0

  def added(self, path: pathlib.Path) -> None:
    """Counts a newly published entry; starts a prune when the estimate passes the bound."""
    if self.max_bytes <= 0:
      return
    if self._estimate is not None:
      try:
        self._estimate += tree_size(path)
      except OSError:
        pass
    due = self._estimate is None or (self._estimate > self.max_bytes and
                                     time.monotonic() >= self._next_s)
    if due and (self._task is None or self._task.done()):
      self._next_s = time.monotonic() + _PRUNE_INTERVAL_S
      self._task = asyncio.ensure_future(asyncio.to_thread(self._prune))

  def _prune(self) -> None:
    removed, freed, left = prune(self.cache_dir, int(0.9 * self.max_bytes), MIN_AGE_S,
                                 self._protect(), above=self.max_bytes)
    self._estimate = left
    self.pruned_entries += removed
    if removed:
      log.info("compile cache pruned: %d entries, %s freed, %s left (bound %s)", removed,
               format_size(freed), format_size(left), format_size(self.max_bytes))

  async def close(self) -> None:
    if self._task is not None:
      await asyncio.gather(self._task, return_exceptions=True)


# ----------------------------------------------------------------------------- dice-verifier cache


def add_parser(sub: argparse._SubParsersAction, default_dir: pathlib.Path) -> None:
  """`dice-verifier cache info|prune`."""
  cache = sub.add_parser("cache", help="show or prune the compile cache",
                         description="\n\n".join(__doc__.split("\n\n")[1:4]),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
  cache.add_argument("action", choices=("info", "prune"),
                     help="info: location and size of each part; prune: delete least recently "
                          "used entries (not while a verifier uses the folder)")
  cache.add_argument("--cache-dir", type=pathlib.Path, default=default_dir,
                     help="the cache folder (default %(default)s; $DICE_VERIFIER_CACHE overrides)")
  cache.add_argument("--keep", type=parse_size, default=0, metavar="SIZE",
                     help="prune: keep at most SIZE of entries, e.g. 2G (default 0: delete all "
                          "but verdicts.sqlite)")


def run(args: argparse.Namespace) -> int:
  """Runs `dice-verifier cache`; returns the exit code."""
  folder = pathlib.Path(args.cache_dir)
  if not folder.is_dir():
    print(f"{folder}: no cache yet (it is created by the first `dice-verifier check` or serve)")
    return 0
  if args.action == "info":
    parts = usage(folder)
    total = sum(size for size, _ in parts.values())
    print(f"{folder}: {format_size(total)}")
    for part, (size, count) in parts.items():
      print(f"  {part:9s} {format_size(size):>10s}  {count} entries")
    return 0
  with open(folder / ".in-use", "a") as handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f"dice-verifier: error: {folder} is in use by a running verifier; stop it first (or "
            "give it --cache-max-bytes, which prunes as it runs)", flush=True)
      return 2
    removed, freed, left = prune(folder, args.keep, min_age_s=0)
  print(f"{folder}: removed {removed} entries ({format_size(freed)}); {format_size(left)} left")
  return 0
