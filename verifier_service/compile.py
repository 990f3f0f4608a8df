"""Stage 2: the verifier's own `load_inline` build path, fast and cached.

What is built is exactly what `torch.utils.cpp_extension.load_inline` builds (buildspec.py: the
same main.cpp and cuda.cu, the flags of torch's own ninja writer, torch's link line). What makes
it fast (each measured in `benchmarks/verifier_compile.py`):

1. Header tiers for cuda.cu (header_tiers.py): the lightest torch headers that build the source
   (lite, then torch/types.h, then the source as written), falling back on failure, so a verdict
   never differs from the naive path's; only its cost does.
2. nvcc's host and device front ends run concurrently (nvcc_split.py): less wall time, same work.
3. A g++ precompiled header of `torch/extension.h` for `main.cpp`, built once per toolchain and
   flag set (only when the candidate adds no C++ flags of its own); a header g++ would not use is
   reported and dropped.
4. Both translation units compile concurrently in a bounded process pool that serves the
   earliest request first (compile_procs.py).
5. A content-addressed cache per object file and per linked module: a phase-1 (infilling) problem
   keeps its C++ scaffold fixed, so across rollouts only `cuda.cu` is ever compiled again.

Compilers run as their own process group; a deadline or a cancelled request kills the group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
import time

from verifier_service import buildspec
from verifier_service import compile_procs
from verifier_service import header_tiers
from verifier_service import nvcc_split
from verifier_service import singleflight
from verifier_service import sources
from verifier_service import toolchain as toolchain_lib

log = logging.getLogger(__name__)

_PCH_HEADER = "torch_extension_pch.h"
_NAME_DEFINE_RE = re.compile(r"^-DTORCH_EXTENSION_NAME=")
_PCH_REJECTED_RE = re.compile(r"\.gch[^\n]*(not used|invalid)|cannot use precompiled", re.I)
_TIERS = (header_tiers.LITE, header_tiers.TYPES)

ProcessFailed = compile_procs.ProcessFailed  # kept importable from here


@dataclasses.dataclass
class BuildResult:
  """One extension's build: the module path, or the (bounded) compiler log of the failure."""
  ok: bool
  so_path: str = ""
  log: str = ""
  log_truncated: bool = False
  cache_hit: bool = False
  cache_key: str = ""
  header_tier: str = ""  # "lite", "types" or "original" (header_tiers.py)
  tier_notes: dict[str, str] = dataclasses.field(default_factory=dict)  # why lighter tiers weren't used
  pch_used: bool = False
  timed_out: bool = False
  duration_s: float = 0.0

  @property
  def light_header(self) -> bool:
    """cuda.cu was built with lighter torch headers than it names."""
    return self.header_tier in _TIERS


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


