"""Stage 2: the verifier's own `load_inline` build path, fast and cached.

What is built is exactly what `torch.utils.cpp_extension.load_inline` builds (buildspec.py: the
same main.cpp and cuda.cu, the flags of torch's own ninja writer, torch's link line). What makes
it fast (each measured in `benchmarks/verifier_compile.py`):

1. Header tiers (header_tiers.py; per toolchain, tier_environment.py): the lightest torch headers
   that build each translation unit, falling back to the source as written on failure, so a
   verdict never differs from the naive path's; only its cost does. cuda.cu: lite, then
   torch/types.h, then as written; a lite failure that no heavier header can remove
   (header_tiers.heavier_may_help: a name no header declares, a missing include) ends the build
   with the lite log: the source as written fails there too. main.cpp: lite plus the binding headers (a third of
   torch/extension.h's parse), then as written.
2. g++ precompiled headers for main.cpp (pch.py): the lite binding header, built at start-up;
   torch/extension.h's (~750 MB, ~30 s) only once some main.cpp falls back to the original.
3. nvcc's host and device front ends run concurrently (nvcc_split.py): less wall time, same work;
   but a retry after a lite failure, which usually fails again, runs the device chain only after
   a successful host chain, as nvcc does (a failure there costs no device front end).
   At a light tier the module id is the tier's and paths are relative to the work folder, so the
   host code nvcc compiles last starts with the same text for every candidate, which host_pch.py
   precompiles (the same object, a third of that step's CPU).
4. Both translation units compile concurrently in a bounded, niced process pool that serves the
   earliest request first (procs.py).
5. A content-addressed cache per object file and per linked module (objects.py): a phase-1
   (infilling) problem keeps its C++ scaffold fixed, so across rollouts only `cuda.cu` is ever
   compiled again. The folder is bounded by least-recently-used pruning (cache.py).
6. cuda.cu sources at the lite tier that compile at the same time (other builds in flight) share
   one nvcc translation unit, up to `batch_members`, at most one per problem (batch.py): the
   headers, nearly all of a compile, are parsed once per batch; each member's module is the
   batch object linked with its own main.o. Refused sources, lone ones and failed batches build
   alone, as above.
7. Warm front ends (front_ends.py; on by default in a server with GPUs): one cudafe++ and one
   cicc per nvcc command, started ahead of time and already through the shared light-tier
   headers, then fork servers: a compile whose preprocessed input starts with them finishes in
   a forked child that reads only the rest.
   Started and checked by a probe after `warm_up`, which also builds the precompiled host code
   of point 3.
8. The split path (device_split.py; `CompilerOptions(split=True)`, off by default): a
   cuda.cu the lite tier would build and no batch takes (a lone compile, or one a batch
   refuses, but not one its batch's errors name, which takes the usual path at once; batches
   come first, point 6: a split build's CPU is all fixed cost) is built in two halves, its
   device code by nvcc without torch's headers and its host code by g++ against a precompiled
   lite header, then linked. Sources the cut refuses (split_source.py) and halves that fail
   take the usual path, which decides the verdict. BuildResult.header_tier is "split" for those
   it built; `split_note` says why another was not; `split_stats` counts both. With it, the
   device halves' preprocessing passes run on the candidate's code after a snapshot of the
   headers' macros (rest_preprocess.py; `split_preprocess`, on with the split).

Each build's processes (start, wait, wall) are recorded in `BuildResult.steps` (procs.Trace).

Compilers run as their own process group; a deadline or a cancelled request kills the group.
Every compiler process runs confined and bounded (confine.py, limits.py): the Compiler refuses to
start where the host cannot confine them, unless made with `confine=False`. A build that goes
over a bound fails at once (no heavier tier is tried: the source asks the same of the compiler at
every tier), as COMPILE_ERROR, or TIMEOUT for CPU time, its log's first line naming the limit.
Every log it keeps has been cleaned (diagnostics.py).
`on_progress` receives what the stage is doing (shared one-off builds included), for
`dice-verifier check`'s display.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import pathlib
import subprocess
import time
from typing import Callable

from verifier_service import singleflight
from verifier_service.compile import batch as batch_lib
from verifier_service.compile import buildspec
from verifier_service.compile import cache as compile_cache
from verifier_service.compile import confine as confine_lib
from verifier_service.compile import device_split
from verifier_service.compile import front_ends as front_ends_lib
from verifier_service.compile import header_tiers
from verifier_service.compile import host_pch
from verifier_service.compile import limits as limits_lib
from verifier_service.compile import objects as objects_lib
from verifier_service.compile import options as options_lib
from verifier_service.compile import pch as pch_lib
from verifier_service.compile import procs as compile_procs
from verifier_service.compile import rest_preprocess
from verifier_service.compile import sources
from verifier_service.compile import tier_environment
from verifier_service.compile import toolchain as toolchain_lib

log = logging.getLogger(__name__)

LITE, ORIGINAL = header_tiers.LITE, header_tiers.ORIGINAL
CompilerOptions = options_lib.CompilerOptions  # what Compiler takes, for its callers
SPLIT = "split"  # BuildResult.header_tier of a cuda.cu built in two halves (device_split.py)
# The empty extension whose flags the shared builds of start-up are made for (warm_up).
_PROBE = sources.InlineExtension(name="dice_warmup", cpp_sources=(), cuda_sources=("",),
                                 functions=())
_TIERS = (header_tiers.LITE, header_tiers.TYPES)
_ORIGINAL_PCH = ("#include <torch/extension.h>\n", "torch_extension_pch.h")
# How a build moves between tiers and paths (which failure is final, which path is tried): part of
# a build record's key, so that records made under other rules are not reused.
_RULES = 3


@dataclasses.dataclass(frozen=True)
class Progress:
  """What the compile stage is doing: `stage` is headers, pch, compile, link or done."""
  stage: str
  text: str


@dataclasses.dataclass
class BuildResult:
  """One extension's build: the module path, or the (bounded) compiler log of the failure."""
  ok: bool
  so_path: str = ""
  log: str = ""
  log_truncated: bool = False
  cache_hit: bool = False
  cache_key: str = ""
  header_tier: str = ""  # cuda.cu: "split" (device_split.py), "lite", "types" or "original"
  tier_notes: dict[str, str] = dataclasses.field(default_factory=dict)  # why lighter tiers weren't used
  main_tier: str = ""  # main.cpp: "lite" or "original"
  main_notes: dict[str, str] = dataclasses.field(default_factory=dict)
  pch_used: bool = False  # main.cpp was compiled with a precompiled header
  timed_out: bool = False
  duration_s: float = 0.0
  batch_size: int = 0  # cuda.cu was compiled in a batch of this many candidates (batch.py)
  batch_note: str = ""  # why it was not, when other builds were in flight
  namespace: str = ""  # the batch namespace its cuda.cu code lives in (batch.py)
  split_note: str = ""  # why cuda.cu was not built in two halves, when that was tried
  steps: list[dict] = dataclasses.field(default_factory=list)  # processes run (procs.Trace)


