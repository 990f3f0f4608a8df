"""Stage 2: the verifier's own `load_inline` build path, fast and cached.

What is built is exactly what `torch.utils.cpp_extension.load_inline` builds (buildspec.py: the
same main.cpp and cuda.cu, the flags of torch's own ninja writer, torch's link line). Four things
make it fast (measured in `benchmarks/verifier_compile.py`):

1. Lighter CUDA translation unit: `#include <torch/extension.h>` in the CUDA sources is rewritten to
   `<torch/types.h>` (the C++ frontend and pybind11 are what make extension.h slow, and kernels
   never need them). If that build fails, the original source is compiled instead, so a verdict is
   never different from the naive path's; only its cost is.
2. A g++ precompiled header of `torch/extension.h` for `main.cpp`, built once per toolchain and
   flag set and reused by every build (used only when the candidate adds no C++ flags of its own).
3. Both translation units compile concurrently; a pool bounds concurrent compiler processes.
4. A content-addressed cache per object file and per linked module: a phase-1 (infilling) problem
   keeps its C++ scaffold fixed, so across rollouts only `cuda.cu` is ever compiled again.

Compilers run as their own process group; a deadline or a cancelled request kills the group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import re
import shlex
import shutil
import signal
import tempfile
import time

from verifier_service import buildspec
from verifier_service import singleflight
from verifier_service import sources
from verifier_service import toolchain as toolchain_lib

log = logging.getLogger(__name__)

_PCH_HEADER = "torch_extension_pch.h"
_NAME_DEFINE_RE = re.compile(r"^-DTORCH_EXTENSION_NAME=")


@dataclasses.dataclass
class BuildResult:
  """One extension's build: the module path, or the (bounded) compiler log of the failure."""
  ok: bool
  so_path: str = ""
  log: str = ""
  log_truncated: bool = False
  cache_hit: bool = False
  cache_key: str = ""
  light_header: bool = False
  pch_used: bool = False
  timed_out: bool = False
  duration_s: float = 0.0


def _digest(*parts: object) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def bound_log(text: str, limit: int) -> tuple[str, bool]:
  """Keeps the head and the tail of a long compiler log (errors are usually at one end)."""
  data = text.encode("utf-8", "replace")
  if len(data) <= limit:
    return text, False
  half = limit // 2
  head = data[:half].decode("utf-8", "ignore")
  tail = data[-half:].decode("utf-8", "ignore")
  return f"{head}\n... [{len(data) - 2 * half} bytes cut] ...\n{tail}", True


class _ProcessFailed(Exception):

  def __init__(self, log_text: str):
    super().__init__(log_text[-200:])
    self.log = log_text


