"""Confinement of the compile stage: every process it starts runs sandboxed and bounded.

Why: the compile stage runs on candidate input. nvcc and g++ read whatever a source names
(`#include "/etc/hostname"`, `#line`, an assembler `.incbin`), a candidate's load_inline flags
reach the compilers as they are (`-wrapper`, `-fplugin`, `@file`, `-ccbin`: commands of its
choosing), and the verdict sends the diagnostics back to the client. Unconfined, that reads any
file the verifier's user can (tokens, TLS keys, other candidates' cache entries), reaches the
network, and takes as much memory and CPU as it likes.

How: each command runs under a small exec wrapper (confine_exec.c, compiled once per cache folder
with the host's C compiler) that applies the layers in the child between fork and exec and stays
outside as its parent, to report how the command ended and what its process tree used. Not
Python's preexec_fn: it is unsafe in a process with threads (the server has them), and a Python
wrapper would cost tens of milliseconds per process where fast compile paths take 50-400 ms; the
C wrapper's cost is measured by benchmarks/verifier_compile_limits.py (--overhead).

What a confined process may do:
- read and execute beneath the roots of `paths()`: the toolkit (and where its links lead), the
  compiler's install and the system's headers and libraries (/usr/bin, /usr/lib, /usr/include,
  ...), torch's include and lib folders and its nvidia-* wheels, Python's include folder, and the
  cache's shared header folders (pch/, headers/, warm/: torch's headers only, never a candidate's
  text; read, never written);
- read and write beneath its own build folder (also its TMPDIR and HOME), and /dev/null; read
  the extra files its command needs (a link's objects);
- nothing else of the host: not home folders, the verifier's token or TLS files, other builds'
  folders or cached objects, /tmp, /proc (Landlock);
- no network: a new network namespace with only a loopback that is down, no TCP (Landlock ABI
  >= 4), no socket() at all (seccomp);
- no other process: a new PID namespace (others have no pid it can name), signals and abstract
  unix sockets scoped (Landlock ABI >= 6), ptrace, process_vm_*, mount, namespaces, bpf,
  perf_event_open, keyrings, modules and the rest of the run sandbox's list refused (seccomp);
- no privilege: an empty capability bounding set (root gains none at exec), no_new_privs; its
  own IPC and UTS namespaces (host name "dice-compile"); an environment allow-list (no tokens).
Bounds: limits.py (and cgroups.py where the host has them).

What holds where (the start-up log names each layer as found, `Confinement.layers`):
- no Landlock, no seccomp (libseccomp), or namespaces the server may not create (an ordinary
  user where unprivileged user namespaces are off): the server refuses to start (below);
- Landlock ABI < 4 (no TCP rules): the network namespace and seccomp's socket refusal still hold;
  ABI < 6 (signals not scoped): the PID namespace still hides every other process;
- no cgroup we may use: memory and CPU are bounded per process only (rlimits); as root there is
  then no process-count bound (RLIMIT_NPROC does not apply to root), which the log says;
- an ordinary user: a user namespace is made too, and RLIMIT_NPROC bounds the tree.

Strict by default: at start-up (`Confinement.__init__`) a probe runs the wrapper with every layer;
if any layer cannot be applied on this kernel (no Landlock, no seccomp, no namespaces) the
server refuses to start and names what is missing. Decision (the unconfined switch,
`ServerConfig.compile_confine=False`, `--compile-unconfined`): compilers then run without the
sandbox layers but still bounded, the environment as it is; the server says so at start-up at
ERROR level, `dice-verifier check` prints it, and build records made unconfined carry a different
cache key (confined servers never reuse them). Verdicts do not repeat it: an operator chooses it
once per server, where logs are read; a client cannot act on it per verdict.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from verifier_service import enums
from verifier_service.compile import cache as cache_lib
from verifier_service.compile import cgroups as cgroups_lib
from verifier_service.compile import diagnostics
from verifier_service.compile import limits as limits_lib
from verifier_service.run import sandbox

log = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("confine_exec.c")
_SYSTEM_ROOTS = ("/usr/bin", "/bin", "/usr/sbin", "/usr/lib", "/usr/lib64", "/lib", "/lib64",
                 "/usr/libexec", "/usr/include", "/usr/local/include", "/etc/ld.so.cache",
                 "/etc/alternatives", "/proc/sys/vm/overcommit_memory", "/dev/urandom")
_ENV_KEEP = ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH",
             "CPLUS_INCLUDE_PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX", "CC", "CXX", "CUDAHOSTCXX",
             "TORCH_CUDA_ARCH_LIST", "LANG", "LANGUAGE", "TZ", "SOURCE_DATE_EPOCH")
_ENV_KEEP_PREFIXES = ("CUDA_", "NVCC_", "LC_")
# Namespace-creating clone flags: refused (a process gets no namespace of its own inside).
_CLONE_NS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
CONFINE_EXIT = 125  # the wrapper's exit code when a layer could not be applied


class ConfinementError(RuntimeError):
  """The compile stage cannot confine its processes (at start-up), or the wrapper could not
  apply a layer to one (later: the verifier's failure, never the candidate's)."""


@dataclasses.dataclass(frozen=True)
class Paths:
  """What confined processes may read, and our folders' neutral names in their output."""
  read: tuple[str, ...]
  names: dict[str, str]


