"""Object files and linked modules: compiled once per content, kept in the cache folder.

`compile` runs one translation unit (g++ for main.cpp; nvcc, split into its two front ends, for
cuda.cu) keyed by its text and command; `link` links objects into the module torch would link.
Both publish a finished folder atomically (first writer wins), so servers sharing a cache folder
and concurrent requests never see half a build. A failed compile is kept too (its log): the same
source fails again without running the compiler.

Decisions:
- Compilers run in the work folder with relative paths: nothing in their output then depends on
  which scratch folder a build got (host_pch.py relies on it; logs name cuda.cu, not /tmp/...).
- A compiler killed by a signal (the OOM killer, an operator) is not a property of the source: it
  is reported but not kept. Nor is a compile over a bound (procs.LimitExceeded, raised by the
  runner): the build's record keeps it, under a key that includes the bounds (compiler.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
from typing import Callable

from verifier_service import singleflight
from verifier_service.compile import buildspec
from verifier_service.compile import cache as compile_cache
from verifier_service.compile import confine as confine_lib
from verifier_service.compile import front_ends as front_ends_lib
from verifier_service.compile import host_pch
from verifier_service.compile import nvcc_split
from verifier_service.compile import procs as compile_procs

log = logging.getLogger(__name__)


def digest(*parts: object) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def read(path: pathlib.Path) -> str:
  try:
    return path.read_text(errors="replace")
  except OSError:
    return ""


class Objects:
  """`<cache>/obj/<xx>/<key>/` and `<cache>/so/<xx>/<key>/`, built through `runner`."""

  def __init__(self, cache_dir: pathlib.Path, fingerprint: str,
               runner: compile_procs.ProcessRunner, split_nvcc: bool,
               host: host_pch.HostHeaders | None,
               on_publish: Callable[[pathlib.Path], None] = lambda folder: None,
               front_ends: front_ends_lib.FrontEnds | None = None,
               preprocess: nvcc_split.FrontEndFn | None = None):
    self.cache_dir = cache_dir
    self._fingerprint = fingerprint
    self._runner = runner
    self._split = split_nvcc
    self._host = host
    self._on_publish = on_publish
    self._front_ends = front_ends
    self._preprocess = preprocess  # the split's device halves (rest_preprocess.py)
    self._inflight: singleflight.SingleFlight[str] = singleflight.SingleFlight()

  async def compile(self, cmd: list[str], text: str, filename: str,
                    module_id: str | None = None,
                    files: dict[str, str] | None = None, nvcc: bool = True,
                    host_first: bool = False) -> tuple[str, str]:
    """One translation unit (`cmd` holds "{src}" and "{out}"): (.o path, compiler output).
    `module_id`: nvcc's for a split compile at a light tier (else one from the source); it also
    lets the host compile read its shared prefix precompiled. `files`: more files it includes,
    by relative path (batch.py). `nvcc`: False for a .cu file that g++ compiles (`-x c++`: the
    split path's host half). `host_first`: expected to fail, so nvcc's device chain waits for
    its host chain (nvcc_split.compile_split; the same result). Raises ProcessFailed."""
    split = self._split and nvcc and filename.endswith(".cu")
    key = digest("obj", self._fingerprint, cmd, text, split, module_id, filename,
                 *([files] if files else []))
    final = self.cache_dir / "obj" / key[:2] / key
    obj = final / (filename + ".o")
    if obj.is_file():
      compile_cache.touch(final)
      return str(obj), read(final / "compile.log")
    failed = final / "error.log"
    if failed.is_file():
      raise compile_procs.ProcessFailed(failed.read_text(errors="replace"))
    path = await self._inflight.run(
        key, lambda: self._compile(cmd, text, filename, final, split, module_id, files or {},
                                   host_first))
    return path, read(final / "compile.log")

  async def _compile(self, cmd: list[str], text: str, filename: str, final: pathlib.Path,
                     split: bool, module_id: str | None, files: dict[str, str],
                     host_first: bool) -> str:
    work = pathlib.Path(tempfile.mkdtemp(prefix="tu-", dir=self.cache_dir / "tmp"))
    try:
      return await self._compile_in(work, cmd, text, filename, final, split, module_id, files,
                                    host_first)
    except compile_procs.LimitExceeded as e:
      raise compile_procs.LimitExceeded(e.limit, self._clean(e.log, work)) from None
    finally:
      shutil.rmtree(work, ignore_errors=True)

  async def _compile_in(self, work: pathlib.Path, cmd: list[str], text: str, filename: str,
                        final: pathlib.Path, split: bool, module_id: str | None,
                        files: dict[str, str], host_first: bool) -> str:
    (work / filename).write_text(text, encoding="utf-8")
    for name, content in files.items():
      (work / name).parent.mkdir(parents=True, exist_ok=True)
      (work / name).write_text(content, encoding="utf-8")
    out = work / (filename + ".o")
    argv = [{"{src}": filename, "{out}": out.name}.get(a, a) for a in cmd]
    result = None
    if split:
      prepare = self._host.prepare if (self._host is not None and module_id) else None
      # Warm front ends only at a light tier: elsewhere the module id is the source's own.
      warm = self._front_ends.run if (self._front_ends is not None and module_id) else None
      try:
        result = await nvcc_split.compile_split(
            argv, text, work, lambda a, cwd: self._runner.run(a, cwd, echo=False),
            module_id=module_id, prepare_final=prepare, front_end=warm, host_first=host_first,
            preprocess=self._preprocess if module_id else None,
            limits=self._runner.confinement.limits if self._runner.confinement else None)
      except (compile_procs.LimitExceeded, confine_lib.ConfinementError):
        raise  # the source went over a bound (final), or we could not confine a step
      except Exception:  # pylint: disable=broad-except  (a speed-up: nvcc itself decides)
        log.exception("split nvcc failed to run; running nvcc as a whole")
        result = None
      shutil.rmtree(work / "nvcc-steps", ignore_errors=True)  # preprocessed files: big
    rc, output = result or await self._runner.run(argv, cwd=work, echo=False)
    if rc != 0:
      output = f"$ {' '.join(argv)}\n{output}"
    output = self._clean(output, work)  # the log names cuda.cu, not a scratch folder
    if rc < 0:  # killed by a signal (OOM killer, operator): not a property of the source
      raise compile_procs.ProcessFailed(output + f"\ncompiler killed by signal {-rc}")
    final.parent.mkdir(parents=True, exist_ok=True)
    if rc != 0:
      (work / "error.log").write_text(output)
      out.unlink(missing_ok=True)
      self.publish(work, final)
      raise compile_procs.ProcessFailed(output)
    (work / "compile.log").write_text(output)
    self.publish(work, final)
    return str(final / out.name)

  async def link(self, flags: buildspec.BuildFlags, name: str, main_obj: str,
                 cuda_obj: str | tuple[str, ...] | None, extra: tuple[str, ...] = ()) -> str:
    """The module `name.so` from the objects (cuda.cu's: one, or a split one's halves), with
    torch's link line (and `extra` options: a batch member's --defsym bindings). Raises
    ProcessFailed."""
    objects = [main_obj] + ([cuda_obj] if isinstance(cuda_obj, str) else list(cuda_obj or ()))
    key = digest("link", self._fingerprint, name, objects, flags.ldflags, *extra)
    final = self.cache_dir / "so" / key[:2] / key
    so = final / f"{name}.so"
    if so.is_file():
      compile_cache.touch(final)
      return str(so)
    work = pathlib.Path(tempfile.mkdtemp(prefix="so-", dir=self.cache_dir / "tmp"))
    try:
      argv = list(flags.cxx) + objects + list(flags.ldflags) + list(extra) + [
          "-o", str(work / so.name)]
      try:
        rc, output = await self._runner.run(argv, cwd=work, reads=tuple(objects))
      except compile_procs.LimitExceeded as e:
        raise compile_procs.LimitExceeded(e.limit, self._clean(e.log, work)) from None
      if rc != 0:
        raise compile_procs.ProcessFailed(self._clean(output, work))
      final.parent.mkdir(parents=True, exist_ok=True)
      self.publish(work, final)
      return str(so)
    finally:
      shutil.rmtree(work, ignore_errors=True)

  def _clean(self, text: str, work: pathlib.Path) -> str:
    """A log as it may leave the compile stage (diagnostics.py)."""
    confinement = self._runner.confinement
    if confinement is None:
      return text.replace(f"{work}/", "")
    return confinement.clean(text, work)

  def publish(self, work: pathlib.Path, final: pathlib.Path) -> None:
    """Atomically moves a finished build folder into the cache (first writer wins)."""
    try:
      os.rename(work, final)
    except OSError:
      return  # another process published the same content first
    self._on_publish(final)