def _lighter(tier: str) -> bool:
  return tier not in ("", ORIGINAL)


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
               options: options_lib.CompilerOptions | None = None):
    self.toolchain = toolchain
    self.cache_dir = pathlib.Path(cache_dir)
    self.options = options = options or options_lib.CompilerOptions()
    self.tiers = _TIERS if options.light_headers else ()
    self.main_tiers = (LITE,) if options.light_headers and options.main_tiers else ()
    use_pch, split_nvcc = options.use_pch, options.split_nvcc
    confine, nice = options.confine, options.nice
    self._on_progress: Callable[[Progress], None] | None = None
    self._early: list[Progress] = []  # reported before anyone listened (start-up), replayed
    for sub in ("obj", "so", "builds", "pch", "headers", "tmp"):
      (self.cache_dir / sub).mkdir(parents=True, exist_ok=True)
    self._in_use = compile_cache.hold_shared(self.cache_dir)
    try:
      self.confinement = confine_lib.Confinement(
          self.cache_dir, toolchain.cuda_root, toolchain.cxx, toolchain.build_env(),
          options.limits, enabled=confine)
    except confine_lib.ConfinementError:
      self._in_use.close()
      raise
    if confine and any(v.startswith("off") for v in self.confinement.layers.values()):
      log.warning("compile confinement, with a bound missing: %s", self.confinement.describe())
    elif confine:
      log.info("compile confinement: %s", self.confinement.describe())
    else:
      log.error("compile stage UNCONFINED: compilers read any file this server can and reach the "
                "network (bounds still apply): %s", self.confinement.describe())
    self._runner = compile_procs.ProcessRunner(options.max_jobs, toolchain.build_env(), nice=nice,
                                               confinement=self.confinement)
    self._bound = compile_cache.Bound(self.cache_dir, options.cache_max_bytes, self._protected)
    self._pch = pch_lib.PrecompiledHeaders(self.cache_dir / "pch", self.cache_dir / "tmp",
                                           toolchain.fingerprint, self._runner, self._report,
                                           self._bound.added)
    host = host_pch.HostHeaders(self._pch) if use_pch else None
    self._front_ends = front_ends_lib.FrontEnds(
        self.cache_dir / "tmp", self.cache_dir / "warm", self._runner.env,
        lambda argv, cwd: self._runner.run(argv, cwd, echo=False), nice=nice,
        # cudafe++ and cicc of the lite tier's command, and of the split's device half
        max_commands=4 if options.split else 2, confinement=self.confinement,
        slot=self._runner.slot
    ) if options.warm_front_ends else None
    self._probe: asyncio.Task | None = None
    self._split_warm: asyncio.Future | None = None  # warm_up's split_ready, in the background
    # Objects built unconfined (their logs, anything an .incbin read) are never a confined
    # server's, nor the reverse.
    self._rest = rest_preprocess.RestPreprocessor(
        lambda argv, cwd: self._runner.run(argv, cwd, echo=False), device_split.DEVICE_INCLUDE,
        max_bytes=self.confinement.limits.file_bytes
    ) if options.split and options.split_preprocess else None
    self._objects = objects_lib.Objects(
        self.cache_dir, toolchain.fingerprint + ("" if confine else "-unconfined"), self._runner,
        split_nvcc, host, self._bound.added, self._front_ends,
        self._rest.run if self._rest is not None else None)
    self._envs = tier_environment.Store(
        self.cache_dir / "headers", self.cache_dir / "tmp", toolchain.fingerprint,
        lambda argv, cwd: self._runner.run(argv, cwd, shared=True), self._report,
        self._objects.publish)
    self._flags: dict[tuple, buildspec.BuildFlags] = {}
    self._builds: singleflight.SingleFlight[BuildResult] = singleflight.SingleFlight()
    self._building = 0  # builds in flight: a lone one never waits for a batch
    self._batcher = batch_lib.Batcher(
        self._objects.compile, lambda argv, cwd: self._runner.run(argv, cwd),
        self.cache_dir / "tmp", options.batch_members, tool=self.confinement.tool
    ) if options.batching else None
    self._split = device_split.DeviceSplit(
        self._objects, self._pch, self.cache_dir / "tmp",
        lambda argv, cwd: self._runner.run(argv, cwd, shared=True)
    ) if options.split else None
    self._arrivals = itertools.count(1)
    lite = (pathlib.Path(header_tiers.__file__).parent / "torch_lite.h").read_text()
    # Bounds and confinement change what a build may end as (a limit, a withheld diagnostic).
    self._policy = objects_lib.digest("policy", header_tiers.VERSION, _RULES, lite, self.tiers,
                                      self.main_tiers, use_pch, split_nvcc, confine,
                                      self._split is not None,
                                      dataclasses.asdict(self.confinement.limits))
    self.hits = 0
    self.misses = 0

  # ------------------------------------------------------------------ public

  @property
  def on_progress(self) -> Callable[[Progress], None] | None:
    """Called with each step of the stage; set after start-up began, it first gets the steps
    reported so far (a display opened after `warm_up` started still shows what it does)."""
    return self._on_progress

  @on_progress.setter
  def on_progress(self, callback: Callable[[Progress], None] | None) -> None:
    self._on_progress = callback
    early, self._early = self._early, []
    for event in early if callback is not None else ():
      self._report(event.stage, event.text)

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
    return objects_lib.digest("build", self.toolchain.fingerprint, dataclasses.asdict(self.flags(ext)),
                   ext.name, main_text, cuda_text, self._policy)

  async def build(self, ext: sources.InlineExtension, timeout_s: float,
                  problem: str = "") -> BuildResult:
    """Builds (or fetches from cache) one extension within `timeout_s` seconds. `problem` names
    the reference it is verified against: a batch holds at most one cuda.cu per problem."""
    start = time.monotonic()
    key = self.build_key(ext)
    record = self._read_record(key)
    if record is not None:
      self.hits += 1
      compile_cache.touch(self._record_path(key))
      if record.so_path:
        compile_cache.touch(pathlib.Path(record.so_path).parent)
      return dataclasses.replace(record, cache_hit=True, duration_s=time.monotonic() - start)
    self.misses += 1
    priority = compile_procs.PRIORITY.set(next(self._arrivals))
    trace = compile_procs.Trace(start)
    traced = compile_procs.STEPS.set(trace)
    try:
      async with asyncio.timeout(timeout_s):
        result = await self._builds.run(key, lambda: self._build(ext, key, problem))
    except TimeoutError:
      return BuildResult(ok=False, timed_out=True, cache_key=key,
                         log=f"compile did not finish within {timeout_s:.1f} s",
                         duration_s=time.monotonic() - start, steps=trace.steps)
    finally:
      compile_procs.STEPS.reset(traced)
      compile_procs.PRIORITY.reset(priority)
    return dataclasses.replace(result, duration_s=time.monotonic() - start, steps=trace.steps)

  async def settle(self) -> None:
    """Waits for shared header builds in progress, including background ones, for the start-up
    probe that warms nvcc's front ends, and where the split path is on, for its names and host
    header."""
    if self._probe is not None:
      await asyncio.gather(asyncio.shield(self._probe), return_exceptions=True)
    if self._split is not None:
      await self.split_ready()
    await self._pch.settle()

  async def close(self) -> None:
    """Cancels shared builds (precompiled headers, header environments, the start-up probe) and
    reaps them; kills warm front ends."""
    for task in (self._probe, self._split_warm):
      if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await asyncio.gather(self._pch.close(), self._envs.close(), self._bound.close(),
                         *([self._split.close()] if self._split else []),
                         *([self._front_ends.close()] if self._front_ends else []),
                         return_exceptions=True)
    self.confinement.close()
    self._in_use.close()

  def stats(self) -> dict[str, int]:
    """Cache entries, hits, misses and bytes on disk."""
    size = compile_cache.tree_size(self.cache_dir)
    entries = sum(1 for _ in (self.cache_dir / "builds").glob("*.json"))
    return {"entries": entries, "hits": self.hits, "misses": self.misses, "size_bytes": size}

  def front_end_stats(self) -> dict[str, float]:
    """Warm front ends (front_ends.py): ready, claimed, missed, commands switched off, the
    children's CPU seconds."""
    return self._front_ends.stats() if self._front_ends else {}

  def batch_stats(self) -> dict[str, int]:
    """Batched cuda.cu compiles (batch.py): batches, members in them, members built alone."""
    return dict(self._batcher.stats) if self._batcher else {}

  def split_stats(self) -> dict[str, int]:
    """cuda.cu builds in two halves (device_split.py): built, refused, failed, not ready; and
    their preprocessing passes run from a macro snapshot (rest_preprocess.py)."""
    stats = dict(self._split.stats) if self._split else {}
    return stats | (self._rest.stats() if self._rest is not None else {})

  async def split_ready(self) -> bool:
    """Waits until lite-tier builds of cuda.cu at both levels (sources with torch/extension.h,
    and with torch/types.h alone, as load_inline writes a source that includes neither) can take
    the split path: each level has its own names and precompiled host header. False where it is
    off or cannot serve this toolchain at some level."""
    if self._split is None:
      return False
    split = self._split
    flags = self.flags(_PROBE)

    async def level_ready(level: str) -> bool:
      env = await self._envs.ensure(self._nvcc_argv(flags), level)
      return env is not None and await split.ready(env, self._envs.folder(env.key),
                                                   self._split_argv(flags, env))
    return all(await asyncio.gather(*map(level_ready, header_tiers.CUDA_LEVELS)))

  async def split_ready_for(self, ext: sources.InlineExtension) -> tuple[str, ...] | None:
    """`split_ready`, and the names for `ext`'s cuda.cu where it includes more than the lite
    headers (device_split.py): what a build of it waits for before it can split. Returns those
    further includes, or None where the split cannot serve it."""
    if not await self.split_ready() or not ext.cuda_sources:
      return None
    assert self._split is not None
    flags = self.flags(ext)
    _, cuda_text = buildspec.render_sources(ext)
    env = await self._envs.ensure(self._nvcc_argv(flags), header_tiers.original_level(cuda_text))
    if env is None:
      return None
    return await self._split.ready_for(env, self._envs.folder(env.key),
                                       self._split_argv(flags, env), cuda_text or "")

  async def warm_up(self) -> str | None:
    """Prepares what the first request would otherwise wait for: the header tiers of main.cpp and
    of cuda.cu at both levels (sources with torch/extension.h, and with torch/types.h alone, as
    load_inline writes a cuda_sources string that includes neither) and main.cpp's precompiled
    header (the lite one; torch/extension.h's without tiers). Returns that header's path if it is
    precompiled."""
    probe = _PROBE
    flags = self.flags(probe)

    async def main_header() -> pch_lib.Header | None:
      if not self.options.use_pch:
        return None
      if not self.main_tiers:
        return await self._original_pch(flags)
      env = await self._envs.ensure(self._cxx_argv(flags), header_tiers.BINDING)
      return await self._tier_header(flags, env, LITE) if env and LITE in env.blocks else None

    async def cuda_environments() -> header_tiers.Environment | None:
      if not self.tiers:
        return None
      envs = await asyncio.gather(*(self._envs.ensure(self._nvcc_argv(flags), level)
                                    for level in header_tiers.CUDA_LEVELS))
      return envs[0]  # the probe's level: it includes torch/extension.h

    header, env = await asyncio.gather(main_header(), cuda_environments())
    if self._front_ends is not None and env is not None and LITE in env.blocks:
      self._probe = asyncio.ensure_future(self._warm_probe(probe, flags, env))
    if self._split is not None and self._split_warm is None:  # both levels, in the background
      self._split_warm = asyncio.ensure_future(self.split_ready())
    return header.path if header is not None and header.precompiled else None

  async def _warm_probe(self, probe: sources.InlineExtension, flags: buildspec.BuildFlags,
                        env: header_tiers.Environment) -> None:
    """In the background after start-up: a trivial cuda.cu compiled twice at the lite tier (new
    text at each start), so that the first candidates find warm front ends, checked against the
    usual run (front_ends.py), and the precompiled host code of nvcc's last step (host_pch.py)."""
    _, cuda_text = buildspec.render_sources(probe)
    cmd, module_id = self._cuda_command(flags, env, LITE)
    nonce = os.urandom(8).hex()
    priority = compile_procs.PRIORITY.set(next(self._arrivals))  # as a build arriving now
    try:
      for i in range(2):
        text = header_tiers.rewrite(
            f"{cuda_text}\n__global__ void dice_warm_probe_{nonce}_{i}() {{}}\n", LITE)
        try:
          await self._objects.compile(cmd, text, "cuda.cu", module_id)
        except compile_procs.ProcessFailed as e:
          log.warning("the warm-up probe did not compile at the lite tier:\n%s", e.log[-2000:])
          return
    finally:
      compile_procs.PRIORITY.reset(priority)

  async def header_environment(
      self, ext: sources.InlineExtension) -> header_tiers.Environment | None:
    """The header tiers available to `ext`'s CUDA source (None: it is built as written)."""
    _, cuda_text = buildspec.render_sources(ext)
    level = header_tiers.original_level(cuda_text or "")
    return await self._envs.ensure(self._nvcc_argv(self.flags(ext)), level) if (
        level and self.tiers) else None

  async def binding_environment(
      self, ext: sources.InlineExtension) -> header_tiers.Environment | None:
    """The header tiers available to `ext`'s main.cpp (None: it is built as written)."""
    main_text, _ = buildspec.render_sources(ext)
    level = header_tiers.binding_level(main_text)
    return await self._envs.ensure(self._cxx_argv(self.flags(ext)), level) if (
        level and self.main_tiers) else None

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
    self._bound.added(self._record_path(key))

  # ------------------------------------------------------------------ building

  def _report(self, stage: str, text: str) -> None:
    if self._on_progress is None:
      self._early = (self._early + [Progress(stage, text)])[-32:]
      return
    try:
      self._on_progress(Progress(stage, text))
    except Exception:  # pylint: disable=broad-except  (a display must not fail a build)
      log.exception("progress callback failed")

  async def _build(self, ext: sources.InlineExtension, key: str, problem: str) -> BuildResult:
    self._building += 1
    try:
      return await self._build_counted(ext, key, problem)
    finally:
      self._building -= 1

  async def _build_counted(self, ext: sources.InlineExtension, key: str,
                           problem: str) -> BuildResult:
    flags = self.flags(ext)
    main_text, cuda_text = buildspec.render_sources(ext)
    start = time.monotonic()
    self._report("compile", f"compiling {ext.name}: main.cpp" + (" and cuda.cu" if cuda_text
                                                                 is not None else ""))
    main_task = asyncio.ensure_future(self._main_object(ext, flags, main_text, self.main_tiers))
    cuda_task = asyncio.ensure_future(self._cuda_object(
        flags, cuda_text, self.tiers, problem=problem)) if cuda_text is not None else None
    tasks: list[asyncio.Future] = [main_task] + ([cuda_task] if cuda_task else [])
    try:
      done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
      for task in done:
        error = task.exception()
        if isinstance(error, compile_procs.ProcessFailed):
          return self._failed(key, error)
      main_obj, main_tier, main_notes, pch_used = main_task.result()
      cuda_obj, tier, notes = cuda_task.result() if cuda_task else (None, "", {})
      self._report("link", f"linking {ext.name}")
      batch_size, namespace = 0, ""
      if isinstance(cuda_obj, batch_lib.Batched):
        so_path, why = await self._link_member(flags, ext, main_obj, cuda_obj)
        if so_path:
          batch_size, namespace = cuda_obj.size, cuda_obj.namespace
        else:
          notes["batch"] = why
          try:
            cuda_obj, tier, more = await self._cuda_object(flags, cuda_text, self.tiers, False)
          except compile_procs.ProcessFailed as e:
            return self._failed(key, e)
          notes.update(more)
      linked = False
      if isinstance(cuda_obj, device_split.Halves):
        try:
          so_path, linked = await self._objects.link(flags, ext.name, main_obj,
                                                     cuda_obj.objects), True
        except compile_procs.LimitExceeded as e:
          return self._failed(key, e)
        except compile_procs.ProcessFailed:
          notes[SPLIT] = "its halves did not link"
          try:
            cuda_obj, tier, more = await self._cuda_object(flags, cuda_text, self.tiers, False,
                                                           problem=problem, may_split=False)
          except compile_procs.ProcessFailed as e:
            return self._failed(key, e)
          notes.update(more)
      batch_note, split_note = notes.pop("batch", ""), notes.pop(SPLIT, "")
      try:
        if not (batch_size or linked):
          # A batch member and split halves were linked above, or rebuilt as neither.
          assert cuda_obj is None or isinstance(cuda_obj, str), cuda_obj
          so_path = await self._objects.link(flags, ext.name, main_obj, cuda_obj)
      except compile_procs.ProcessFailed as e:
        if isinstance(e, compile_procs.LimitExceeded) or not (_lighter(main_tier) or
                                                               _lighter(tier)):
          return self._failed(key, e)
        try:  # lighter objects that compile but do not link: fall back to the originals
          if _lighter(main_tier):
            main_notes[main_tier] = "compiled but did not link"
            main_obj, main_tier, _, pch_used = await self._main_object(ext, flags, main_text, ())
          if _lighter(tier):
            notes[tier] = "compiled but did not link"
            cuda_obj, tier, _ = await self._cuda_object(flags, cuda_text, ())
          assert cuda_obj is None or isinstance(cuda_obj, str), cuda_obj  # no tiers: no batch
          so_path = await self._objects.link(flags, ext.name, main_obj, cuda_obj)
        except compile_procs.ProcessFailed as e2:
          return self._failed(key, e2)
    finally:
      for task in tasks:
        task.cancel()
      # Reap the other translation unit's compiler before returning (or propagating a cancel).
      await asyncio.gather(*tasks, return_exceptions=True)
    self._report("done", f"compiled {ext.name} in {time.monotonic() - start:.1f} s")
    result = BuildResult(ok=True, so_path=so_path, cache_key=key, pch_used=pch_used,
                         header_tier=tier, tier_notes=notes, main_tier=main_tier,
                         main_notes=main_notes, batch_size=batch_size, batch_note=batch_note,
                         namespace=namespace, split_note=split_note)
    self._write_record(key, result)
    return result

  async def _main_object(self, ext: sources.InlineExtension, flags: buildspec.BuildFlags,
                         main_text: str, tiers: tuple[str, ...]
                         ) -> tuple[str, str, dict[str, str], bool]:
    """main.cpp at the lightest tier that compiles: (object, tier, why lighter tiers were not
    used, precompiled header used). Raises ProcessFailed with the original source's log."""
    as_written = ext.no_implicit_headers or ext.extra_cflags or ext.extra_include_paths
    level = None if (as_written or not tiers) else header_tiers.binding_level(main_text)
    env = await self._envs.ensure(self._cxx_argv(flags), level) if level else None
    variants, notes = header_tiers.plan(main_text, env, tiers, level=level)
    for tier, text in variants:
      if tier == ORIGINAL:
        header = (await self._original_pch(flags)
                  if self.options.use_pch and not as_written else None)
        if header is not None and not header.precompiled:
          header = None  # compile as written, without it
      else:
        header = await self._tier_header(flags, env, tier)
        if header is None:
          notes[tier] = env.unavailable.get(tier, "unavailable")
          continue
      include = ["-include", header.path, "-Winvalid-pch"] if header else []
      cmd = list(flags.cxx) + include + list(flags.cflags) + [
          "-c", "{src}", "-o", "{out}"] + list(flags.post_cflags)
      try:
        obj, output = await self._objects.compile(cmd, text, "main.cpp")
      except compile_procs.ProcessFailed as e:
        self._tier_failed(env, tier, e, notes)
        continue
      used = bool(header and header.precompiled)
      if used and pch_lib.REJECTED_RE.search(output):
        log.warning("g++ did not use the precompiled header: %s", output[-1000:])
        used = False
      return obj, tier, notes, used
    raise AssertionError("plan() always ends with the original source")

  async def _link_member(self, flags: buildspec.BuildFlags, ext: sources.InlineExtension,
                         main_obj: str, member: batch_lib.Batched) -> tuple[str, str]:
    """A batch member's module: the batch object with main.o, main.o's global names bound to
    the member's namespace. (path, "") or ("", why not)."""
    try:
      bindings = await asyncio.to_thread(batch_lib.defsyms, main_obj, member.path,
                                         member.namespace, self.confinement.tool)
    except (OSError, subprocess.CalledProcessError) as e:
      return "", f"its symbols could not be read: {e}"
    if not bindings:
      return "", "main.cpp needs none of its functions"
    try:
      return await self._objects.link(flags, ext.name, main_obj, member.path,
                                      tuple(bindings)), ""
    except compile_procs.ProcessFailed as e:
      return "", "linked with its batch, it failed: " + e.log[-200:].replace(member.path, "")

  async def _cuda_object(self, flags: buildspec.BuildFlags, cuda_text: str,
                         tiers: tuple[str, ...], may_batch: bool = True, problem: str = "",
                         may_split: bool = True
                         ) -> tuple[str | batch_lib.Batched | device_split.Halves, str,
                                    dict[str, str]]:
    """cuda.cu at the lightest tier that compiles: (object, tier, why lighter tiers were not
    used). Raises ProcessFailed with the original source's log if nothing compiles. While other
    builds are in flight, a lite source may share one translation unit with theirs (batch.py):
    then the object is a `batch.Batched`. A lite source no batch takes is built in two halves
    where it can be (device_split.py): then the object is a `device_split.Halves` and the tier
    SPLIT."""
    level = header_tiers.original_level(cuda_text)
    env = await self._envs.ensure(self._nvcc_argv(flags), level) if (tiers and level) else None
    variants, notes = header_tiers.plan(cuda_text, env, tiers)
    splittable = may_split and self._split is not None and variants[0][0] == LITE
    if splittable and may_batch and self._batcher is not None and self._building > 1:
      # With company, a batch first: per member it costs a fraction of a split build, whose CPU
      # is all fixed cost (BENCHMARKS.md, "Batches before the split"); the split serves the lone
      # ones, those no batch takes and, where it accepts them, the members of batches too small
      # to pay (batch.SMALL_BATCH).
      assert self._split is not None
      alone_ok = self._split.accepts(cuda_text, env, self._envs.folder(env.key))
      batched, why = await self._batch(flags, env, variants[0][1], problem, alone_ok)
      if batched is not None:
        return batched, LITE, notes
      notes["batch"], may_batch = why, False
      # Named in its batch's errors, it most likely does not compile: a split build would fail
      # first (both halves compiled, ~4 CPU-s), then the lite build below give its log.
      splittable = why != batch_lib.NAMED_IN_ERRORS
    if splittable:
      assert self._split is not None
      halves, why = await self._split.compile(flags, cuda_text, env, self._envs.folder(env.key),
                                              self._split_argv(flags, env))
      if halves is not None:
        return halves, SPLIT, notes
      notes[SPLIT] = why
    lite_log = None
    for tier, text in variants:
      if lite_log is not None and not header_tiers.heavier_may_help(lite_log, env):
        if tier == ORIGINAL:  # it fails there the same way: the lite log is the build's
          raise compile_procs.ProcessFailed(lite_log)
        notes[tier] = "not tried: the lite build failed on a name no torch header declares"
        continue
      cmd, module_id = self._cuda_command(flags, env, tier)
      if tier == LITE and may_batch and self._batcher is not None and self._building > 1:
        batched, why = await self._batch(flags, env, text, problem)
        if batched is not None:
          return batched, tier, notes
        notes["batch"] = why
      try:  # after a lite failure, likely to fail again: nvcc's device chain waits
        obj, _ = await self._objects.compile(cmd, text, "cuda.cu", module_id,
                                             host_first=lite_log is not None)
        return obj, tier, notes
      except compile_procs.ProcessFailed as e:
        self._tier_failed(env, tier, e, notes)
        if tier == LITE:
          lite_log = e.log
    raise AssertionError("plan() always ends with the original source")

  async def _batch(self, flags: buildspec.BuildFlags, env: header_tiers.Environment | None,
                   text: str, problem: str, alone_ok: bool = False
                   ) -> tuple[batch_lib.Batched | None, str]:
    """The lite-tier `text` in a batch (batch.py): (member, "") or (None, why not). `alone_ok`:
    the split path would build it (cheaper than a small batch)."""
    assert self._batcher is not None
    cmd, module_id = self._cuda_command(flags, env, LITE)
    shared = [a for a in cmd if not pch_lib.NAME_DEFINE_RE.match(a)]
    return await self._batcher.compile(shared, module_id, text, problem, alone_ok)

  def _split_argv(self, flags: buildspec.BuildFlags, env: header_tiers.Environment) -> list[str]:
    """nvcc's command (no -c/-o, no extension name) at the lite tier: the split's names are the
    headers' as that command sees them (split_names.py)."""
    return self._nvcc_argv(flags) + ["-isystem", str(self._envs.folder(env.key))]

  def _cuda_command(self, flags: buildspec.BuildFlags, env: header_tiers.Environment | None,
                    tier: str) -> tuple[list[str], str | None]:
    """cuda.cu's nvcc command at `tier` ("{src}", "{out}" to fill) and its module id (a light
    tier's own, so that every candidate's host code starts alike; None: nvcc's)."""
    extra = [] if tier == ORIGINAL else ["-isystem", str(self._envs.folder(env.key))]
    cmd = list(flags.nvcc) + list(flags.cuda_cflags) + extra + [
        "-c", "{src}", "-o", "{out}"] + list(flags.cuda_post_cflags)
    module_id = None if tier == ORIGINAL else f"_{env.key[:8]}_dice_{env.key[8:24]}"
    return cmd, module_id

  def _tier_failed(self, env: header_tiers.Environment | None, tier: str,
                   error: compile_procs.ProcessFailed, notes: dict[str, str]) -> None:
    """A lighter tier that did not compile is noted (and disabled for its environment when the log
    shows the tier broke it); the original source's failure is the build's, re-raised."""
    if tier == ORIGINAL or isinstance(error, compile_procs.LimitExceeded):
      raise error
    notes[tier] = "did not compile"
    if header_tiers.broken_by_tier(error.log, tier):
      self._envs.disable(env, tier, error.log)

  def _failed(self, key: str, error: compile_procs.ProcessFailed) -> BuildResult:
    """The failed build's result, kept as its record. CPU time over its bound ends as a timeout
    whose log is just the limit's line (the verdict's message quotes a timeout's log whole)."""
    cpu = isinstance(error, compile_procs.LimitExceeded) and error.limit == limits_lib.Limit.CPU
    text, truncated = bound_log(error.log.split("\n", 1)[0] if cpu else error.log,
                                self.options.max_log_bytes)
    result = BuildResult(ok=False, log=text, log_truncated=truncated, cache_key=key,
                         timed_out=cpu)
    self._write_record(key, result)
    return result

  def _protected(self) -> set[pathlib.Path]:
    """What pruning must leave alone: the shared headers this process uses."""
    return set(self._pch.in_use) | self._envs.in_use()

  # ------------------------------------------------------------------ header tiers

  @staticmethod
  def _nvcc_argv(flags: buildspec.BuildFlags) -> list[str]:
    return list(flags.nvcc) + [f for f in flags.cuda_cflags if not pch_lib.NAME_DEFINE_RE.match(f)
                               ] + list(flags.cuda_post_cflags)

  @staticmethod
  def _cxx_argv(flags: buildspec.BuildFlags) -> list[str]:
    return list(flags.cxx) + [f for f in flags.cflags if not pch_lib.NAME_DEFINE_RE.match(f)] + (
        list(flags.post_cflags))

  async def _tier_header(self, flags: buildspec.BuildFlags, env: header_tiers.Environment,
                         tier: str) -> pch_lib.Header | None:
    """main.cpp's header for `tier` (precompiled when allowed); None if the tier is off."""
    if tier not in env.blocks:
      return None
    name = header_tiers.header_name(tier)
    if not self.options.use_pch:
      return pch_lib.Header(str(self._envs.folder(env.key) / name), False)
    header = await self._pch.ensure(flags.cxx, flags.cflags,
                                    header_tiers.header_text(env.blocks[tier]), name,
                                    f"the {tier} torch headers for main.cpp")
    if not header.precompiled and header_tiers.broken_by_tier(header.error, tier):
      self._envs.disable(env, tier, header.error)
      return None
    return header

  async def _original_pch(self, flags: buildspec.BuildFlags) -> pch_lib.Header:
    text, name = _ORIGINAL_PCH
    return await self._pch.ensure(flags.cxx, flags.cflags, text, name,
                                  "torch/extension.h for main.cpp")

