"""The compile stage's settings, one value: `Compiler(toolchain, cache_dir, CompilerOptions(...))`.

Most layers of the stage (ARCHITECTURE.md, "The compile stage") need others: header tiers are
what main.cpp's tier, batching, warm front ends and the split path work on; the split's host half
and host_pch.py need precompiled headers; warm front ends are nvcc's split front ends kept
running. A switch that asks for a layer whose base is off is a contradiction, refused here with
the reason, where before such a layer was silently off. Layers that are merely idle without their
base (main_tiers and batch_members without header tiers) are not refused: they are on by default.
ServerConfig.compiler_options maps a server's settings to this.
"""

from __future__ import annotations

import dataclasses

from verifier_service.compile import batch as batch_lib
from verifier_service.compile import cache as compile_cache
from verifier_service.compile import limits as limits_lib


@dataclasses.dataclass(frozen=True)
class CompilerOptions:
  max_jobs: int = 1  # compiler processes at once (the server: one per CPU core)
  max_log_bytes: int = 64 << 10  # a build's log as kept and returned (head and tail)
  use_pch: bool = True  # precompiled headers (main.cpp's, the split's host half, host_pch.py)
  light_headers: bool = True  # header tiers for cuda.cu (header_tiers.py): what most layers need
  main_tiers: bool = True  # main.cpp at the lite tier too (with light_headers)
  split_nvcc: bool = True  # nvcc's host and device front ends run concurrently (nvcc_split.py)
  warm_front_ends: bool = False  # front ends started ahead of time (front_ends.py)
  batch_members: int = batch_lib.MAX_MEMBERS  # cuda.cu sources per translation unit; 1: alone
  split: bool = False  # cuda.cu in two halves where the cut accepts it (device_split.py)
  # with split: the device halves' preprocessing from a snapshot of their headers' macros
  split_preprocess: bool = True  # (rest_preprocess.py)
  cache_max_bytes: int = compile_cache.DEFAULT_MAX_BYTES  # LRU-pruned beyond; 0: unbounded
  nice: int = 10  # compilers' niceness: a GPU job's timing is not disturbed by them
  limits: limits_lib.Limits = dataclasses.field(default_factory=limits_lib.Limits)
  confine: bool = True  # False: compilers unconfined (loudly logged; the limits still apply)

  def __post_init__(self) -> None:
    if self.max_jobs < 1:
      raise ValueError(f"max_jobs must be at least 1, got {self.max_jobs}")
    if self.max_log_bytes < 1024:
      raise ValueError(f"max_log_bytes must be at least 1024, got {self.max_log_bytes}")
    if self.batch_members < 0:
      raise ValueError(f"batch_members must be >= 0 (0 or 1: no batching), got "
                       f"{self.batch_members}")
    if self.cache_max_bytes < 0:
      raise ValueError(f"cache_max_bytes must be >= 0 (0: unbounded), got {self.cache_max_bytes}")
    if self.warm_front_ends and not (self.light_headers and self.split_nvcc):
      raise ValueError("warm_front_ends needs light_headers and split_nvcc (the front ends it "
                       "keeps warm are those of the lite tier's split nvcc)")
    if self.split and not (self.light_headers and self.use_pch):
      raise ValueError("split needs light_headers and use_pch (its host half is compiled "
                       "against the lite tier's precompiled header)")

  @property
  def batching(self) -> bool:
    return self.light_headers and self.batch_members > 1