class Compiler:
  """Builds InlineExtensions into loadable modules; a process pool with a content cache."""

  def __init__(self, toolchain: toolchain_lib.Toolchain, cache_dir: pathlib.Path,
               max_jobs: int, max_log_bytes: int = 64 << 10, use_pch: bool = True,
               light_headers: bool = True):
    self.toolchain = toolchain
    self.cache_dir = pathlib.Path(cache_dir)
    self.max_jobs = max_jobs
    self.max_log_bytes = max_log_bytes
    self.use_pch = use_pch
    self.light_headers = light_headers
    self._jobs = asyncio.Semaphore(max_jobs)
    self._flags: dict[tuple, buildspec.BuildFlags] = {}
    self._builds: singleflight.SingleFlight[BuildResult] = singleflight.SingleFlight()
    self._objects: singleflight.SingleFlight[str] = singleflight.SingleFlight()
    self._pch: dict[str, asyncio.Task[str | None]] = {}
    self.hits = 0
    self.misses = 0
    for sub in ("obj", "so", "builds", "pch", "tmp"):
      (self.cache_dir / sub).mkdir(parents=True, exist_ok=True)

  # ------------------------------------------------------------------ public

  def flags(self, ext: sources.InlineExtension) -> buildspec.BuildFlags:
    with_cuda = bool(ext.cuda_sources) if ext.with_cuda is None else ext.with_cuda
    key = (ext.name, ext.extra_cflags, ext.extra_cuda_cflags, ext.extra_ldflags,
           ext.extra_include_paths, with_cuda)
    if key not in self._flags:
      self._flags[key] = buildspec.torch_build_flags(ext, with_cuda, self.toolchain)
    return self._flags[key]

  def build_key(self, ext: sources.InlineExtension) -> str:
    main_text, cuda_text = buildspec.render_sources(ext)
    return _digest("build", self.toolchain.fingerprint, dataclasses.asdict(self.flags(ext)),
                   ext.name, main_text, cuda_text)

  async def build(self, ext: sources.InlineExtension, timeout_s: float) -> BuildResult:
    """Builds (or fetches from cache) one extension within `timeout_s` seconds."""
    start = time.monotonic()
    key = self.build_key(ext)
    record = self._read_record(key)
    if record is not None:
      self.hits += 1
      return dataclasses.replace(record, cache_hit=True, duration_s=time.monotonic() - start)
    self.misses += 1
    try:
      async with asyncio.timeout(timeout_s):
        result = await self._builds.run(key, lambda: self._build(ext, key))
    except TimeoutError:
      return BuildResult(ok=False, timed_out=True, cache_key=key,
                         log=f"compile did not finish within {timeout_s:.1f} s",
                         duration_s=time.monotonic() - start)
    return dataclasses.replace(result, duration_s=time.monotonic() - start)

  async def close(self) -> None:
    """Cancels precompiled-header builds still running and reaps their compilers."""
    for task in self._pch.values():
      task.cancel()
    await asyncio.gather(*self._pch.values(), return_exceptions=True)

  def stats(self) -> dict[str, int]:
    """Cache entries, hits, misses and bytes on disk."""
    size = 0
    for root, _, files in os.walk(self.cache_dir):
      for name in files:
        try:
          size += os.path.getsize(os.path.join(root, name))
        except OSError:
          pass
    entries = sum(1 for _ in (self.cache_dir / "builds").glob("*.json"))
    return {"entries": entries, "hits": self.hits, "misses": self.misses, "size_bytes": size}

  async def warm_up(self) -> str | None:
    """Builds the precompiled header for the default flag set ahead of the first request."""
    probe = sources.InlineExtension(name="dice_warmup", cpp_sources=(), cuda_sources=("",),
                                    functions=())
    return await self._ensure_pch(self.flags(probe))

  # ------------------------------------------------------------------ records

  def _record_path(self, key: str) -> pathlib.Path:
    return self.cache_dir / "builds" / f"{key}.json"

  def _read_record(self, key: str) -> BuildResult | None:
    try:
      data = json.loads(self._record_path(key).read_text())
    except (OSError, ValueError):
      return None
    result = BuildResult(**data)
    if result.ok and not os.path.isfile(result.so_path):
      return None
    return result

  def _write_record(self, key: str, result: BuildResult) -> None:
    tmp = self.cache_dir / "tmp" / f"{key}.{os.getpid()}.json"
    tmp.write_text(json.dumps(dataclasses.asdict(result)))
    os.replace(tmp, self._record_path(key))

  # ------------------------------------------------------------------ building

  async def _build(self, ext: sources.InlineExtension, key: str) -> BuildResult:
    flags = self.flags(ext)
    main_text, cuda_text = buildspec.render_sources(ext)
    want_pch = self.use_pch and not ext.no_implicit_headers and not ext.extra_cflags and not (
        ext.extra_include_paths)
    pch = None

    async def main_object() -> str:
      # Waits for the precompiled header (if still building); cuda.cu is not held up by it.
      nonlocal pch
      pch = await self._ensure_pch(flags) if want_pch else None
      cmd = list(flags.cxx) + (["-include", pch, "-Winvalid-pch"] if pch else [])
      cmd += list(flags.cflags) + ["-c", "{src}", "-o", "{out}"] + list(flags.post_cflags)
      return await self._object(cmd, main_text, "main.cpp")

    cuda_cmd = list(flags.nvcc) + list(flags.cuda_cflags) + ["-c", "{src}", "-o", "{out}"] + list(
        flags.cuda_post_cflags)
    light = buildspec.lighten(cuda_text) if (cuda_text and self.light_headers) else None

    async def cuda_object(allow_light: bool) -> tuple[str, bool]:
      if light is not None and allow_light:
        try:
          return await self._object(cuda_cmd, light, "cuda.cu"), True
        except _ProcessFailed:
          log.info("light CUDA build failed for %s; compiling the original source", ext.name)
      return await self._object(cuda_cmd, cuda_text, "cuda.cu"), False

    tasks = [asyncio.ensure_future(main_object())]
    if cuda_text is not None:
      tasks.append(asyncio.ensure_future(cuda_object(allow_light=True)))
    try:
      done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
      for task in done:
        if isinstance(task.exception(), _ProcessFailed):
          return self._failed(key, task.exception().log)
      main_obj = tasks[0].result()
      cuda_obj, used_light = tasks[1].result() if len(tasks) > 1 else (None, False)
      try:
        so_path = await self._link(flags, ext.name, main_obj, cuda_obj)
      except _ProcessFailed as e:
        if not used_light:
          return self._failed(key, e.log)
        try:  # a light object that compiles but does not link: fall back to the original
          cuda_obj, used_light = await cuda_object(allow_light=False)
          so_path = await self._link(flags, ext.name, main_obj, cuda_obj)
        except _ProcessFailed as e2:
          return self._failed(key, e2.log)
    finally:
      for task in tasks:
        task.cancel()
      # Reap the other translation unit's compiler before returning (or propagating a cancel).
      await asyncio.gather(*tasks, return_exceptions=True)
    result = BuildResult(ok=True, so_path=so_path, cache_key=key, light_header=used_light,
                         pch_used=bool(pch))
    self._write_record(key, result)
    return result

  def _failed(self, key: str, log_text: str) -> BuildResult:
    text, truncated = bound_log(log_text, self.max_log_bytes)
    result = BuildResult(ok=False, log=text, log_truncated=truncated, cache_key=key)
    self._write_record(key, result)
    return result

  async def _object(self, cmd: list[str], text: str, filename: str) -> str:
    """Compiles one translation unit (cached by content and command); returns the .o path."""
    key = _digest("obj", self.toolchain.fingerprint, cmd, text)
    final = self.cache_dir / "obj" / key[:2] / key
    obj = final / (filename + ".o")
    if obj.is_file():
      return str(obj)
    failed = final / "error.log"
    if failed.is_file():
      raise _ProcessFailed(failed.read_text(errors="replace"))
    return await self._objects.run(key, lambda: self._compile(cmd, text, filename, final))

  async def _compile(self, cmd: list[str], text: str, filename: str,
                     final: pathlib.Path) -> str:
    work = pathlib.Path(tempfile.mkdtemp(prefix="tu-", dir=self.cache_dir / "tmp"))
    try:
      src = work / filename
      src.write_text(text, encoding="utf-8")
      out = work / (filename + ".o")
      argv = [a.format(src=src, out=out) if a in ("{src}", "{out}") else a for a in cmd]
      rc, output = await self._run(argv, cwd=work)
      output = output.replace(f"{work}/", "")  # the log names cuda.cu, not a scratch folder
      if rc < 0:  # killed by a signal (OOM killer, operator): not a property of the source
        raise _ProcessFailed(output + f"\ncompiler killed by signal {-rc}")
      final.parent.mkdir(parents=True, exist_ok=True)
      if rc != 0:
        (work / "error.log").write_text(output)
        out.unlink(missing_ok=True)
        self._publish(work, final)
        raise _ProcessFailed(output)
      self._publish(work, final)
      return str(final / out.name)
    finally:
      shutil.rmtree(work, ignore_errors=True)

  async def _link(self, flags: buildspec.BuildFlags, name: str, main_obj: str,
                  cuda_obj: str | None) -> str:
    objects = [main_obj] + ([cuda_obj] if cuda_obj else [])
    key = _digest("link", self.toolchain.fingerprint, name, objects, flags.ldflags)
    final = self.cache_dir / "so" / key[:2] / key
    so = final / f"{name}.so"
    if so.is_file():
      return str(so)
    work = pathlib.Path(tempfile.mkdtemp(prefix="so-", dir=self.cache_dir / "tmp"))
    try:
      argv = list(flags.cxx) + objects + list(flags.ldflags) + ["-o", str(work / so.name)]
      rc, output = await self._run(argv, cwd=work)
      if rc != 0:
        raise _ProcessFailed(output)
      final.parent.mkdir(parents=True, exist_ok=True)
      self._publish(work, final)
      return str(so)
    finally:
      shutil.rmtree(work, ignore_errors=True)

  @staticmethod
  def _publish(work: pathlib.Path, final: pathlib.Path) -> None:
    """Atomically moves a finished build folder into the cache (first writer wins)."""
    try:
      os.rename(work, final)
    except OSError:
      pass  # another process published the same content first

  async def _ensure_pch(self, flags: buildspec.BuildFlags) -> str | None:
    cflags = [f for f in flags.cflags if not _NAME_DEFINE_RE.match(f)]
    key = _digest("pch", self.toolchain.fingerprint, flags.cxx, cflags)
    header = self.cache_dir / "pch" / key / _PCH_HEADER
    if header.with_suffix(".h.gch").is_file():
      return str(header)
    if (header.parent / "error.log").is_file():
      return None
    # Shared by every build and never cancelled with one request: it outlives short deadlines.
    if key not in self._pch or (self._pch[key].done() and self._pch[key].cancelled()):
      self._pch[key] = asyncio.ensure_future(self._build_pch(flags.cxx, cflags, header))
    return await asyncio.shield(self._pch[key])

  async def _build_pch(self, cxx: tuple[str, ...], cflags: list[str],
                       header: pathlib.Path) -> str | None:
    # Servers sharing a cache folder build the (large, slow) header once: a file lock.
    lock_path = header.parent.with_suffix(".lock")
    with open(lock_path, "w") as lock:
      while True:
        try:
          fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
          break
        except BlockingIOError:
          await asyncio.sleep(0.5)
      try:
        if header.with_suffix(".h.gch").is_file():
          return str(header)
        if (header.parent / "error.log").is_file():
          return None
        return await self._build_pch_locked(cxx, cflags, header)
      finally:
        fcntl.flock(lock, fcntl.LOCK_UN)

  async def _build_pch_locked(self, cxx: tuple[str, ...], cflags: list[str],
                              header: pathlib.Path) -> str | None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="pch-", dir=self.cache_dir / "tmp"))
    try:
      (work / _PCH_HEADER).write_text("#include <torch/extension.h>\n")
      argv = list(cxx) + ["-x", "c++-header"] + cflags + [
          str(work / _PCH_HEADER), "-o", str(work / (_PCH_HEADER + ".gch"))]
      start = time.monotonic()
      rc, output = await self._run(argv, cwd=work)
      if rc != 0:
        log.warning("precompiled header failed; compiling without it: %s", output[-2000:])
        (work / "error.log").write_text(output)
      else:
        log.info("precompiled header built in %.1f s", time.monotonic() - start)
      self._publish(work, header.parent)
      return str(header) if rc == 0 else None
    finally:
      shutil.rmtree(work, ignore_errors=True)

  async def _run(self, argv: list[str], cwd: pathlib.Path) -> tuple[int, str]:
    """Runs a compiler in its own process group; kills the group if cancelled."""
    async with self._jobs:
      proc = await asyncio.create_subprocess_exec(
          *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
          stdin=asyncio.subprocess.DEVNULL, env=self.toolchain.build_env(),
          start_new_session=True)
      try:
        output, _ = await proc.communicate()
      except asyncio.CancelledError:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        await proc.wait()
        raise
      text = output.decode("utf-8", "replace")
      if proc.returncode != 0:
        text = f"$ {shlex.join(argv)}\n{text}"
      return proc.returncode, text
