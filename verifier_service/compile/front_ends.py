"""Warm front ends: nvcc's cudafe++ and cicc, started before the candidate on the shared headers.

A lone compile's critical path is nvcc's host front end (cudafe++) and then the host compile
(benchmarks/verifier_compile.py --steps: on the H200 box cudafe++'s chain is 4.8-6.8 s of a
7.4-12.6 s build). Both front ends spend most of that parsing the headers, and at a light tier
those come first and are the same for every candidate: the preprocessed text up to the line that
returns to the candidate's own file is byte for byte the same (nvcc_split.py, host_pch.py). The
front ends read their input as a stream, parsing as they go. So one of each is started ahead of
time, reading its input through a pipe (warm_shim.c, preloaded, turns the tool's first open of
the input into a read of the pipe): the server writes the shared prefix at once and the tool
parses it, then waits. When a candidate's preprocessed file starts with exactly that prefix, the
rest of the file goes down the pipe, and the tool finishes with the candidate's own code and its
end-of-file work; its output files are moved into the build's folder. A claimed process is
replaced in the background by a fresh one.

Why the output cannot differ: the tool reads the same bytes in the same order through the same
stdio calls (fread returns short only at end of file on a stream too; ftell reports the bytes
consumed), with the same arguments save `--orig_src_path_name` (the warm folder instead of the
build's; it does not reach any output file, tested), the same module id file and the same
environment. Diagnostics that reread source lines find the real file at the input's path (the
prefix while it is parsed, then the whole file). Checked, not assumed: a command's first warm run
(the server's start-up probe, compiler.py) also runs the tool as usual and compares return codes,
printed output and every output file byte for byte; any difference switches warm front ends off
for that command. tests/verifier/test_verifier_front_ends.py does the same with real nvcc.

Decisions:
- Any mismatch (another prefix, a dead warm process, a pipe error) falls back to running the tool
  as usual; a warm process is used once, for one input, then killed or reaped.
- `depth` warm processes per command (the tool's argv without `--orig_src_path_name`, nvcc's
  environment and the module id; default 1: a second one per command measured no gain on the
  H200 box), for at most `max_commands` commands (the least recently used are killed): each
  holds a parsed translation unit in memory (cicc on torch/types.h peaked at 1.5 GB; less on
  the lite tier).
- Warm processes run outside the compiler slot pool (they wait, mostly) at the compilers' nice
  level, confined and bounded as every compiler process is (confine.py; rlimits only, no cgroup
  of their own); parsing the prefix is work the next candidate would otherwise do itself. The usual run
  of a command's first warm run goes through the compiler pool (`run`).
- The preloaded library is compiled once per cache folder with the host's C compiler; if that
  fails, warm front ends are off and every compile runs as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import pathlib
import re
import shlex
import shutil
import signal
import tempfile
import time

from verifier_service.compile import confine as confine_lib
from verifier_service.compile import nvcc_split
from verifier_service.compile import procs as compile_procs

log = logging.getLogger(__name__)

SHIM = pathlib.Path(__file__).with_name("warm_shim.c")
_ORIG_PATH_RE = re.compile(r'\s--orig_src_path_name\s+("[^"]*"|\S+)')
_MAIN_FILE_RE = re.compile(rb'# 0 "([^"\n]+)"\n')


def input_path(command: str) -> str | None:
  """The preprocessed file a front-end command reads (the one `.ii` argument), relative."""
  inputs = [t for t in shlex.split(command) if t.endswith(".ii")]
  if len(inputs) != 1 or os.path.isabs(inputs[0]):
    return None
  return inputs[0]


def header_prefix(data: bytes) -> int:
  """Where the main file's own text starts in `gcc -E` output, when its first line is an
  include: the line marker that returns to the main file after it (0 if there is none)."""
  first = _MAIN_FILE_RE.match(data)
  if not first:
    return 0
  name = re.escape(first.group(1))
  start = re.search(rb'^# 1 "' + name + rb'"\n', data, re.M)
  if not start:
    return 0
  back = re.compile(rb'^# \d+ "' + name + rb'"', re.M).search(data, start.end())
  return back.start() if back else 0


@dataclasses.dataclass
class _Warm:
  """One started front end: its folder, process, the pipe it reads and what was written to it."""
  folder: pathlib.Path
  process: asyncio.subprocess.Process
  pipe: int  # write end
  prefix: bytes
  input: str  # relative path it reads
  fed: asyncio.Future  # the thread writing to the pipe (the prefix, then the rest)
  before: frozenset[str]  # files in the folder that are ours, not the tool's output


class FrontEnds:
  """Warm cudafe++ and cicc processes; `run` is nvcc_split's `front_end` hook."""

  def __init__(self, scratch: pathlib.Path, shim_dir: pathlib.Path, env: dict[str, str],
               run: nvcc_split.RunFn, nice: int = 10, depth: int = 1, max_commands: int = 2,
               confinement: confine_lib.Confinement | None = None):
    self._confinement = confinement
    self._scratch = scratch
    self._shim_dir = shim_dir
    self._env = env
    self._run = run  # runs the usual front end of a command's first warm run, to compare
    self._nice = nice
    self._depth = depth
    self._max_commands = max_commands
    self._warm: dict[str, list[_Warm]] = {}  # command key -> ready processes (LRU order)
    self._starting: dict[str, int] = {}  # command key -> processes being started
    self._tasks: set[asyncio.Task] = set()
    self._off: dict[str, str] = {}  # command key -> why warm front ends are off for it
    self._checked: set[str] = set()  # command keys whose first warm run matched the usual one
    self._shim: asyncio.Task | None = None
    self.claimed = 0  # compiles that finished in a warm process
    self.missed = 0  # front-end runs with no matching warm process

  # ------------------------------------------------------------------ the hook

  async def run(self, command: str, env: dict[str, str],
                cwd: pathlib.Path) -> tuple[int, str] | None:
    """Finishes `command` (a cudafe++ or cicc step of nvcc's dry run, run in `cwd`) in a warm
    process if one holds the prefix of its input; otherwise starts one for the next input and
    returns None."""
    rel = input_path(command) if nvcc_split.front_end_tool(command) else None
    if rel is None:
      return None
    module_file = nvcc_split.module_id_file(command)
    try:
      module = (cwd / module_file).read_bytes() if module_file else b""
      data = (cwd / rel).read_bytes()
    except OSError:
      return None
    key = _key(command, env, module)
    if key in self._off:
      return None
    pool = self._warm.get(key, [])
    warm = next((w for w in pool if w.process.returncode is None and data.startswith(w.prefix)),
                None)
    if warm is not None:
      pool.remove(warm)
      self._refill(key, command, env, module, data)
      began = time.monotonic()
      try:
        if key not in self._checked:
          result = await self._check(key, warm, command, env, cwd, data)
        else:
          result = await self._finish(warm, data, cwd)
      except BaseException:  # a cancel can land before _finish starts (inside _check's gather)
        await self._discard(warm)
        raise
      trace = compile_procs.STEPS.get()
      if trace is not None:
        trace.add(f"{nvcc_split.front_end_tool(command)} (warm)", began, began,
                  time.monotonic())
      return result
    self.missed += 1
    if any(w.process.returncode is not None or not data.startswith(w.prefix) for w in pool):
      stale = self._warm.pop(key, [])  # dead, or parsed a prefix this input does not have:
      await asyncio.gather(*(self._discard(w) for w in stale))  # start over on this input's
    self._refill(key, command, env, module, data)
    return None

  async def _check(self, key: str, warm: _Warm, command: str, env: dict[str, str],
                   cwd: pathlib.Path, data: bytes) -> tuple[int, str]:
    """A command's first warm run: the tool also runs as usual, in a scratch copy of its inputs,
    and return codes, printed output and every output file must match; if anything differs,
    warm front ends are off for the command and the usual run's result stands."""
    inputs = [input_path(command), nvcc_split.module_id_file(command)]
    with tempfile.TemporaryDirectory(dir=self._scratch, prefix="warm-check-") as scratch:
      cold, hot = pathlib.Path(scratch) / "plain", pathlib.Path(scratch) / "warm"
      for folder in (cold, hot):
        _copy_inputs(cwd, folder, inputs)
      plain, result = await asyncio.gather(self._run(nvcc_split.shell(env, [command]), cold),
                                           self._finish(warm, data, hot))
      same = result == plain and _outputs(cold, inputs) == _outputs(hot, inputs)
      chosen = hot if same else cold
      for name in _outputs(chosen, inputs):
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(chosen / name, cwd / name)
    if same:
      self._checked.add(key)
    else:
      self._off[key] = "its first warm run's outputs differed from the usual run's"
      log.warning("warm front ends off for a %s command: %s",
                  nvcc_split.front_end_tool(command), self._off[key])
    return plain

  async def settle(self) -> None:
    """Waits for warm processes being started (not for them to finish parsing)."""
    while self._tasks:
      await asyncio.gather(*self._tasks, return_exceptions=True)

  async def close(self) -> None:
    """Kills every warm process and removes its folder."""
    for task in list(self._tasks):
      task.cancel()
    await asyncio.gather(*self._tasks, return_exceptions=True)
    warm = [w for pool in self._warm.values() for w in pool]
    self._warm = {}
    await asyncio.gather(*(self._discard(w) for w in warm), return_exceptions=True)
    if self._shim is not None:
      self._shim.cancel()
      await asyncio.gather(self._shim, return_exceptions=True)

  def stats(self) -> dict[str, int]:
    return {"warm_front_ends": sum(len(pool) for pool in self._warm.values()),
            "warm_claimed": self.claimed,
            "warm_missed": self.missed, "warm_off": len(self._off)}

  # ------------------------------------------------------------------ processes

  def _refill(self, key: str, command: str, env: dict[str, str], module: bytes,
              data: bytes) -> None:
    """Starts warm processes for `key` in the background, up to `depth` ready or starting, on
    the header prefix of `data` (an input of the command) and the module id `module` (read now:
    the build's folder may be gone by the time they start)."""
    cut = header_prefix(data)
    if cut == 0:
      return
    for _ in range(self._depth - len(self._warm.get(key, [])) - self._starting.get(key, 0)):
      self._starting[key] = self._starting.get(key, 0) + 1
      task = asyncio.ensure_future(self._add(key, command, env, module, data[:cut]))
      self._tasks.add(task)
      task.add_done_callback(self._tasks.discard)

  async def _add(self, key: str, command: str, env: dict[str, str], module: bytes,
                 prefix: bytes) -> None:
    try:
      warm = await self._start(command, env, module, prefix)
    finally:
      self._starting[key] -= 1
    if warm is None:
      return
    self._warm[key] = self._warm.pop(key, []) + [warm]  # most recently used last
    while len(self._warm) > self._max_commands:
      oldest = next(iter(self._warm))
      await asyncio.gather(*(self._discard(w) for w in self._warm.pop(oldest)))

  async def _start(self, command: str, env: dict[str, str], module: bytes,
                   prefix: bytes) -> _Warm | None:
    """A process running `command` in a fresh folder that has read `prefix` from a pipe and
    waits for the rest of its input."""
    shim = await self._shim_path()
    if shim is None:
      return None
    rel = input_path(command)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="warm-", dir=self._scratch))
    module_file = nvcc_split.module_id_file(command)
    if module_file:
      (folder / module_file).parent.mkdir(parents=True, exist_ok=True)
      (folder / module_file).write_bytes(module)
    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / rel).write_bytes(prefix)  # for diagnostics that reread header lines meanwhile
    before = frozenset(_files(folder))
    read_end, write_end = os.pipe()
    here = shlex.quote(str(folder / pathlib.Path(rel).name))
    warm_command = _ORIG_PATH_RE.sub(f" --orig_src_path_name {here}", command)
    child_env = dict(self._env, LD_PRELOAD=str(shim), DICE_WARM_PATH=rel,
                     DICE_WARM_FD=str(read_end))
    argv = nvcc_split.shell(env, ["exec " + warm_command])
    confinement = self._confinement
    if confinement is not None and confinement.wrapper is not None:
      argv = confinement.argv(argv, rw=folder, reads=(str(shim),), nice=self._nice)
    else:
      argv = compile_procs.nice_prefix(self._nice, self._env) + argv
    try:
      with open(folder / ".warm-output", "wb") as output:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=folder,
            stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=asyncio.subprocess.STDOUT,
            env=child_env, pass_fds=(read_end,), start_new_session=True)
    except BaseException as e:  # the pipe closed, a process that did start reads to its end
      os.close(write_end)
      shutil.rmtree(folder, ignore_errors=True)
      if not isinstance(e, OSError):
        raise
      log.exception("could not start a warm front end")
      return None
    finally:
      os.close(read_end)
    fed = asyncio.ensure_future(asyncio.to_thread(_write_all, write_end, prefix))
    return _Warm(folder=folder, process=process, pipe=write_end, prefix=prefix, input=rel,
                 fed=fed, before=before | {".warm-output"})

  async def _finish(self, warm: _Warm, data: bytes, cwd: pathlib.Path) -> tuple[int, str] | None:
    """Feeds the rest of `data` to a warm process, waits for it and moves its outputs to `cwd`."""
    try:
      staged = warm.folder / (warm.input + ".whole")
      staged.write_bytes(data)
      os.replace(staged, warm.folder / warm.input)  # diagnostics now reread the whole file
      await asyncio.shield(warm.fed)
      warm.fed = asyncio.ensure_future(asyncio.to_thread(_write_all, warm.pipe,
                                                         data[len(warm.prefix):]))
      await asyncio.shield(warm.fed)
      os.close(warm.pipe)
      warm.pipe = -1
      rc = await warm.process.wait()
    except OSError:  # the process died (broken pipe): run the tool as usual
      await self._discard(warm)
      return None
    except BaseException:
      await self._discard(warm)
      raise
    if rc < 0:  # killed by a signal: not the source's doing, run it as usual
      await self._discard(warm)
      return None
    output = _head(warm.folder / ".warm-output", self._confinement)
    for name in _files(warm.folder) - warm.before:
      target = cwd / name
      target.parent.mkdir(parents=True, exist_ok=True)
      os.replace(warm.folder / name, target)
    shutil.rmtree(warm.folder, ignore_errors=True)
    self.claimed += 1
    return rc, output

  async def _discard(self, warm: _Warm) -> None:
    """Kills the process, then closes the pipe once no thread writes to it any more (the
    writer fails at once when the reader is gone; closing first could let it write into
    whatever file reuses the descriptor)."""
    if warm.process.returncode is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(warm.process.pid, signal.SIGKILL)
      await warm.process.wait()
    await asyncio.gather(asyncio.shield(warm.fed), return_exceptions=True)
    if warm.pipe >= 0:
      os.close(warm.pipe)
      warm.pipe = -1
    shutil.rmtree(warm.folder, ignore_errors=True)

  async def _shim_path(self) -> pathlib.Path | None:
    if self._shim is None:
      self._shim = asyncio.ensure_future(_build_shim(self._shim_dir, self._env))
    return await asyncio.shield(self._shim)


