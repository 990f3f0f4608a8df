"""g++ precompiled headers, built once per toolchain, flag set and header text.

A header is `<cache>/pch/<key>/<name>` with its `.gch` beside it. main.cpp is compiled with
`-include <header> -Winvalid-pch`, so g++ loads the precompiled form when it is valid and parses
the header text otherwise (same declarations either way: a precompiled header only saves time);
host_pch.py uses the same store for the host code nvcc's last step compiles.

Decisions:
- Built on demand and shared: the first build that needs a header starts it, later ones wait for
  it (`ensure`), or it is started in the background and used once it exists (`prefetch`,
  `ready`). Either way it runs ahead of waiting compiles (it saves each of them more than it
  costs), as its own task, never cancelled with one request (it
  outlives short deadlines), and servers sharing a cache folder build it once (a file lock).
- A header g++ cannot precompile is not fatal: the header file stays, `precompiled` is False and
  the error is kept (compiler.py switches a light tier off when the error lies in its header).
- Every use checks that the files are still there (a pruned cache rebuilds them) and touches the
  folder, so LRU pruning (cache.py) sees headers in use as fresh.
- `TORCH_EXTENSION_NAME` differs per extension; it is left out of the precompiling command, which
  g++ accepts because no header mentions it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
import time
from typing import Callable

from verifier_service.compile import procs as compile_procs

log = logging.getLogger(__name__)

NAME_DEFINE_RE = re.compile(r"^-DTORCH_EXTENSION_NAME=")
REJECTED_RE = re.compile(r"\.gch[^\n]*(not used|invalid)|cannot use precompiled", re.I)


@dataclasses.dataclass(frozen=True)
class Header:
  """A header to `-include`; `precompiled` when its .gch exists, else g++'s `error`."""
  path: str
  precompiled: bool
  error: str = ""


class PrecompiledHeaders:
  """Builds and finds precompiled headers under `<cache>/pch`."""

  def __init__(self, root: pathlib.Path, scratch: pathlib.Path, fingerprint: str,
               runner: compile_procs.ProcessRunner,
               report: Callable[[str, str], None] = lambda stage, text: None,
               on_publish: Callable[[pathlib.Path], None] = lambda folder: None):
    self.root = root
    root.mkdir(parents=True, exist_ok=True)
    self._scratch = scratch
    self._fingerprint = fingerprint
    self._runner = runner
    self._report = report
    self._on_publish = on_publish
    self._tasks: dict[str, asyncio.Task[Header]] = {}
    self.in_use: set[pathlib.Path] = set()

  def folder(self, cxx: tuple[str, ...], cflags: tuple[str, ...], text: str) -> pathlib.Path:
    flags = [f for f in cflags if not NAME_DEFINE_RE.match(f)]
    digest = hashlib.sha256(text.encode()).hexdigest()
    key = hashlib.sha256(json.dumps(["pch", self._fingerprint, list(cxx), flags, digest]).encode())
    return self.root / key.hexdigest()

  def ready(self, folder: pathlib.Path, name: str) -> Header | None:
    """The precompiled header in `folder` if it is built; never waits, never builds."""
    found = _read(folder, name)
    if found is None or not found.precompiled:
      return None
    self.in_use.add(folder)
    _touch(folder)
    return found

  def prefetch(self, cxx: tuple[str, ...], cflags: tuple[str, ...], text: str, name: str,
               what: str) -> None:
    """Starts building the header in the background (nobody waits for it)."""
    folder = self.folder(cxx, cflags, text)
    task = self._tasks.get(str(folder))
    if _read(folder, name) is not None or (task is not None and not task.done()):
      return
    flags = [f for f in cflags if not NAME_DEFINE_RE.match(f)]
    self._tasks[str(folder)] = asyncio.ensure_future(
        self._build(cxx, flags, text, folder, name, what))

  async def ensure(self, cxx: tuple[str, ...], cflags: tuple[str, ...], text: str, name: str,
                   what: str) -> Header:
    """The header `text` as file `name`, precompiled if g++ can; `what` names it in progress."""
    folder = self.folder(cxx, cflags, text)
    self.in_use.add(folder)
    found = _read(folder, name)
    if found is not None:
      _touch(folder)
      return found
    key = str(folder)
    task = self._tasks.get(key)
    if task is None or (task.done() and (task.cancelled() or _read(folder, name) is None)):
      flags = [f for f in cflags if not NAME_DEFINE_RE.match(f)]
      self._tasks[key] = asyncio.ensure_future(self._build(cxx, flags, text, folder, name, what))
    return await asyncio.shield(self._tasks[key])

  async def settle(self) -> None:
    """Waits for the builds in progress (benchmarks and tests measure after them)."""
    await asyncio.gather(*self._tasks.values(), return_exceptions=True)

  async def close(self) -> None:
    tasks = list(self._tasks.values())
    for task in tasks:
      task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

  async def _build(self, cxx: tuple[str, ...], flags: list[str], text: str,
                   folder: pathlib.Path, name: str, what: str) -> Header:
    compile_procs.PRIORITY.set(-1)  # ahead of every build: they all use it
    async with compile_procs.file_lock(folder.with_suffix(".lock")):
      found = _read(folder, name)
      if found is not None:
        return found
      shutil.rmtree(folder, ignore_errors=True)  # a partial folder (a pruned .gch)
      work = pathlib.Path(tempfile.mkdtemp(prefix="pch-", dir=self._scratch))
      try:
        (work / name).write_text(text)
        argv = list(cxx) + ["-x", "c++-header"] + flags + [
            str(work / name), "-o", str(work / (name + ".gch"))]
        start = time.monotonic()
        self._report("pch", f"precompiling {what} (once per toolchain; a few hundred MB in "
                            f"{self.root})")
        try:
          rc, output = await self._runner.run(argv, cwd=work, shared=True)
        except compile_procs.LimitExceeded as e:  # our own header: compile without it
          rc, output = 1, e.log
        seconds = time.monotonic() - start
        if rc != 0:
          log.warning("precompiling %s failed; compiling without it: %s", what, output[-2000:])
          (work / "error.log").write_text(output.replace(f"{work}/", f"{folder}/"))
          self._report("pch", f"precompiling {what} failed after {seconds:.0f} s")
        else:
          log.info("precompiled %s in %.1f s", what, seconds)
          self._report("pch", f"precompiled {what} in {seconds:.0f} s")
        try:
          os.rename(work, folder)
          self._on_publish(folder)
        except OSError:
          pass  # another process published it first
      finally:
        shutil.rmtree(work, ignore_errors=True)
    return _read(folder, name) or Header(str(folder / name), False, "header folder vanished")


def _read(folder: pathlib.Path, name: str) -> Header | None:
  header = folder / name
  if not header.is_file():
    return None
  if (folder / (name + ".gch")).is_file():
    return Header(str(header), True)
  try:
    return Header(str(header), False, (folder / "error.log").read_text(errors="replace"))
  except OSError:
    return None  # neither built nor failed: a partial folder


def _touch(folder: pathlib.Path) -> None:
  try:
    os.utime(folder)
  except OSError:
    pass
