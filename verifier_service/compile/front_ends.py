"""Warm front ends: nvcc's cudafe++ and cicc, started before the candidate on the shared headers.

A lone compile's critical path is nvcc's host front end (cudafe++) and then the host compile
(benchmarks/verifier_compile.py --steps: on the H200 box cudafe++'s chain is 4.8-6.8 s of a
7.4-12.6 s build). Both front ends spend most of that parsing the headers, and at a light tier
those come first and are the same for every candidate: the preprocessed text up to the line that
returns to the candidate's own file is byte for byte the same (nvcc_split.py, host_pch.py). The
front ends read their input as a stream, parsing as they go. So one of each is started ahead of
time, reading its input through a pipe (warm_shim.c, preloaded, turns the tool's first open of
the input into a read of the pipe): the server writes the shared prefix at once and the tool
parses it. Having read the prefix, the process becomes a fork server: for each candidate whose
preprocessed file starts with exactly that prefix, the server puts the whole file and the rest
after the prefix in a folder of its own and asks; a forked child (the parsed headers shared
copy-on-write) reads the rest, finishes with the candidate's own code and its end-of-file work and
writes its output files there, which are then moved into the build's folder. One warm process
per command serves every candidate of a burst at once, and the headers are parsed once per
command, not once per candidate.

Why the output cannot differ: the tool reads the same bytes in the same order through the same
stdio calls (fread returns short only at end of file on a stream too; ftell reports the bytes
consumed), with the same arguments save `--orig_src_path_name` (the warm folder instead of the
build's; it does not reach any output file, tested), the same module id file and the same
environment; a child is that process as it stood at the end of the prefix (fork; the front ends
run one thread), reading the rest through the same stream, with what the server printed so far
flushed and put first in its output. Diagnostics that reread source lines find the real file at
the input's path (the prefix while it is parsed, then, in a child's folder, the whole file).
Checked, not assumed: a command's first warm run (the server's start-up probe, compiler.py) also
runs the tool as usual and compares return codes, printed output and every output file byte for
byte; any difference switches warm front ends off for that command, and the warning says what
differed (`describe_difference`: on the H200 RL burst of 2026-12-04 17:20 UTC a cicc command was
switched off so, and what differed was not logged then).
tests/verifier/test_verifier_front_ends.py does the same with real nvcc, for a burst too.

Decisions:
- Any mismatch (another prefix, a dead warm process, a pipe error, a child killed by a signal)
  falls back to running the tool as usual.
- One warm process per command (the tool's argv without `--orig_src_path_name`, nvcc's
  environment and the module id), for at most `max_commands` commands (the least recently used
  are killed): each holds a parsed translation unit in memory (cicc on torch/types.h peaked at
  1.5 GB; less on the lite tier), which its children share. Before the fork server, a warm
  process was used once and replaced in the background: a burst's candidates mostly missed it,
  and every replacement parsed the headers again.
- While a command's first warm run is being checked, its other candidates run as usual.
- A child's CPU time (its waiter's wait4) is recorded with the build's step; a cancelled build
  kills its child, never the fork server.
- Warm processes run outside the compiler slot pool (they wait, mostly); a child holds a slot
  while it runs (`slot`). Both run at the compilers' nice level, confined and bounded as every
  compiler process is (confine.py; rlimits only, no cgroup of their own; a child's CPU-time bound
  counts from its fork). The usual run of a command's first warm run goes through the compiler
  pool (`run`). A child that went over a bound (`_over_a_bound`) is run again as usual, so
  the bound is named as for any compile.
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
from typing import Callable

from verifier_service.compile import cache as cache_lib
from verifier_service.compile import confine as confine_lib
from verifier_service.compile import limits as limits_lib
from verifier_service.compile import nvcc_split
from verifier_service.compile import procs as compile_procs

log = logging.getLogger(__name__)

SHIM = pathlib.Path(__file__).with_name("warm_shim.c")
_ORIG_PATH_RE = re.compile(r'\s--orig_src_path_name\s+("[^"]*"|\S+)')
_MAIN_FILE_RE = re.compile(rb'# 0 "([^"\n]+)"\n')
# In a warm folder (and each child's): the printed output; in a child's: its input after the prefix.
OUTPUT, REST = ".output", ".rest"


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
  """One started front end (a fork server once it has parsed the prefix): its folder, process,
  pipes, what it was given and the children it is running."""
  folder: pathlib.Path
  process: asyncio.subprocess.Process
  pipe: int  # write end of the prefix pipe (kept open: the tool never reads past the prefix)
  requests: int  # write end of the request pipe
  prefix: bytes
  input: str  # relative path it reads
  module_file: str | None
  module: bytes
  fed: asyncio.Future  # the thread writing the prefix to the pipe
  results: asyncio.Future | None = None  # reads the waiters' reports
  pending: dict[str, asyncio.Future] = dataclasses.field(default_factory=dict)
  count: int = 0

  @property
  def alive(self) -> bool:
    return self.process.returncode is None and self.requests >= 0


class FrontEnds:
  """Warm cudafe++ and cicc processes; `run` is nvcc_split's `front_end` hook."""

  def __init__(self, scratch: pathlib.Path, shim_dir: pathlib.Path, env: dict[str, str],
               run: nvcc_split.RunFn, nice: int = 10, max_commands: int = 2,
               confinement: confine_lib.Confinement | None = None,
               slot: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None):
    self._confinement = confinement
    self._scratch = scratch
    self._shim_dir = shim_dir
    self._env = env
    self._run = run  # runs the usual front end of a command's first warm run, to compare
    self._slot = slot  # a compiler slot, held while a child runs
    self._nice = nice
    self._max_commands = max_commands
    self._warm: dict[str, list[_Warm]] = {}  # command key -> its fork server (LRU order)
    self._starting: set[str] = set()  # command keys whose fork server is being started
    self._tasks: set[asyncio.Task] = set()
    self._off: dict[str, str] = {}  # command key -> why warm front ends are off for it
    self._checked: set[str] = set()  # command keys whose first warm run matched the usual one
    self._checking: set[str] = set()  # command keys whose first warm run is being compared
    self._shim: asyncio.Task | None = None
    self.claimed = 0  # compiles that finished in a warm process
    self.missed = 0  # front-end runs with no matching warm process
    self.cpu_s = 0.0  # the children's CPU time

  # ------------------------------------------------------------------ the hook

  async def run(self, command: str, env: dict[str, str],
                cwd: pathlib.Path) -> tuple[int, str] | None:
    """Finishes `command` (a cudafe++ or cicc step of nvcc's dry run, run in `cwd`) in a child
    of a warm process that holds the prefix of its input; otherwise starts one for the next
    input and returns None."""
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
    if key in self._off or key in self._checking:
      return None
    pool = self._warm.get(key, [])
    warm = next((w for w in pool if w.alive and data.startswith(w.prefix)), None)
    if warm is not None:
      self._warm[key] = self._warm.pop(key)  # most recently used last
      began = time.monotonic()
      if key not in self._checked:
        self._checking.add(key)
        try:
          result = await self._check(key, warm, command, env, cwd, data)
        finally:
          self._checking.discard(key)
        cpu_s = None
      else:
        result, cpu_s = await self._finish(warm, data, cwd)
      if result is None and not warm.alive:
        await self._drop(key, warm)
      trace = compile_procs.STEPS.get()
      if trace is not None and result is not None:
        trace.add(f"{nvcc_split.front_end_tool(command)} (warm)", began, began,
                  time.monotonic(), cpu_s)
      return result
    self.missed += 1
    if pool:  # dead, or parsed a prefix this input does not have: start over on this input's
      await asyncio.gather(*(self._drop(key, w) for w in list(pool)))
    self._refill(key, command, env, module, data)
    return None

  async def _check(self, key: str, warm: _Warm, command: str, env: dict[str, str],
                   cwd: pathlib.Path, data: bytes) -> tuple[int, str] | None:
    """A command's first warm run: the tool also runs as usual, in a scratch copy of its inputs,
    and return codes, printed output and every output file must match; if anything differs,
    warm front ends are off for the command and the usual run's result stands."""
    inputs = [input_path(command), nvcc_split.module_id_file(command)]
    with tempfile.TemporaryDirectory(dir=self._scratch, prefix="warm-check-") as scratch:
      cold, hot = pathlib.Path(scratch) / "plain", pathlib.Path(scratch) / "warm"
      for folder in (cold, hot):
        _copy_inputs(cwd, folder, inputs)
      plain, (result, _) = await asyncio.gather(
          self._run(nvcc_split.shell(env, [command]), cold), self._finish(warm, data, hot))
      difference = describe_difference(plain, result, _outputs(cold, inputs),
                                       _outputs(hot, inputs))
      same = not difference
      chosen = hot if same else cold
      for name in _outputs(chosen, inputs):
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(chosen / name, cwd / name)
    if same:
      self._checked.add(key)
    elif result is not None:  # a child that did not finish says nothing about the outputs
      self._off[key] = f"its first warm run's outputs differed from the usual run's: {difference}"
      log.warning("warm front ends off for a %s command: %s",
                  nvcc_split.front_end_tool(command), self._off[key])
    return plain

  async def settle(self) -> None:
    """Waits for warm processes being started (not for them to finish parsing) and for the
    folders of cancelled builds' children to be removed (`_remove_again`)."""
    while self._tasks:
      await asyncio.gather(*self._tasks, return_exceptions=True)

  async def close(self) -> None:
    """Kills every warm process and its children and removes its folder."""
    for task in list(self._tasks):
      task.cancel()
    await asyncio.gather(*self._tasks, return_exceptions=True)
    warm = [w for pool in self._warm.values() for w in pool]
    self._warm = {}
    await asyncio.gather(*(self._discard(w) for w in warm), return_exceptions=True)
    if self._shim is not None:
      self._shim.cancel()
      await asyncio.gather(self._shim, return_exceptions=True)

  def stats(self) -> dict[str, float]:
    """Warm processes, claims, misses, commands switched off, the children's CPU seconds and
    the live warm processes' own (their trees' /proc figures, without reaped children)."""
    return {"warm_front_ends": sum(len(pool) for pool in self._warm.values()),
            "warm_claimed": self.claimed, "warm_missed": self.missed,
            "warm_off": len(self._off), "warm_cpu_s": round(self.cpu_s, 3),
            "warm_server_cpu_s": round(sum(_tree_cpu_s(w.process.pid)
                                           for pool in self._warm.values() for w in pool), 3)}

  # ------------------------------------------------------------------ processes

  def _refill(self, key: str, command: str, env: dict[str, str], module: bytes,
              data: bytes) -> None:
    """Starts the fork server for `key` in the background, unless one is ready or starting, on
    the header prefix of `data` (an input of the command) and the module id `module` (read now:
    the build's folder may be gone by the time it starts)."""
    cut = header_prefix(data)
    if cut == 0 or key in self._starting or self._warm.get(key):
      return
    self._starting.add(key)
    task = asyncio.ensure_future(self._add(key, command, env, module, data[:cut]))
    self._tasks.add(task)
    task.add_done_callback(self._tasks.discard)

  async def _add(self, key: str, command: str, env: dict[str, str], module: bytes,
                 prefix: bytes) -> None:
    try:
      warm = await self._start(command, env, module, prefix)
    finally:
      self._starting.discard(key)
    if warm is None:
      return
    self._warm[key] = self._warm.pop(key, []) + [warm]  # most recently used last
    while len(self._warm) > self._max_commands:
      oldest = next(iter(self._warm))
      await asyncio.gather(*(self._discard(w) for w in self._warm.pop(oldest)))

  async def _drop(self, key: str, warm: _Warm) -> None:
    pool = self._warm.get(key, [])
    if warm in pool:
      pool.remove(warm)
      if not pool:
        del self._warm[key]
    await self._discard(warm)

  async def _start(self, command: str, env: dict[str, str], module: bytes,
                   prefix: bytes) -> _Warm | None:
    """A process running `command` in a fresh folder that reads `prefix` from a pipe and then
    serves forks (warm_shim.c)."""
    shim = await self._shim_path()
    if shim is None:
      return None
    rel = input_path(command)
    assert rel is not None
    folder = pathlib.Path(tempfile.mkdtemp(prefix="warm-", dir=self._scratch))
    module_file = nvcc_split.module_id_file(command)
    if module_file:
      (folder / module_file).parent.mkdir(parents=True, exist_ok=True)
      (folder / module_file).write_bytes(module)
    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / rel).write_bytes(prefix)  # for diagnostics that reread header lines meanwhile
    here = shlex.quote(str(folder / pathlib.Path(rel).name))
    warm_command = _ORIG_PATH_RE.sub(f" --orig_src_path_name {here}", command)
    argv = nvcc_split.shell(env, ["exec " + warm_command])
    confinement = self._confinement
    if confinement is not None and confinement.wrapper is not None:
      argv = confinement.argv(argv, rw=folder, reads=(str(shim),), nice=self._nice)
    else:
      argv = compile_procs.nice_prefix(self._nice, self._env) + argv
    feed_r, feed_w = os.pipe()
    req_r, req_w = os.pipe()
    res_r, res_w = os.pipe()
    ours, theirs = (feed_w, req_w, res_r), (feed_r, req_r, res_w)
    child_env = dict(self._env, LD_PRELOAD=str(shim), DICE_WARM_PATH=rel,
                     DICE_WARM_FD=str(feed_r), DICE_WARM_PREFIX=str(len(prefix)),
                     DICE_WARM_REQ=str(req_r), DICE_WARM_RES=str(res_w))
    try:
      with open(folder / OUTPUT, "wb") as output:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=folder,
            stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=asyncio.subprocess.STDOUT,
            env=child_env, pass_fds=theirs, start_new_session=True)
    except BaseException as e:  # the pipe closed, a process that did start reads to its end
      for fd in ours:
        os.close(fd)
      shutil.rmtree(folder, ignore_errors=True)
      if not isinstance(e, OSError):
        raise
      log.exception("could not start a warm front end")
      return None
    finally:
      for fd in theirs:
        os.close(fd)
    fed = asyncio.ensure_future(asyncio.to_thread(_write_all, feed_w, prefix))
    warm = _Warm(folder=folder, process=process, pipe=feed_w, requests=req_w, prefix=prefix,
                 input=rel, module_file=module_file, module=module, fed=fed)
    warm.results = asyncio.ensure_future(self._read_results(warm, res_r))
    return warm

  async def _read_results(self, warm: _Warm, fd: int) -> None:
    """Hands each waiter's report (`NAME STATUS CPU_US`) to the build waiting on NAME; at the
    end of the pipe (the server and every waiter gone), fails whatever still waits."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    try:
      while line := await reader.readline():
        try:
          name, status, cpu_us = line.decode().split()
          report = (int(status), int(cpu_us) / 1e6)
        except ValueError:
          log.error("a warm front end's report is malformed: %r", line[:200])
          continue
        future = warm.pending.pop(name, None)
        if future is not None and not future.done():
          future.set_result(report)
    finally:
      transport.close()
      for future in warm.pending.values():
        if not future.done():
          future.set_exception(BrokenPipeError("the warm front end ended"))
      warm.pending.clear()

  async def _finish(self, warm: _Warm, data: bytes,
                    cwd: pathlib.Path) -> tuple[tuple[int, str] | None, float | None]:
    """Runs the rest of `data` in a child of `warm`, moves its outputs to `cwd`: its return
    code and printed output (None: run the tool as usual) and its CPU seconds."""
    warm.count += 1
    name = f"c{warm.count}"
    child = warm.folder / name
    future = asyncio.get_running_loop().create_future()
    try:
      async with self._slot() if self._slot is not None else contextlib.nullcontext():
        child.mkdir()
        (child / warm.input).parent.mkdir(parents=True, exist_ok=True)
        (child / warm.input).write_bytes(data)  # diagnostics reread the whole file
        if warm.module_file:
          (child / warm.module_file).parent.mkdir(parents=True, exist_ok=True)
          (child / warm.module_file).write_bytes(warm.module)
        (child / REST).write_bytes(data[len(warm.prefix):])
        ours = _files(child) | {OUTPUT}
        warm.pending[name] = future
        os.write(warm.requests, f"{name}\n".encode())
        status, cpu_s = await future
    except OSError:  # the server is gone (broken pipe): run the tool as usual
      warm.pending.pop(name, None)
      shutil.rmtree(child, ignore_errors=True)
      if warm.requests >= 0:
        os.close(warm.requests)
        warm.requests = -1
      return None, None
    except BaseException:  # cancelled: its child goes, the server stays
      warm.pending.pop(name, None)
      with contextlib.suppress(OSError):
        if warm.requests >= 0:
          os.write(warm.requests, f"k {name}\n".encode())
      shutil.rmtree(child, ignore_errors=True)
      task = asyncio.ensure_future(_remove_again(child))
      self._tasks.add(task)  # `settle` waits for it, `close` cancels it
      task.add_done_callback(self._tasks.discard)
      raise
    self.cpu_s += cpu_s
    if status < 0 or not os.WIFEXITED(status):  # not forked, or killed by a signal: not the
      shutil.rmtree(child, ignore_errors=True)  # source's doing, run it as usual
      return None, None
    printed = [warm.folder / OUTPUT, child / OUTPUT]
    output = _head(printed, self._confinement)
    if self._over_a_bound(os.WEXITSTATUS(status), printed, output):
      shutil.rmtree(child, ignore_errors=True)  # the usual run names the bound (procs.py)
      return None, None
    for found in _files(child) - ours:
      target = cwd / found
      target.parent.mkdir(parents=True, exist_ok=True)
      os.replace(child / found, target)
    shutil.rmtree(child, ignore_errors=True)
    self.claimed += 1
    return (os.WEXITSTATUS(status), output), cpu_s

  def _over_a_bound(self, code: int, printed: list[pathlib.Path], output: str) -> bool:
    """Whether a child went over a bound that a usual run would have been stopped at
    (procs.ProcessRunner: LimitExceeded). Its exit alone does not say: the front ends ignore
    SIGXFSZ, so a child printing past the output bound exits 0 with its output cut, and one out
    of memory fails in the front end's own words, which the compiler would retry at a heavier
    tier where the usual run's LimitExceeded ends the build (tests/verifier/
    test_verifier_front_ends.py's hostile candidates). Such a compile is run as usual instead, so
    its verdict never depends on whether a front end was warm."""
    if self._confinement is None:
      return False
    limits = self._confinement.limits
    size = sum(path.stat().st_size for path in printed if path.is_file())
    return size > limits.output_bytes or (
        code != 0 and limits_lib.exceeded(None, output, limits) is not None)

  async def _discard(self, warm: _Warm) -> None:
    """Kills the process (its children die with it), then closes the pipes once no thread
    writes to them any more (the writer fails at once when the reader is gone; closing first
    could let it write into whatever file reuses the descriptor)."""
    if warm.process.returncode is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(warm.process.pid, signal.SIGKILL)
      await warm.process.wait()
    await asyncio.gather(asyncio.shield(warm.fed), return_exceptions=True)
    for attr in ("pipe", "requests"):
      if getattr(warm, attr) >= 0:
        os.close(getattr(warm, attr))
        setattr(warm, attr, -1)
    if warm.results is not None:
      await asyncio.gather(warm.results, return_exceptions=True)
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
  partial = cache_lib.partial_path(target)
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


async def _remove_again(folder: pathlib.Path) -> None:
  """A cancelled build's child dies with its waiter (PR_SET_PDEATHSIG) a moment after the kill was
  asked for, and may write into its folder until then, after the folder was first removed: it is
  removed again once the child is surely gone."""
  for delay in (0.1, 1.0):
    await asyncio.sleep(delay)
    await asyncio.to_thread(shutil.rmtree, folder, True)


def _head(paths: list[pathlib.Path], confinement: confine_lib.Confinement | None) -> str:
  """A warm process's printed output (what the server printed while parsing the prefix, then
  what the child printed), as much of it as the runner would read back."""
  cap = confinement.limits.output_bytes if confinement is not None else None
  text = b""
  for path in paths:
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
      text += f.read()
  return (text[:cap] if cap is not None else text).decode("utf-8", "replace")


def _tree_cpu_s(pid: int) -> float:
  """User+system CPU seconds of `pid` and its live descendants, each its own (not its reaped
  children's); 0 for what is gone."""
  total, todo = 0.0, [pid]
  while todo:
    here = todo.pop()
    try:
      fields = pathlib.Path(f"/proc/{here}/stat").read_text().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
      todo += [int(c) for c in
               pathlib.Path(f"/proc/{here}/task/{here}/children").read_text().split()]
    except (OSError, ValueError, IndexError):
      continue
  return total


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


def describe_difference(plain: tuple[int, str], warm: tuple[int, str] | None,
                        plain_files: dict[str, bytes], warm_files: dict[str, bytes]) -> str:
  """What differs between a tool's usual run and its warm run ("" when nothing does): return
  codes, printed output (lengths and where it first differs) and output files (names, sizes)."""
  if warm is None:
    return "the warm run did not finish"
  parts = []
  if warm[0] != plain[0]:
    parts.append(f"return code {warm[0]} (usual {plain[0]})")
  if warm[1] != plain[1]:
    at = len(os.path.commonprefix([plain[1], warm[1]]))
    parts.append(f"printed output of {len(warm[1])} characters (usual {len(plain[1])}), first "
                 f"differing at {at}: {warm[1][at:at + 80]!r} (usual {plain[1][at:at + 80]!r})")
  if set(warm_files) != set(plain_files):
    parts.append(f"output files {sorted(warm_files)} (usual {sorted(plain_files)})")
  changed = sorted(name for name in set(warm_files) & set(plain_files)
                   if warm_files[name] != plain_files[name])
  if changed:
    parts.append("contents of " + ", ".join(
        f"{name} ({len(warm_files[name])} bytes, usual {len(plain_files[name])})"
        for name in changed))
  return "; ".join(parts)


def _outputs(folder: pathlib.Path, inputs: list[str]) -> dict[str, bytes]:
  """The files a front end wrote in `folder`: everything but its inputs."""
  return {name: (folder / name).read_bytes() for name in _files(folder) - set(inputs)}


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    written = os.write(fd, view)
    view = view[written:]