class Compiler:
  """Builds InlineExtensions into loadable modules; a process pool with a content cache."""

  def __init__(self, toolchain: toolchain_lib.Toolchain, cache_dir: pathlib.Path,
               max_jobs: int, max_log_bytes: int = 64 << 10, use_pch: bool = True,
               light_headers: bool = True, split_nvcc: bool = True):
    self.toolchain = toolchain
    self.cache_dir = pathlib.Path(cache_dir)
    self.max_jobs = max_jobs
    self.max_log_bytes = max_log_bytes
    self.use_pch = use_pch
    self.tiers = _TIERS if light_headers else ()
    self.split_nvcc = split_nvcc
    self._runner = compile_procs.ProcessRunner(max_jobs, toolchain.build_env())
    self._flags: dict[tuple, buildspec.BuildFlags] = {}
    self._builds: singleflight.SingleFlight[BuildResult] = singleflight.SingleFlight()
    self._objects: singleflight.SingleFlight[str] = singleflight.SingleFlight()
    self._pch: dict[str, asyncio.Task[str | None]] = {}
    self._envs: dict[str, asyncio.Task[header_tiers.Environment | None]] = {}
    self._arrivals = itertools.count(1)
    lite = (pathlib.Path(header_tiers.__file__).parent / "torch_lite.h").read_text()
    self._policy = _digest("policy", header_tiers.VERSION, lite, self.tiers, use_pch, split_nvcc)
    self.hits = 0
    self.misses = 0
    for sub in ("obj", "so", "builds", "pch", "headers", "tmp"):
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
    """Cache key of a build: toolchain (compilers, torch, arch list), flags, sources, and the
    build policy (header tiers and their headers, precompiled header, split nvcc)."""
    main_text, cuda_text = buildspec.render_sources(ext)
    return _digest("build", self.toolchain.fingerprint, dataclasses.asdict(self.flags(ext)),
                   ext.name, main_text, cuda_text, self._policy)

  async def build(self, ext: sources.InlineExtension, timeout_s: float) -> BuildResult:
    """Builds (or fetches from cache) one extension within `timeout_s` seconds."""
    start = time.monotonic()
    key = self.build_key(ext)
    record = self._read_record(key)
    if record is not None:
      self.hits += 1
      return dataclasses.replace(record, cache_hit=True, duration_s=time.monotonic() - start)
    self.misses += 1
    priority = compile_procs.PRIORITY.set(next(self._arrivals))
    try:
      async with asyncio.timeout(timeout_s):
        result = await self._builds.run(key, lambda: self._build(ext, key))
    except TimeoutError:
      return BuildResult(ok=False, timed_out=True, cache_key=key,
                         log=f"compile did not finish within {timeout_s:.1f} s",
                         duration_s=time.monotonic() - start)
    finally:
      compile_procs.PRIORITY.reset(priority)
    return dataclasses.replace(result, duration_s=time.monotonic() - start)

  async def close(self) -> None:
    """Cancels shared builds (precompiled headers, header environments) and reaps them."""
    tasks = list(self._pch.values()) + list(self._envs.values())
    for task in tasks:
      task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

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
    """Builds the precompiled header and the header tiers for the default flag set ahead of the
    first request; returns the precompiled header (None if g++ could not build one)."""
    probe = sources.InlineExtension(name="dice_warmup", cpp_sources=(), cuda_sources=("",),
                                    functions=())
    flags = self.flags(probe)
    pch, _ = await asyncio.gather(
        self._ensure_pch(flags),
        self._ensure_env(flags, "extension") if self.tiers else asyncio.sleep(0))
    return pch

  async def header_environment(
      self, ext: sources.InlineExtension) -> header_tiers.Environment | None:
    """The header tiers available to `ext`'s CUDA source (None: it is built as written)."""
    _, cuda_text = buildspec.render_sources(ext)
    level = header_tiers.original_level(cuda_text or "")
    return await self._ensure_env(self.flags(ext), level) if (level and self.tiers) else None

  # ------------------------------------------------------------------ records

  def _record_path(self, key: str) -> pathlib.Path:
    return self.cache_dir / "builds" / f"{key}.json"

  def _read_record(self, key: str) -> BuildResult | None:
    try:
      data = json.loads(self._record_path(key).read_text())
      result = BuildResult(**data)
    except (OSError, ValueError, TypeError):
      return None
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
      obj, output = await self._object(cmd, main_text, "main.cpp")
      if pch and _PCH_REJECTED_RE.search(output):
        log.warning("g++ did not use the precompiled header: %s", output[-1000:])
        pch = None
      return obj

    tasks = [asyncio.ensure_future(main_object())]
    if cuda_text is not None:
      tasks.append(asyncio.ensure_future(self._cuda_object(flags, cuda_text, self.tiers)))
    try:
      done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
      for task in done:
        if isinstance(task.exception(), ProcessFailed):
          return self._failed(key, task.exception().log)
      main_obj = tasks[0].result()
      cuda_obj, tier, notes = tasks[1].result() if len(tasks) > 1 else (None, "", {})
      try:
        so_path = await self._link(flags, ext.name, main_obj, cuda_obj)
      except ProcessFailed as e:
        if tier in ("", header_tiers.ORIGINAL):
          return self._failed(key, e.log)
        try:  # a lighter object that compiles but does not link: fall back to the original
          notes[tier] = "compiled but did not link"
          cuda_obj, tier, _ = await self._cuda_object(flags, cuda_text, ())
          so_path = await self._link(flags, ext.name, main_obj, cuda_obj)
        except ProcessFailed as e2:
          return self._failed(key, e2.log)
    finally:
      for task in tasks:
        task.cancel()
      # Reap the other translation unit's compiler before returning (or propagating a cancel).
      await asyncio.gather(*tasks, return_exceptions=True)
    result = BuildResult(ok=True, so_path=so_path, cache_key=key, pch_used=bool(pch),
                         header_tier=tier, tier_notes=notes)
    self._write_record(key, result)
    return result

  async def _cuda_object(self, flags: buildspec.BuildFlags, cuda_text: str,
                         tiers: tuple[str, ...]) -> tuple[str, str, dict[str, str]]:
    """cuda.cu at the lightest tier that compiles: (object, tier, why lighter tiers were not
    used). Raises ProcessFailed with the original source's log if nothing compiles."""
    level = header_tiers.original_level(cuda_text)
    env = await self._ensure_env(flags, level) if (tiers and level) else None
    variants, notes = header_tiers.plan(cuda_text, env, tiers)
    lite_log = None
    for tier, text in variants:
      if tier == header_tiers.TYPES and lite_log is not None and not (
          header_tiers.types_may_help(lite_log, env)):
        notes[tier] = "not tried: the lite build failed only on names no torch header declares"
        continue
      extra = [] if tier == header_tiers.ORIGINAL else ["-isystem", str(self._env_dir(env.key))]
      cmd = list(flags.nvcc) + list(flags.cuda_cflags) + extra + [
          "-c", "{src}", "-o", "{out}"] + list(flags.cuda_post_cflags)
      try:
        obj, _ = await self._object(cmd, text, "cuda.cu")
        return obj, tier, notes
      except ProcessFailed as e:
        if tier == header_tiers.ORIGINAL:
          raise
        notes[tier] = "did not compile"
        if header_tiers.broken_by_tier(e.log, tier):
          self._disable_tier(env, tier, e.log)
        if tier == header_tiers.LITE:
          lite_log = e.log
    raise AssertionError("plan() always ends with the original source")

  def _failed(self, key: str, log_text: str) -> BuildResult:
    text, truncated = bound_log(log_text, self.max_log_bytes)
    result = BuildResult(ok=False, log=text, log_truncated=truncated, cache_key=key)
    self._write_record(key, result)
    return result

  async def _object(self, cmd: list[str], text: str, filename: str) -> tuple[str, str]:
    """Compiles one translation unit (cached by content and command): (.o path, compiler output)."""
    split = self.split_nvcc and filename.endswith(".cu")
    key = _digest("obj", self.toolchain.fingerprint, cmd, text, split)
    final = self.cache_dir / "obj" / key[:2] / key
    obj = final / (filename + ".o")
    if obj.is_file():
      return str(obj), _read(final / "compile.log")
    failed = final / "error.log"
    if failed.is_file():
      raise ProcessFailed(failed.read_text(errors="replace"))
    path = await self._objects.run(key, lambda: self._compile(cmd, text, filename, final, split))
    return path, _read(final / "compile.log")

  async def _compile(self, cmd: list[str], text: str, filename: str, final: pathlib.Path,
                     split: bool) -> str:
    work = pathlib.Path(tempfile.mkdtemp(prefix="tu-", dir=self.cache_dir / "tmp"))
    try:
      src = work / filename
      src.write_text(text, encoding="utf-8")
      out = work / (filename + ".o")
      argv = [a.format(src=src, out=out) if a in ("{src}", "{out}") else a for a in cmd]
      result = None
      if split:
        try:
          result = await nvcc_split.compile_split(
              argv, text, work, lambda a, cwd: self._runner.run(a, cwd, echo=False))
        except Exception:  # pylint: disable=broad-except  (a speed-up: nvcc itself decides)
          log.exception("split nvcc failed to run; running nvcc as a whole")
          result = None
        shutil.rmtree(work / "nvcc-steps", ignore_errors=True)  # preprocessed files: big
      rc, output = result or await self._runner.run(argv, cwd=work, echo=False)
      if rc != 0:
        output = f"$ {' '.join(argv)}\n{output}"
      output = output.replace(f"{work}/", "")  # the log names cuda.cu, not a scratch folder
      if rc < 0:  # killed by a signal (OOM killer, operator): not a property of the source
        raise ProcessFailed(output + f"\ncompiler killed by signal {-rc}")
      final.parent.mkdir(parents=True, exist_ok=True)
      if rc != 0:
        (work / "error.log").write_text(output)
        out.unlink(missing_ok=True)
        self._publish(work, final)
        raise ProcessFailed(output)
      (work / "compile.log").write_text(output)
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
      rc, output = await self._runner.run(argv, cwd=work)
      if rc != 0:
        raise ProcessFailed(output)
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

  # ------------------------------------------------------------------ header tiers

  def _env_dir(self, key: str) -> pathlib.Path:
    return self.cache_dir / "headers" / key

  async def _ensure_env(self, flags: buildspec.BuildFlags,
                        level: str) -> header_tiers.Environment | None:
    argv = list(flags.nvcc) + [f for f in flags.cuda_cflags if not _NAME_DEFINE_RE.match(f)]
    argv += list(flags.cuda_post_cflags)
    key = header_tiers.environment_key(self.toolchain.fingerprint, argv, level)
    task = self._envs.get(key)
    if task is None or (task.done() and task.cancelled()):
      self._envs[key] = asyncio.ensure_future(self._load_env(argv, level, key))
    return await asyncio.shield(self._envs[key])

  async def _load_env(self, argv: list[str], level: str,
                      key: str) -> header_tiers.Environment | None:
    compile_procs.PRIORITY.set(-1)  # every build of this flag set waits for it
    folder = self._env_dir(key)
    env = _read_env(folder)
    if env is not None:
      return env
    async with compile_procs.file_lock(folder.with_suffix(".lock")):
      env = _read_env(folder)
      if env is not None:
        return env
      work = pathlib.Path(tempfile.mkdtemp(prefix="env-", dir=self.cache_dir / "tmp"))
      start = time.monotonic()
      try:
        env = await header_tiers.build_environment(level, argv, work, self._runner.run, key)
      except Exception as e:  # pylint: disable=broad-except  (tiers off: builds as written)
        log.warning("header tiers off for %s-level sources: %r", level, e)
        return None
      finally:
        shutil.rmtree(work, ignore_errors=True)
      staging = pathlib.Path(tempfile.mkdtemp(prefix="env-", dir=self.cache_dir / "tmp"))
      _write_env(staging, env)
      self._publish(staging, folder)
      log.info("header tiers for %s-level sources ready in %.1f s: %s", level,
               time.monotonic() - start, sorted(env.blocks))
    return _read_env(folder)

  def _disable_tier(self, env: header_tiers.Environment, tier: str, log_text: str) -> None:
    """A tier whose own header fails to compile is switched off for this toolchain and flags."""
    if tier not in env.blocks:
      return
    log.warning("header tier %s switched off: its header does not compile: %s", tier,
                log_text[-1500:])
    del env.blocks[tier]
    env.unavailable[tier] = "its header failed to compile: " + log_text[-1500:]
    _write_env(self._env_dir(env.key), env)

  # ------------------------------------------------------------------ precompiled header

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
    compile_procs.PRIORITY.set(-1)
    # Servers sharing a cache folder build the (large, slow) header once: a file lock.
    async with compile_procs.file_lock(header.parent.with_suffix(".lock")):
      if header.with_suffix(".h.gch").is_file():
        return str(header)
      if (header.parent / "error.log").is_file():
        return None
      work = pathlib.Path(tempfile.mkdtemp(prefix="pch-", dir=self.cache_dir / "tmp"))
      try:
        (work / _PCH_HEADER).write_text("#include <torch/extension.h>\n")
        argv = list(cxx) + ["-x", "c++-header"] + cflags + [
            str(work / _PCH_HEADER), "-o", str(work / (_PCH_HEADER + ".gch"))]
        start = time.monotonic()
        rc, output = await self._runner.run(argv, cwd=work)
        if rc != 0:
          log.warning("precompiled header failed; compiling without it: %s", output[-2000:])
          (work / "error.log").write_text(output)
        else:
          log.info("precompiled header built in %.1f s", time.monotonic() - start)
        self._publish(work, header.parent)
        return str(header) if rc == 0 else None
      finally:
        shutil.rmtree(work, ignore_errors=True)


def _read(path: pathlib.Path) -> str:
  try:
    return path.read_text(errors="replace")
  except OSError:
    return ""


def _read_env(folder: pathlib.Path) -> header_tiers.Environment | None:
  try:
    env = header_tiers.Environment.from_json(json.loads((folder / "environment.json").read_text()))
  except (OSError, ValueError, KeyError, TypeError):
    return None
  if any(not (folder / header_tiers.header_name(t)).is_file() for t in env.blocks):
    return None
  return env


def _write_env(folder: pathlib.Path, env: header_tiers.Environment) -> None:
  for tier, block in env.blocks.items():
    (folder / header_tiers.header_name(tier)).write_text(header_tiers.header_text(block))
  tmp = folder / f"environment.json.{os.getpid()}"
  tmp.write_text(json.dumps(env.to_json()))
  os.replace(tmp, folder / "environment.json")
