"""The split path for cuda.cu: device code by nvcc without torch, host code by g++ with it.

split_source.py cuts a source in two and says why a source must not be cut; split_names.py says,
per toolchain, which names the cut must not meet. This module builds the halves, each through the
compile stage's process runner (confined and bounded like every compiler process):

  device half   nvcc with torch's own flags for cuda.cu (the source-as-written command: no tier
                folder), split into its front ends as usual (nvcc_split.py). Its text includes
                one header of the work folder (DEVICE_HEADER: the system headers the lite block
                starts with, cuda.h and cuda_runtime.h, the view SplitNames.device was computed
                against), then `#line 1`; its module id is one per environment (`module_id`).
  host half     g++ with nvcc's host preprocessing flags less the macros saying "this is nvcc"
                (split_names.host_command), `-x c++`, and `-include` a precompiled header of the
                lite tier's block, cuda.h, cuda_runtime.h and nvcc's declaration of
                __cudaPushCallConfiguration.
Both halves together: 10.3 CPU-s per DICE reference middle against 18.9 for the lite tier alone
(benchmarks/verifier_split_compile.py, the CPU VM under load), not the ~1 CPU-s of device code
compiled with no headers: the device half parses the lite block's system headers.

Decisions:
- Every candidate a cut cannot serve, and every half that does not compile or link, takes the
  usual path (header tiers, batches), which decides its verdict: a split only ever changes what a
  build costs. A half over a bound (limits.py) is final, as everywhere in the stage.
- The device half's headers are one include and its module id is fixed, as at the lite tier
  (compiler.py): every device half then starts with the same preprocessed text, so warm front
  ends (front_ends.py) and the precompiled host code of nvcc's last step (host_pch.py) serve it.
  On the H200 RL burst of 2026-12-04 (9015078, before this) device halves were 476 of a step's
  755 compile CPU-s: cudafe++ 2.46, cicc 1.96 and the last g++ 1.30 CPU-s each (medians), the
  candidate's own code a small part of each.
- The names and the precompiled header are built in the background once the first build asks
  (or `warm_up`), never waited for: until both exist, builds take the usual path.
- A source that includes more than the lite headers (`<math.h>`, `ATen/cuda/CUDAContext.h`: 22
  of the 26 of DICE's 99 phase-1 sources the split refused before) gets names computed with those
  includes too (split_names.Store, per include list, in the background once a build meets it):
  both halves keep the include lines, but for torch's headers, which only the host half keeps
  (after its precompiled header, parsed per build). A list must be plain header paths, at most
  split_names.MAX_EXTRAS, and a store computes at most MAX_EXTRA_LISTS (a source chooses them,
  and each is ten preprocessing runs); any other list, or one whose names cannot be computed (a
  header no folder holds), is refused.
- Checked, not assumed: the names are the installed headers' own (split_names.py); the split
  module's kernels are compared, SASS for SASS (cuobjdump), with the lite tier's build of a
  bundled source and DICE items, its exports with the lite module's, and its host function's
  answers and TORCH_CHECK message on CPU tensors (tests/verifier/test_verifier_split.py, slow).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pathlib
import typing

from verifier_service.compile import buildspec
from verifier_service.compile import header_tiers
from verifier_service.compile import objects as objects_lib
from verifier_service.compile import pch as pch_lib
from verifier_service.compile import procs as compile_procs
from verifier_service.compile import split_names
from verifier_service.compile import split_source

log = logging.getLogger(__name__)

HEADER = "dice_split_host.h"
# The device half as compiled: its headers in one file of the work folder, then `#line 1` so
# that the source's lines keep their numbers.
DEVICE_HEADER = "dice_split_device.h"
DEVICE_INCLUDE = f'#include "{DEVICE_HEADER}"\n#line 1\n'


@dataclasses.dataclass(frozen=True)
class Halves:
  """A split cuda.cu's two objects, linked with main.o in this order."""
  host: str
  device: str

  @property
  def objects(self) -> tuple[str, ...]:
    return (self.host, self.device)


