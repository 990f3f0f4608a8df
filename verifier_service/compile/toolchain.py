"""The compile toolchain and GPUs of this host, discovered once at start-up.

The `nvcc` on PATH may be a wrapper script (it is on our CPU CI machines), in which case torch's own
guess of CUDA_HOME (the parent of the folder holding `nvcc`) is wrong. We ask nvcc itself: with
`-dryrun` it prints `#$ TOP=<toolkit root>/bin/..`. CUDA_HOME is then exported before
`torch.utils.cpp_extension` is imported, so torch's flag logic (which the compiler reuses to stay
byte-identical to `load_inline`) sees the real toolkit, and so do the worker processes.

Everything here that changes a build's output (compiler versions, torch version, arch list) goes
into `Toolchain.fingerprint`, which is part of every compile-cache key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import re
import shutil
import socket
import subprocess

from verifier_service import __version__

_TOP_RE = re.compile(r"^#\$ TOP=(.+)$", re.MULTILINE)
_NVCC_RELEASE_RE = re.compile(r"release ([\d.]+), V([\d.]+)")


class ToolchainError(RuntimeError):
  """The host cannot compile CUDA extensions (no nvcc, no C++ compiler, no torch)."""


@dataclasses.dataclass(frozen=True)
class GpuDevice:
  """One visible NVIDIA GPU, as nvidia-smi reports it."""
  index: int
  name: str
  memory_total_bytes: int
  arch: str  # "sm_90"
  driver_version: str


@dataclasses.dataclass(frozen=True)
class Toolchain:
  """Paths and versions of everything that turns a candidate into a loadable module."""
  cuda_root: str
  nvcc: str
  nvcc_version: str
  cxx: str
  cxx_version: str
  torch_version: str
  torch_cuda_version: str
  python_version: str
  arch_list: str  # TORCH_CUDA_ARCH_LIST in effect, e.g. "9.0" or "9.0+PTX"
  gpus: tuple[GpuDevice, ...]

  @property
  def gpu_arch(self) -> str:
    """Compute capability the builds target, as "sm_90" (the highest in the arch list)."""
    versions = [a.split("+")[0] for a in self.arch_list.split(";") if a]
    best = max(versions, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))
    return "sm_" + best.replace(".", "")

  @property
  def fingerprint(self) -> str:
    """Hex digest of every version that can change a build's output."""
    fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "gpus"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

  def build_env(self) -> dict[str, str]:
    """Environment for compiler and worker subprocesses."""
    env = dict(os.environ)
    env["CUDA_HOME"] = self.cuda_root
    env["TORCH_CUDA_ARCH_LIST"] = self.arch_list
    bin_dir = os.path.join(self.cuda_root, "bin")
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env

  def environment(self) -> dict[str, str]:
    """The proto `Environment` fields this host can fill without touching a GPU."""
    gpu = self.gpus[0] if self.gpus else None
    return {
        "gpu_name": gpu.name if gpu else "",
        "driver_version": gpu.driver_version if gpu else "",
        "cuda_runtime_version": self.torch_cuda_version,
        "nvcc_version": self.nvcc_version,
        "torch_version": self.torch_version,
        "gpu_arch": gpu.arch if gpu else self.gpu_arch,
        "python_version": self.python_version,
        "server_version": __version__,
        "hostname": socket.gethostname(),
    }


def _run(cmd: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def find_cuda_root(nvcc: str | None = None) -> str:
  """Returns the real CUDA toolkit root, resolving wrapper scripts around nvcc.

  Order: $CUDA_HOME or $CUDA_PATH if it holds bin/nvcc; else ask the nvcc on PATH (`-dryrun`
  prints `TOP=`); else the grandparent of nvcc's resolved path.
  """
  for var in ("CUDA_HOME", "CUDA_PATH"):
    root = os.environ.get(var)
    if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
      return os.path.realpath(root)
  nvcc = nvcc or shutil.which("nvcc")
  if nvcc is None:
    raise ToolchainError("nvcc not found: put the CUDA toolkit's bin/ on PATH or set CUDA_HOME")
  try:
    proc = _run([nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    match = _TOP_RE.search(proc.stdout + proc.stderr)
  except (OSError, subprocess.TimeoutExpired):
    match = None
  if match:
    root = os.path.realpath(match.group(1).strip().strip('"'))
  else:
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
  if not os.path.isfile(os.path.join(root, "bin", "nvcc")):
    raise ToolchainError(f"could not locate the CUDA toolkit behind {nvcc} (tried {root})")
  return root


def probe_gpus() -> tuple[GpuDevice, ...]:
  """Lists GPUs through nvidia-smi without creating a CUDA context in this process."""
  smi = shutil.which("nvidia-smi")
  if smi is None:
    return ()
  query = "index,name,memory.total,compute_cap,driver_version"
  try:
    proc = _run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"], timeout_s=30)
  except (OSError, subprocess.TimeoutExpired):
    return ()
  if proc.returncode != 0:
    return ()
  gpus = []
  for line in proc.stdout.strip().splitlines():
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
      continue
    index, name, mem_mib, cap, driver = parts
    gpus.append(GpuDevice(index=int(index), name=name,
                          memory_total_bytes=int(float(mem_mib)) * (1 << 20),
                          arch="sm_" + cap.replace(".", ""), driver_version=driver))
  return tuple(gpus)


def _arch_list(gpus: tuple[GpuDevice, ...]) -> str:
  """TORCH_CUDA_ARCH_LIST as torch would derive it: the env var, else the visible GPUs + PTX."""
  env = os.environ.get("TORCH_CUDA_ARCH_LIST")
  if env and env != "native":
    return env
  caps = sorted({f"{g.arch[3:-1]}.{g.arch[-1]}" for g in gpus})
  if not caps:
    # No GPU and no explicit list: compile for Hopper, the farm's target, so CI builds are real.
    return "9.0"
  caps[-1] += "+PTX"
  return ";".join(caps)


def discover() -> Toolchain:
  """Finds nvcc, the C++ compiler, torch and the GPUs; exports CUDA_HOME for torch."""
  cuda_root = find_cuda_root()
  nvcc = os.path.join(cuda_root, "bin", "nvcc")
  proc = _run([nvcc, "--version"])
  match = _NVCC_RELEASE_RE.search(proc.stdout)
  nvcc_version = match.group(2) if match else proc.stdout.strip().splitlines()[-1]
  cxx = os.environ.get("CXX", "c++")
  cxx_path = shutil.which(cxx)
  if cxx_path is None:
    raise ToolchainError(f"C++ compiler {cxx!r} not found")
  cxx_version = _run([cxx_path, "--version"]).stdout.splitlines()[0]
  gpus = probe_gpus()
  arch_list = _arch_list(gpus)
  # torch.utils.cpp_extension reads these when imported; set them first.
  os.environ["CUDA_HOME"] = cuda_root
  os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ToolchainError("torch is not installed: install the 'verify' extra") from e
  return Toolchain(
      cuda_root=cuda_root, nvcc=nvcc, nvcc_version=nvcc_version, cxx=cxx_path,
      cxx_version=cxx_version, torch_version=torch.__version__,
      torch_cuda_version=torch.version.cuda or "", python_version=platform.python_version(),
      arch_list=arch_list, gpus=gpus)


def default_cache_dir() -> pathlib.Path:
  """$DICE_VERIFIER_CACHE, else $XDG_CACHE_HOME/dice-verifier, else ~/.cache/dice-verifier."""
  if "DICE_VERIFIER_CACHE" in os.environ:
    return pathlib.Path(os.environ["DICE_VERIFIER_CACHE"])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "dice-verifier"
