"""A cgroup per compile-stage process tree, where the host lets us make one: tree-wide bounds.

Per-process rlimits (limits.py) bound each compiler process; a cgroup bounds the whole tree at
once: memory.max (cgroup v2: the sum of every process's memory, page cache of its files
included) and pids.max (cgroup v2, or v1's pids controller: tasks alive at once, which as root is
the only process bound there is, since the kernel does not apply RLIMIT_NPROC to root).

Found at start-up (`probe`), in this order:
- cgroup v2 with the memory and pids controllers: our own cgroup's folder must be writable and
  its parent must offer both controllers. A cgroup with processes cannot hand controllers to
  children, so the server moves itself into a leaf `dice-server` first (its later children, the
  GPU workers, start there); if the controllers still cannot be enabled (other processes share
  our cgroup), it moves back and says why.
- cgroup v1's pids controller, mounted and writable: pids only (memory stays per process; a v1
  memory hierarchy is left alone: it is often the host's or a container runtime's).
- neither: rlimits only, and the start-up log says which bound is then missing.
Each tree gets `<base>/c<n>` (made before the command starts, removed after it ends); a probe
process joins one at start-up, so a host where joining fails is found then, not at a candidate's
compile. Leftover folders of a server that died are removed at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import pathlib
import signal
from typing import AsyncIterator

from verifier_service.compile import limits as limits_lib

log = logging.getLogger(__name__)

_PREFIX = "dice-compile-"
_BASES = itertools.count()


@dataclasses.dataclass
class Hierarchy:
  """One cgroup folder under which the trees' groups are made, and what it can bound."""
  base: pathlib.Path  # <our cgroup>/dice-compile-<server pid>
  version: int  # 2 or 1
  memory: bool  # memory.max (v2 only)
  pids: bool


class Cgroups:
  """Makes, bounds and removes the per-tree groups."""

  def __init__(self, hierarchies: list[Hierarchy], limits: limits_lib.Limits):
    self.hierarchies = hierarchies
    self.limits = limits
    self._ids = itertools.count()

  @property
  def memory(self) -> bool:
    return any(h.memory for h in self.hierarchies)

  @property
  def pids(self) -> bool:
    return any(h.pids for h in self.hierarchies)

  def describe(self) -> str:
    parts = [f"cgroup v{h.version} {h.base}: " + "+".join(
        n for n, on in (("memory.max", h.memory), ("pids.max", h.pids)) if on)
             for h in self.hierarchies]
    return "; ".join(parts)

  def make(self, limits: limits_lib.Limits | None = None) -> list[pathlib.Path]:
    """Folders for one tree to join, bounded by `limits` (default: the candidates'). Removes
    what it made if one cannot be made."""
    limits = limits or self.limits
    made: list[pathlib.Path] = []
    name = f"c{next(self._ids)}"
    try:
      for h in self.hierarchies:
        folder = h.base / name
        folder.mkdir()
        made.append(folder)
        if h.memory:
          (folder / "memory.max").write_text(str(limits.memory_bytes))
          _try_write(folder / "memory.swap.max", "0")
          _try_write(folder / "memory.oom.group", "1")
        if h.pids:
          (folder / "pids.max").write_text(str(limits.processes))
    except OSError:
      for folder in made:
        _remove(folder)
      raise
    return made

  @contextlib.asynccontextmanager
  async def group(self, limits: limits_lib.Limits | None = None) -> AsyncIterator[list[str]]:
    """`make`'s folders as paths to join. On exit, whatever of the tree is still there (a
    cancelled command's processes, still dying) is killed and waited for, and the folders are
    removed."""
    made = self.make(limits)
    try:
      yield [str(folder) for folder in made]
    finally:
      for folder in made:
        await _empty(folder)
        _remove(folder)

  def exceeded(self, folders: list[str]) -> limits_lib.Limit | None:
    """The bound a tree's cgroup counted a breach of (read before the group is removed)."""
    for folder in map(pathlib.Path, folders):
      memory = _events(folder / "memory.events")
      if memory.get("oom_kill", 0) or memory.get("oom", 0):
        return limits_lib.Limit.MEMORY
      if _events(folder / "pids.events").get("max", 0):
        return limits_lib.Limit.PROCESSES
    return None

  def close(self) -> None:
    for h in self.hierarchies:
      _remove(h.base)


def probe(limits: limits_lib.Limits) -> tuple[Cgroups | None, str]:
  """The cgroups this server may use, or None and why not (for the start-up log)."""
  notes, found = [], []
  v2 = _v2(notes)
  if v2 is not None:
    found.append(v2)
  if v2 is None or not v2.pids:
    v1 = _v1_pids(notes)
    if v1 is not None:
      found.append(v1)
  if not found:
    return None, "; ".join(notes) or "no cgroup hierarchy found"
  return Cgroups(found, limits), "; ".join(notes)