class NotReady(Exception):
  """What a build needs is still being prepared (`extras`: the source's further includes whose
  names are missing); it takes the usual path."""

  def __init__(self, why: str, extras: tuple[str, ...] = ()):
    super().__init__(why)
    self.extras = extras


class DeviceSplit:
  """Builds split cuda.cu objects; `compile` answers (Halves, "") or (None, why not)."""

  def __init__(self, objects: objects_lib.Objects, headers: pch_lib.PrecompiledHeaders,
               scratch: pathlib.Path, run: split_names.RunFn):
    self._objects = objects
    self._headers = headers
    self._names = split_names.Store(scratch, run)
    self.stats = {"split": 0, "refused": 0, "failed": 0, "not_ready": 0}

  async def close(self) -> None:
    await self._names.close()

  def prepare(self, env: header_tiers.Environment, folder: pathlib.Path,
              nvcc_argv: list[str], extras: tuple[str, ...] = ()) -> None:
    """Starts computing the names and, once they are known, the host half's precompiled header;
    and the names for sources that also include `extras` (all in the background)."""
    if header_tiers.LITE not in env.blocks:
      return
    block = env.blocks[header_tiers.LITE]

    async def build() -> None:
      found = await self._names.ensure(folder, nvcc_argv, block, env.level)
      if found is not None:
        _, host = found
        self._headers.prefetch((host.compiler,), host.flags, self._header_text(env), HEADER,
                               "the lite torch headers for split host code")
        if extras:
          await self._names.ensure(folder, nvcc_argv, block, env.level, extras)
    asyncio.ensure_future(build())

  async def ready(self, env: header_tiers.Environment, folder: pathlib.Path,
                  nvcc_argv: list[str]) -> bool:
    """Waits for the names and the precompiled host header (starting them if need be); False
    where the split cannot serve this environment."""
    if header_tiers.LITE not in env.blocks:
      return False
    found = await self._names.ensure(folder, nvcc_argv, env.blocks[header_tiers.LITE], env.level)
    if found is None:
      return False
    _, host = found
    header = await self._headers.ensure((host.compiler,), host.flags, self._header_text(env),
                                        HEADER, "the lite torch headers for split host code")
    return header.precompiled

  async def ready_for(self, env: header_tiers.Environment, folder: pathlib.Path,
                      nvcc_argv: list[str], cuda_text: str) -> tuple[str, ...] | None:
    """`ready`, then the names for `cuda_text`'s further includes (split_source.extra_includes),
    which it returns; None where the split cannot serve them."""
    if not await self.ready(env, folder, nvcc_argv):
      return None
    names, _ = typing.cast(tuple, self._names.ready(folder))
    extras = split_source.extra_includes(cuda_text, names.block_includes)
    if extras and await self._names.ensure(folder, nvcc_argv, env.blocks[header_tiers.LITE],
                                           env.level, extras) is None:
      return None
    return extras

  def accepts(self, cuda_text: str, env: header_tiers.Environment, folder: pathlib.Path
              ) -> bool:
    """Whether `compile` would build `cuda_text` now (its environment's names and header
    ready, the source not refused), without building anything."""
    try:
      names, _, _ = self._ready(cuda_text, env, folder)
      split_source.plan(cuda_text, names)
    except (NotReady, split_source.Refused):
      return False
    return True

  def _ready(self, cuda_text: str, env: header_tiers.Environment, folder: pathlib.Path
             ) -> tuple[split_source.Names, split_names.HostCommand, pch_lib.Header]:
    """The names for `cuda_text` (its environment's, or those for its further includes), the
    host command and the precompiled header. Raises NotReady, or split_source.Refused where the
    source's further includes get no names."""
    found = self._names.ready(folder)
    if found is None:
      raise NotReady("its names are not computed yet")
    names, host = found
    header = self._headers.ready(
        self._headers.folder((host.compiler,), host.flags, self._header_text(env)), HEADER)
    if header is None:
      raise NotReady("its precompiled header is not built yet")
    extras = split_source.extra_includes(cuda_text, names.block_includes)
    if extras:
      if self._names.failed(folder, extras):
        raise split_source.Refused(f"includes {', '.join(extras)}: no names for these")
      found = self._names.ready(folder, extras)
      if found is None:
        if not self._names.admits(extras):
          raise split_source.Refused(f"includes {', '.join(extras)}: not a list the split takes")
        raise NotReady(f"the names for sources including {', '.join(extras)} are not computed "
                       "yet", extras)
      names = found[0]
    return names, host, header

  async def compile(self, flags: buildspec.BuildFlags, cuda_text: str,
                    env: header_tiers.Environment, folder: pathlib.Path,
                    nvcc_argv: list[str]) -> tuple[Halves | None, str]:
    """Both halves of `cuda_text` (at the lite tier's level `env`), or None and why not. A half
    that went over a bound is one of those: g++ prints, computes and allocates otherwise than
    nvcc's cudafe++ on the same host code (a flood of errors it does not stop at 100, constant
    expressions cudafe++ gives up on), so the usual path decides which bound, if any, the source
    goes over (tests/verifier/test_verifier_split_bounds.py)."""
    try:
      names, host, header = self._ready(cuda_text, env, folder)
      split = split_source.plan(cuda_text, names)
    except NotReady as e:
      self.prepare(env, folder, nvcc_argv, e.extras)
      self.stats["not_ready"] += 1
      return None, str(e)
    except split_source.Refused as e:
      self.stats["refused"] += 1
      return None, str(e)
    device_cmd = list(flags.nvcc) + list(flags.cuda_cflags) + [
        "-c", "{src}", "-o", "{out}"] + list(flags.cuda_post_cflags)
    name = [f for f in flags.cuda_cflags if pch_lib.NAME_DEFINE_RE.match(f)]  # not in the header
    host_cmd = [host.compiler, "-include", header.path, "-Winvalid-pch", *host.flags, *name,
                "-x", "c++", "-c", "{src}", "-o", "{out}"]
    results = await asyncio.gather(
        _as("device", self._objects.compile(
            device_cmd, DEVICE_INCLUDE + split.device, "cuda.cu", self.module_id(env),
            files={DEVICE_HEADER: self.device_header(env)})),
        _as("host", self._objects.compile(host_cmd, split.host, "cuda.cu", nvcc=False)),
        return_exceptions=True)
    for result in results:
      if isinstance(result, asyncio.CancelledError):
        raise result
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
      if not all(isinstance(r, compile_procs.ProcessFailed) for r in failed):
        log.error("the split path failed to run", exc_info=failed[0])
      self.stats["failed"] += 1
      if any(isinstance(r, compile_procs.LimitExceeded) for r in failed):
        return None, "a half went over a bound"
      return None, "a half did not compile"
    (device_obj, _), (host_obj, output) = typing.cast(list[tuple[str, str]], results)
    if pch_lib.REJECTED_RE.search(output):
      log.warning("g++ did not use the split host header: %s", output[-1000:])
    self.stats["split"] += 1
    return Halves(host_obj, device_obj), ""

  @staticmethod
  def device_header(env: header_tiers.Environment) -> str:
    """What the device half includes first (DEVICE_HEADER): the headers its names were computed
    against (split_names.device_prelude, cuda.h, cuda_runtime.h: the view `SplitNames.device`
    is the difference from)."""
    return (split_names.device_prelude(env.blocks[header_tiers.LITE]) +
            "#include <cuda.h>\n#include <cuda_runtime.h>\n")

  @staticmethod
  def module_id(env: header_tiers.Environment) -> str:
    """The device halves' nvcc module id, one per environment (as the lite tier's, compiler.py;
    another name, so that the two never share a cache entry or a warm process)."""
    return f"_{env.key[:8]}_dsplit_{env.key[8:24]}"

  @staticmethod
  def _header_text(env: header_tiers.Environment) -> str:
    return header_tiers.header_text(env.blocks[header_tiers.LITE] +
                                    "#include <cuda.h>\n#include <cuda_runtime.h>\n" +
                                    split_source.PUSH_DECLARATION)


async def _as(what: str, coro):
  """Runs `coro` with its processes recorded as `what` (procs.WHAT) in the build's trace."""
  compile_procs.WHAT.set(what)  # gather runs each in a task of its own: its own context
  return await coro