def paths(cuda_root: str, cxx: str, cache_dir: pathlib.Path) -> Paths:
  """The read-only roots for this toolchain and cache folder (only those that exist)."""
  import torch  # pylint: disable=import-outside-toplevel  (the toolchain needs it anyway)
  torch_dir = os.path.dirname(torch.__file__)
  python = sysconfig.get_paths()
  # torch's CUDA libraries as wheels (nvidia-*), which its own libraries link against.
  wheels = os.path.join(os.path.dirname(torch_dir), "nvidia")
  read = [cuda_root, *_links_out(cuda_root), os.path.join(torch_dir, "include"),
          os.path.join(torch_dir, "lib"), wheels, python["include"], python["platinclude"],
          *_SYSTEM_ROOTS]
  compiler = os.path.dirname(os.path.dirname(os.path.realpath(shutil.which(cxx) or cxx)))
  if compiler not in ("/", "/usr"):
    read.append(compiler)  # a compiler installed in a prefix of its own
  seen: list[str] = []
  for path in read:
    if path and os.path.exists(path) and path not in seen:
      seen.append(path)
  seen += [str(cache_dir / part) for part in ("pch", "headers", "warm")]  # made when first used
  names = {str(cache_dir): "<cache>", torch_dir: "<torch>", cuda_root: "<cuda>",
           sys.prefix: "<python>", sys.base_prefix: "<python>"}
  return Paths(tuple(seen), {k: v for k, v in names.items() if k not in ("/", "/usr", "")})


def _links_out(root: str, depth: int = 3) -> list[str]:
  """Where symlinks in the toolkit's top folders lead outside it (a toolkit assembled from
  packages links its include and lib folders elsewhere): Landlock checks the resolved path."""
  out, real_root = [], os.path.realpath(root)
  for folder, dirs, files in os.walk(root):
    if folder[len(root):].count(os.sep) >= depth:
      dirs[:] = []
    for name in dirs + files:
      path = os.path.join(folder, name)
      if os.path.islink(path):
        target = os.path.realpath(path)
        if not (target + "/").startswith(real_root + "/") and target not in out:
          out.append(target)
  return out


def scrubbed_env(environ: dict[str, str]) -> dict[str, str]:
  """The compilers' variables (toolkit, compiler search paths, locale); no tokens or keys."""
  return {k: v for k, v in environ.items()
          if k in _ENV_KEEP or k.startswith(_ENV_KEEP_PREFIXES)}