def _mounts() -> list[tuple[str, str, str]]:
  """(mount point, filesystem type, super options) of cgroup mounts."""
  out = []
  try:
    lines = pathlib.Path("/proc/self/mountinfo").read_text().splitlines()
  except OSError:
    return out
  for line in lines:
    left, _, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
      out.append((fields[4], tail[0], tail[2]))
  return out


def _own(version: int, controller: str = "") -> str | None:
  """Our cgroup's path in a hierarchy (from /proc/self/cgroup)."""
  try:
    lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
  except OSError:
    return None
  for line in lines:
    _, names, path = line.split(":", 2)
    if version == 2 and names == "" or version == 1 and controller in names.split(","):
      return path
  return None


def _fresh_base(parent: pathlib.Path) -> pathlib.Path:
  for stale in parent.glob(_PREFIX + "*"):  # a server that died: its empty groups
    pid = stale.name[len(_PREFIX):].split("-")[0]
    if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
      _remove(stale)
  base = parent / f"{_PREFIX}{os.getpid()}-{next(_BASES)}"
  base.mkdir()
  return base


def _v2(notes: list[str]) -> Hierarchy | None:
  mount = next((m for m, kind, _ in _mounts() if kind == "cgroup2"), None)
  own = _own(2)
  if mount is None or own is None:
    notes.append("no cgroup v2 hierarchy")
    return None
  folder = pathlib.Path(mount + own.rstrip("/"))
  available = set(_read(folder / "cgroup.controllers").split())
  wanted = {"memory", "pids"} & available
  if not wanted:
    notes.append(f"cgroup v2 at {mount}: no memory or pids controller offered to {own}")
    return None
  enabled = set(_read(folder / "cgroup.subtree_control").split())
  moved = None
  try:
    if not wanted <= enabled:
      if _read(folder / "cgroup.procs").split():
        moved = folder / "dice-server"
        moved.mkdir(exist_ok=True)
        (moved / "cgroup.procs").write_text(str(os.getpid()))
      (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
    base = _fresh_base(folder)
  except OSError as e:
    if moved is not None:
      _try_write(folder / "cgroup.procs", str(os.getpid()))
      _remove(moved)
    notes.append(f"cgroup v2 at {folder}: {e.strerror or e} (controllers not delegated)")
    return None
  return Hierarchy(base, 2, "memory" in wanted, "pids" in wanted)


def _v1_pids(notes: list[str]) -> Hierarchy | None:
  mount = next((m for m, kind, opts in _mounts() if kind == "cgroup" and
                "pids" in opts.split(",")), None)
  own = _own(1, "pids")
  if mount is None or own is None:
    notes.append("no cgroup v1 pids controller")
    return None
  try:
    base = _fresh_base(pathlib.Path(mount + own.rstrip("/")))
  except OSError as e:
    notes.append(f"cgroup v1 pids at {mount}: {e.strerror or e}")
    return None
  return Hierarchy(base, 1, False, True)


def _read(path: pathlib.Path) -> str:
  try:
    return path.read_text()
  except OSError:
    return ""


def _try_write(path: pathlib.Path, text: str) -> None:
  try:
    path.write_text(text)
  except OSError:
    pass


def _events(path: pathlib.Path) -> dict[str, int]:
  out = {}
  for line in _read(path).splitlines():
    key, _, value = line.partition(" ")
    if value.strip().isdigit():
      out[key] = int(value)
  return out


async def _empty(folder: pathlib.Path, wait_s: float = 5.0) -> None:
  """Kills the processes left in a group and waits (polling) until the kernel has let them go.
  Without a running loop (a compile's coroutine closed by the garbage collector after its loop
  closed) it kills them and returns: it cannot wait there."""
  try:
    loop = asyncio.get_running_loop()
  except RuntimeError:
    loop = None
  deadline = loop.time() + wait_s if loop else 0.0
  while True:
    pids = _read(folder / "cgroup.procs").split()
    for pid in pids:
      with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
        os.kill(int(pid), signal.SIGKILL)
    if not pids or loop is None or loop.time() > deadline:
      return
    await asyncio.sleep(0.02)


def _remove(folder: pathlib.Path) -> None:
  """rmdir of a cgroup folder and its children (their files are the kernel's, not removable)."""
  if not folder.is_dir():
    return
  for child in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
    with contextlib.suppress(OSError):
      child.rmdir()
  with contextlib.suppress(OSError):
    folder.rmdir()
  if folder.exists():  # a later server removes it once this one has exited
    log.info("cgroup folder %s still has processes; left for later", folder)
