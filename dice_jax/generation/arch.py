"""GPU architectures: which exist, which nvcc release can build them, and matching the verifier.

A kernel is written for one architecture (it goes into the prompt) and must be checked on it: a
generator asked for sm_80 whose verifier runs H200s (sm_90) would time kernels on the wrong chip.
So `check_arch` refuses (with the fix in the message) an architecture that does not exist, one the
verifier's nvcc cannot compile for, and one the verifier does not run on. `sm_90a`-style variants
(architecture-specific features) run on the base chip and match it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


@dataclasses.dataclass(frozen=True)
class ArchInfo:
  family: str
  examples: str
  min_cuda: tuple[int, int]              # first nvcc release that builds it
  max_cuda: tuple[int, int] | None = None  # last release that does (None: still supported)


# NVIDIA's compute capabilities (CUDA C++ Programming Guide, "Compute Capabilities"; CUDA 13.0
# release notes: Maxwell, Pascal and Volta removed, sm_101 renamed sm_110).
KNOWN: dict[int, ArchInfo] = {
    50: ArchInfo("Maxwell", "GTX 750", (6, 0), (12, 9)),
    52: ArchInfo("Maxwell", "GTX 980, M40", (6, 5), (12, 9)),
    53: ArchInfo("Maxwell", "Jetson Nano", (7, 0), (12, 9)),
    60: ArchInfo("Pascal", "P100", (8, 0), (12, 9)),
    61: ArchInfo("Pascal", "GTX 1080, P40", (8, 0), (12, 9)),
    62: ArchInfo("Pascal", "Jetson TX2", (8, 0), (12, 9)),
    70: ArchInfo("Volta", "V100", (9, 0), (12, 9)),
    72: ArchInfo("Volta", "Jetson Xavier", (10, 0), (12, 9)),
    75: ArchInfo("Turing", "T4, RTX 20xx", (10, 0)),
    80: ArchInfo("Ampere", "A100, A30", (11, 0)),
    86: ArchInfo("Ampere", "A10, A40, RTX 30xx", (11, 1)),
    87: ArchInfo("Ampere", "Jetson Orin", (11, 4)),
    89: ArchInfo("Ada Lovelace", "L4, L40S, RTX 40xx", (11, 8)),
    90: ArchInfo("Hopper", "H100, H200, GH200", (11, 8)),
    100: ArchInfo("Blackwell", "B200, GB200", (12, 8)),
    101: ArchInfo("Blackwell", "Jetson Thor (CUDA 12.8-12.9 name)", (12, 8), (12, 9)),
    103: ArchInfo("Blackwell", "B300, GB300", (12, 9)),
    110: ArchInfo("Blackwell", "Jetson Thor", (13, 0)),
    120: ArchInfo("Blackwell", "RTX 50xx, RTX PRO 6000", (12, 8)),
    121: ArchInfo("Blackwell", "DGX Spark (GB10)", (12, 9)),
}


class ArchError(ValueError):
  """The architecture is unknown, unsupported by the toolchain, or not what the verifier runs."""


def parse(arch: str) -> tuple[int, str]:
  """("sm_90a") -> (90, "a"); ArchError for anything that is not a known architecture."""
  m = _ARCH.match(arch.strip()) if isinstance(arch, str) else None
  if m is None or int(m.group(1)) not in KNOWN:
    known = ", ".join(f"sm_{k}" for k in KNOWN)
    raise ArchError(f"unknown GPU architecture {arch!r}; known: {known} (a/f variants such as "
                    "sm_90a are accepted)")
  return int(m.group(1)), m.group(2)


def describe(arch: str) -> str:
  """"sm_90 (Hopper: H100, H200, GH200)" for prompts and tables."""
  number, _ = parse(arch)
  info = KNOWN[number]
  return f"{arch} ({info.family}: {info.examples})"


def _cuda_version(text: str) -> tuple[int, int] | None:
  m = re.match(r"^(\d+)\.(\d+)", text or "")
  return (int(m.group(1)), int(m.group(2))) if m else None


def check_toolchain(arch: str, nvcc_version: str) -> None:
  """ArchError if the nvcc release `nvcc_version` ("13.0.48") cannot build `arch`."""
  number, _ = parse(arch)
  info, version = KNOWN[number], _cuda_version(nvcc_version)
  if version is None:
    return
  fmt = lambda v: f"{v[0]}.{v[1]}"  # noqa: E731
  if version < info.min_cuda:
    raise ArchError(f"{arch} ({info.family}) needs nvcc {fmt(info.min_cuda)} or newer; the verifier "
                    f"has nvcc {nvcc_version}")
  if info.max_cuda is not None and version > info.max_cuda:
    raise ArchError(f"nvcc {nvcc_version} (the verifier's) cannot compile for {arch} ({info.family}): "
                    f"support ended with CUDA {fmt(info.max_cuda)}")


def check_arch(arch: str, verifier_archs: Sequence[str], nvcc_versions: Sequence[str] = ()) -> str:
  """The checked architecture; ArchError unless it is known, buildable and what the verifier runs."""
  number, _ = parse(arch)
  for version in nvcc_versions:
    check_toolchain(arch, version)
  bases = {parse(a)[0] for a in verifier_archs if _ARCH.match(a or "")}
  if bases and number not in bases:
    raise ArchError(f"asked for {describe(arch)} but the verifier runs on "
                    f"{', '.join(sorted(verifier_archs))}: kernels would be checked and timed on a "
                    f"different GPU than they are written for. Pass arch={sorted(verifier_archs)[0]!r} "
                    "or use a verifier with that GPU")
  return arch