class Confinement:
  """The wrapper, the seccomp filter, the roots, the cgroups and what the probe found."""

  def __init__(self, cache_dir: pathlib.Path, cuda_root: str, cxx: str, env: dict[str, str],
               limits: limits_lib.Limits, enabled: bool = True):
    self.limits = limits
    self.enabled = enabled
    self.folder = pathlib.Path(cache_dir) / "confine"
    self.folder.mkdir(parents=True, exist_ok=True)
    self.paths = paths(cuda_root, cxx, pathlib.Path(cache_dir))
    self.redactor = diagnostics.Redactor(list(self.paths.read), self.paths.names)
    self.env = scrubbed_env(env) if enabled else dict(env)
    self.wrapper = _build_wrapper(self.folder, env)
    self._filter = _export_filter(self.folder) if enabled and sandbox.pyseccomp else None
    self.cgroups, cgroup_note = cgroups_lib.probe(limits)
    self.layers = self._probe(cgroup_note)

  # ------------------------------------------------------------------ commands

  def argv(self, argv: list[str], rw: str | os.PathLike | None = None, reads: tuple[str, ...] = (),
           limits: limits_lib.Limits | None = None, nice: int = 0, report_fd: int | None = None,
           cgroups: list[str] | tuple[str, ...] = (), shared: bool = False) -> list[str]:
    """`argv` run through the wrapper: bounded always; sandboxed unless unconfined. `rw`: its
    build folder; `reads`: more files it may read; `shared`: a build of the server's own headers
    (their bounds, `Limits.shared`). Raises ConfinementError when there is no wrapper."""
    if self.wrapper is None:
      raise ConfinementError("the compile stage's exec wrapper is unavailable")
    limits = (limits or self.limits).shared() if shared else (limits or self.limits)
    out = [str(self.wrapper)]
    if self.enabled:
      out.append("-N")
      if rw is not None:
        out += ["-w", str(rw)]
      for path in self.paths.read + tuple(reads):
        out += ["-r", str(path)]
      out += ["-d", "/dev/null"]
      if self._filter is not None:
        out += ["-s", str(self._filter)]
    out += ["-m", str(limits.memory_bytes), "-t", str(limits.cpu_s), "-f", str(limits.file_bytes)]
    if self.enabled and os.getuid() != 0:  # counted per user namespace (kernel >= 5.14)
      out += ["-p", str(limits.processes)]
    if nice:
      out += ["-n", str(nice)]
    for folder in cgroups:
      out += ["-g", folder]
    if report_fd is not None:
      out += ["-R", str(report_fd)]
    return out + ["--"] + list(argv)

  def tool(self, argv: list[str], reads: tuple[str, ...]) -> list[str]:
    """A short tool run on our own files (readelf, nm, objdump on objects): confined, bounded."""
    return self.argv(argv, reads=reads) if self.wrapper is not None else list(argv)

  def clean(self, text: str, cwd: str | os.PathLike | None = None) -> str:
    return self.redactor.clean(text, cwd)

  def close(self) -> None:
    if self.cgroups is not None:
      self.cgroups.close()

  def describe(self) -> str:
    return "; ".join(f"{k}: {v}" for k, v in self.layers.items())

  # ------------------------------------------------------------------ start-up

  def _probe(self, cgroup_note: str) -> dict[str, str]:
    """Runs the wrapper once with every layer (and once per layer if that fails, to name each
    missing one); returns {layer: "on ..." | "off: why"}. Raises ConfinementError when confined
    and a layer is missing."""
    layers: dict[str, str] = {}
    if self.wrapper is None:
      layers["wrapper"] = "off: the exec wrapper did not compile (see the log above)"
    elif self.enabled:
      abi = sandbox.landlock_abi()
      layers.update(self._probe_layers(abi))
    else:
      layers["sandbox"] = ("off: UNCONFINED (compile_confine=False): compilers read any file the "
                           "verifier can and reach the network")
    if self.wrapper is not None and self.cgroups is not None:
      joined = self._probe_cgroups()
      if joined:
        log.warning("compile confinement: cgroups unused, a probe could not join one: %s", joined)
        self.cgroups.close()
        self.cgroups, cgroup_note = None, f"a probe could not join one: {joined}"
    limits = self.limits
    layers["memory"] = f"RLIMIT_DATA {limits_lib._size(limits.memory_bytes)} per process"  # pylint: disable=protected-access
    if self.cgroups is not None and self.cgroups.memory:
      layers["memory"] += " + memory.max per process tree"
    layers["cpu"] = f"RLIMIT_CPU {limits.cpu_s} s per process"
    layers["files"] = f"RLIMIT_FSIZE {limits_lib._size(limits.file_bytes)} per file"  # pylint: disable=protected-access
    shared = limits.shared()
    layers["shared headers"] = (
        f"their own bounds: {limits_lib._size(shared.memory_bytes)}, {shared.cpu_s} s, "  # pylint: disable=protected-access
        f"{limits_lib._size(shared.file_bytes)} per file")  # pylint: disable=protected-access
    if self.cgroups is not None and self.cgroups.pids:
      layers["processes"] = f"pids.max {limits.processes} per process tree"
    elif os.getuid() != 0 and self.enabled:
      layers["processes"] = (f"RLIMIT_NPROC {limits.processes} in each tree's user namespace "
                             "(per tree on kernels >= 5.14, per uid before)")
    else:
      layers["processes"] = ("off: no pids cgroup, and RLIMIT_NPROC is not applied to root or "
                             "counts every process of the uid")
    layers["cgroups"] = (self.cgroups.describe() if self.cgroups else
                         "none (per-process rlimits only)") + (
        f" ({cgroup_note})" if cgroup_note else "")
    layers["output"] = f"{limits_lib._size(limits.output_bytes)} read back per process"  # pylint: disable=protected-access
    missing = {k: v for k, v in layers.items() if k in ("wrapper", "namespaces", "landlock",
                                                         "seccomp") and v.startswith("off")}
    if self.enabled and missing:
      self.close()
      raise ConfinementError(
          "cannot confine the compile stage on this host: " + "; ".join(
              f"{k} {v}" for k, v in missing.items()) + ". Start the verifier with "
          "--compile-unconfined to compile without the sandbox (compilers then read any file "
          "the verifier can read and reach the network; bounds still apply).")
    return layers

  def _probe_layers(self, abi: int) -> dict[str, str]:
    with tempfile.TemporaryDirectory(dir=self.folder, prefix="probe-") as work:
      secret = pathlib.Path(self.folder, "probe-outside.txt")
      secret.write_text("outside\n")
      script = (f'test "$(uname -n)" = dice-compile || echo hostname; '
                f'cat {secret} 2>/dev/null && echo read; echo probed')
      full = self._run_probe(self.argv(["/bin/sh", "-c", script], rw=work))
      layers = {}
      if full.startswith("ok") and full.endswith("probed") and "read" not in full \
          and "hostname" not in full:
        layers["namespaces"] = "on (network, pid, ipc, uts" + (
            ", user" if os.getuid() else "") + ")"
        extras = ["no TCP"] if abi >= 4 else []
        extras += ["scoped signals and sockets"] if abi >= 6 else []
        layers["landlock"] = f"on (ABI {abi}" + "".join(f", {e}" for e in extras) + ")"
        layers["seccomp"] = "on" if self._filter is not None else \
            f"off: pyseccomp/libseccomp unavailable ({sandbox._PYSECCOMP_ERROR})"  # pylint: disable=protected-access
        layers["capabilities"] = "dropped (empty bounding set, no_new_privs)"
        return layers
      # Something failed: try each layer alone to say which.
      wrapper = str(self.wrapper)
      alone = {"namespaces": [wrapper, "-N", "--", "/bin/true"],
               "landlock": [wrapper, "-w", work, "-r", "/bin", "-r", "/usr", "-r", "/lib",
                            "--", "/bin/true"]}
      if self._filter is not None:
        alone["seccomp"] = [wrapper, "-s", str(self._filter), "--", "/bin/true"]
      for layer, argv in alone.items():
        result = self._run_probe(argv)
        layers[layer] = "on" if result.startswith("ok") else f"off: {result}"
      if abi == 0:
        layers["landlock"] = "off: the kernel has no Landlock (see /sys/kernel/security/lsm)"
      if self._filter is None:
        layers["seccomp"] = f"off: pyseccomp/libseccomp unavailable ({sandbox._PYSECCOMP_ERROR})"  # pylint: disable=protected-access
      if all(v == "on" for v in layers.values()):
        layers["probe"] = f"off: the confined probe did not behave as confined: {full[:300]}"
      return layers

  def _probe_cgroups(self) -> str:
    """Runs /bin/true in a group, as every command would: "" or why it failed."""
    try:
      folders = self.cgroups.make()
    except OSError as e:
      return str(e)
    try:
      with tempfile.TemporaryDirectory(dir=self.folder, prefix="probe-") as work:
        result = self._run_probe(self.argv(["/bin/true"], rw=work,
                                           cgroups=[str(f) for f in folders]))
    finally:
      for folder in folders:
        cgroups_lib._remove(folder)  # pylint: disable=protected-access
    return "" if result.startswith("ok") else result

  def _run_probe(self, argv: list[str]) -> str:
    """'ok <output>' or why the wrapper failed."""
    try:
      proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=self.env,
                            check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
      return str(e)
    if proc.returncode == CONFINE_EXIT and "dice_confine:" in proc.stderr:
      return proc.stderr.strip().split("dice_confine: ", 1)[-1]
    if proc.returncode != 0:
      return f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return "ok " + " ".join(proc.stdout.split())