# ---------------------------------------------------------------------------- helpers

async def _build_shim(folder: pathlib.Path, env: dict[str, str]) -> pathlib.Path | None:
  """The preloaded library, compiled once per source text (None if the host cannot)."""
  source = SHIM.read_bytes()
  target = folder / f"dice_warm_{hashlib.sha256(source).hexdigest()[:16]}.so"
  if target.is_file():
    return target
  cc = shutil.which("cc", path=env.get("PATH")) or shutil.which("gcc", path=env.get("PATH"))
  if cc is None:
    log.warning("warm front ends off: no C compiler on PATH")
    return None
  folder.mkdir(parents=True, exist_ok=True)
  partial = folder / f"{target.name}.{os.getpid()}.tmp"
  process = await asyncio.create_subprocess_exec(
      cc, "-O2", "-shared", "-fPIC", "-x", "c", str(SHIM), "-o", str(partial), "-ldl",
      stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
  output, _ = await process.communicate()
  if process.returncode != 0:
    log.warning("warm front ends off: the preload library did not compile:\n%s",
                output.decode(errors="replace")[-2000:])
    partial.unlink(missing_ok=True)
    return None
  os.replace(partial, target)
  return target


def _head(path: pathlib.Path, confinement: confine_lib.Confinement | None) -> str:
  """A warm process's output, as much of it as the runner would read back."""
  cap = confinement.limits.output_bytes if confinement is not None else None
  with open(path, "rb") as f:
    return f.read(cap if cap is not None else -1).decode("utf-8", "replace")


def _key(command: str, env: dict[str, str], module: bytes) -> str:
  """What a warm process must share with an input's command: its argv but the source path,
  nvcc's environment and the module id."""
  plain = _ORIG_PATH_RE.sub("", command)
  return hashlib.sha256(repr((plain, sorted(env.items()), module)).encode()).hexdigest()


def _copy_inputs(src: pathlib.Path, dst: pathlib.Path, names: list[str]) -> None:
  for name in names:
    if name and (src / name).is_file():
      (dst / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(src / name, dst / name)


def _files(folder: pathlib.Path) -> set[str]:
  return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _outputs(folder: pathlib.Path, inputs: list[str]) -> dict[str, bytes]:
  """The files a front end wrote in `folder`: everything but its inputs."""
  return {name: (folder / name).read_bytes() for name in _files(folder) - set(inputs)}


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    written = os.write(fd, view)
    view = view[written:]