def _build_wrapper(folder: pathlib.Path, env: dict[str, str]) -> pathlib.Path | None:
  """The wrapper binary, compiled once per source text (None if the host cannot)."""
  source = SOURCE.read_bytes()
  target = folder / f"dice_confine_{hashlib.sha256(source).hexdigest()[:16]}"
  if target.is_file():
    return target
  cc = shutil.which("cc", path=env.get("PATH")) or shutil.which("gcc", path=env.get("PATH"))
  if cc is None:
    log.error("compile confinement: no C compiler (cc, gcc) on PATH to build its exec wrapper")
    return None
  partial = cache_lib.partial_path(target)
  proc = subprocess.run([cc, "-O2", "-o", str(partial), str(SOURCE)], capture_output=True,
                        text=True, env=env, check=False)
  if proc.returncode != 0:
    log.error("compile confinement: the exec wrapper did not compile:\n%s", proc.stderr[-2000:])
    partial.unlink(missing_ok=True)
    return None
  os.replace(partial, target)
  return target


def _export_filter(folder: pathlib.Path) -> pathlib.Path | None:
  """The compile stage's seccomp filter as raw BPF: what the run sandbox refuses as violations
  (sandbox.FORBIDDEN), namespace creation, and every socket."""
  pyseccomp = sandbox.pyseccomp
  filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
  deny = pyseccomp.ERRNO(errno.EPERM)
  for name in sandbox.FORBIDDEN[enums.SANDBOX_VIOLATION]:
    try:
      filt.add_rule(deny, name)
    except OSError:
      pass  # not a syscall on this architecture
  for flag in _CLONE_NS:
    filt.add_rule(deny, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
  filt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")  # flags unreadable: glibc uses clone
  filt.add_rule(pyseccomp.ERRNO(errno.EACCES), "socket")
  with tempfile.NamedTemporaryFile(dir=folder, prefix="filter-", delete=False) as f:
    filt.export_bpf(f)
  data = pathlib.Path(f.name).read_bytes()
  target = folder / f"compile-{hashlib.sha256(data).hexdigest()[:16]}.bpf"
  os.replace(f.name, target)
  return target
