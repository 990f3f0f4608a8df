"""The job child's sandbox: what candidate code (its Python and its compiled extension) may do.

Applied by each forked job child (worker.py: the judge and the candidate's process, each on its own)
in two calls, through the kernel's own mechanisms:

1. `enter_namespaces()` right after fork, while the child is still single-threaded (only a
   single-threaded process may create a user namespace): a new network namespace whose only
   interface is a loopback that is down, so no address is reachable (not the server's port, not the
   host, not the internet). As root it is created directly; as an ordinary user, inside a new user
   namespace that maps the user to itself.
2. `lock_down(policy)` after the trusted setup (CUDA context, memory cap, imports) and before the
   reference or the candidate is executed:
   - environment: replaced by an allow-list (no tokens or keys reach candidate code);
   - rlimits: CPU seconds, data segment (host memory; RLIMIT_AS would break CUDA's large virtual
     reservations, RLIMIT_DATA does not count them), file size, open files, no core files, and
     (as root) processes of the sandbox uid;
   - identity: as root, drop to the slot's own uid/gid with no supplementary groups and an empty
     capability bounding set; otherwise clear the capabilities the user namespace granted;
   - PR_SET_NO_NEW_PRIVS, and PR_SET_PDEATHSIG so the child never outlives its worker;
   - Landlock (when the kernel has it): read and execute beneath the toolchain and library
     folders, read and write in the job's own folder, the GPU and null/random device nodes, read
     of /sys and of the child's own /proc entries; no TCP bind or connect (ABI >= 4); no signals
     to, or abstract unix sockets of, processes outside the sandbox (ABI >= 6). Landlock also
     refuses ptrace of (and /proc/<pid>/mem of) any process outside the sandbox;
   - seccomp (libseccomp through `pyseccomp`): process creation, exec, non-unix sockets, ptrace,
     process_vm_readv/writev, mount, namespaces, bpf, perf_event_open, kernel keyrings, modules and
     the like are refused with EPERM, and so are signals to any process but the caller itself
     (kill, tgkill, rt_sigqueueinfo to another pid; tkill, pidfd_send_signal): the judge beside
     the candidate's process must be out of its reach even where Landlock cannot scope signals.
     With SECCOMP_RET_USER_NOTIF each refused call is also reported to the worker
     (`Supervisor`), which names it in the verdict as an exploit.

Each layer reports "on ..." or why it is off; with `strict` a missing layer is an error, so a host
that lacks a mechanism fails loudly instead of running candidates half-contained.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import glob
import os
import resource
import signal
import socket
import struct
import sys
from collections.abc import Mapping
from typing import Any

from verifier_service import enums

try:  # imported with the worker, before any sandbox: the child may not be able to read it later
  import pyseccomp
  _PYSECCOMP_ERROR = ""
except (ImportError, RuntimeError) as _e:  # RuntimeError: libseccomp.so.2 missing
  pyseccomp, _PYSECCOMP_ERROR = None, str(_e)

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWUSER, CLONE_NEWNET, CLONE_THREAD = 0x10000000, 0x40000000, 0x00010000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
_SYS_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (all architectures)

# Syscalls refused and reported, with the exploit each one means.
FORBIDDEN = {
    enums.PROCESS_SPAWN: ("fork", "vfork", "execve", "execveat"),
    enums.SANDBOX_VIOLATION: (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "mount",
        "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open",
        "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
        "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl",
        "syslog", "userfaultfd", "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm",
        "fanotify_init", "io_uring_setup", "mount_setattr", "fsopen", "fsmount", "move_mount",
        "open_tree"),
}

_ENV_KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "TORCH_", "LD_LIBRARY_PATH",
                      "PYTHONPATH", "LANG", "LC_", "OMP_", "OPENBLAS_", "MKL_")


class SandboxError(RuntimeError):
  """A layer the policy requires could not be applied."""


@dataclasses.dataclass
class Policy:
  """What one job may use. Sizes in bytes, times in seconds."""
  job_dir: str
  read_only: list[str]  # folders and files readable (and executable) below
  uid: int = 61000  # the slot's uid/gid when the worker runs as root
  memory_bytes: int = 16 << 30
  cpu_s: int = 600
  file_bytes: int = 256 << 20
  open_files: int = 1024
  processes: int = 512  # threads count too; only enforced for the dropped uid
  strict: bool = False

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def default_read_only(extra: list[str] | None = None) -> list[str]:
  """Interpreter, site-packages, system libraries and the CUDA toolkit: read-only."""
  paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr/lib", "/usr/lib64", "/lib",
           "/lib64", "/usr/local/lib", "/usr/share/zoneinfo", "/etc/ld.so.cache",
           "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/sys"]
  paths += [p for p in sys.path if p and os.path.isabs(p)]
  paths += [os.environ[k] for k in ("CUDA_HOME",) if k in os.environ]
  paths += extra or []
  out: list[str] = []
  for p in paths:
    real = os.path.realpath(p)
    if os.path.exists(real) and real not in out:
      out.append(real)
  return out


def _check(result: int, what: str) -> int:
  if result < 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")
  return result


# ----------------------------------------------------------------------------- namespaces


def enter_namespaces() -> str:
  """New network namespace (inside a new user namespace when not root). Single-threaded only."""
  uid, gid = os.getuid(), os.getgid()
  try:
    if uid == 0:
      _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
      return "on (network namespace)"
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
      with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
    return "on (user + network namespace)"
  except OSError as e:
    return f"off: {e}"


# ----------------------------------------------------------------------------- identity


def _drop_capabilities() -> None:
  """Empties the effective, permitted and inheritable sets (capset, version 3)."""
  header = struct.pack("=Ii", 0x20080522, 0)
  data = bytes(24)
  _check(_libc.syscall(126 if os.uname().machine == "x86_64" else 91, header, data),
         "capset")


def _drop_identity(uid: int) -> str:
  if os.getuid() != 0:
    _drop_capabilities()
    return f"on (uid {os.getuid()}, not root; capabilities cleared)"
  cap = 0
  while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
    cap += 1
  os.setgroups([])
  os.setresgid(uid, uid, uid)
  os.setresuid(uid, uid, uid)
  _drop_capabilities()
  return f"on (uid {uid}, dropped from root; no capabilities)"


def _reachable_sys_path(fds: dict[str, int]) -> None:
  """Points sys.path entries the new uid cannot traverse at fds opened before the drop.

  A folder can be world-readable while one of its parents is not (a pyenv under /root): the
  interpreter must still import from it, through /proc/self/fd/N, and Landlock still applies.
  """
  moved = {}
  for i, entry in enumerate(sys.path):
    if entry in fds and not os.access(entry, os.R_OK | os.X_OK):
      moved[entry.rstrip(os.sep) + os.sep] = f"/proc/self/fd/{fds[entry]}/"
      sys.path[i] = moved[entry.rstrip(os.sep) + os.sep].rstrip("/")
  if not moved:
    return
  # Packages already imported find their submodules through __path__, not sys.path.
  for module in list(sys.modules.values()):
    path = getattr(module, "__path__", None)
    if isinstance(path, list):
      for i, folder in enumerate(path):
        for old, new in moved.items():
          if isinstance(folder, str) and folder.startswith(old):
            path[i] = new + folder[len(old):]
  sys.path_importer_cache.clear()


# ----------------------------------------------------------------------------- Landlock

_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1, 2, 4, 8
_FS_FILE_ONLY = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | (1 << 14) | (1 << 15)
_FS_IOCTL_DEV = 1 << 15


def landlock_abi() -> int:
  """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
  result = _libc.syscall(_SYS_LANDLOCK[0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
  return max(result, 0)


def _fs_rights(abi: int) -> int:
  bits = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
  if abi >= 2:
    bits |= 1 << 13  # REFER
  if abi >= 3:
    bits |= 1 << 14  # TRUNCATE
  if abi >= 5:
    bits |= _FS_IOCTL_DEV
  return bits


def _add_path_rule(ruleset: int, path: str, access: int) -> bool:
  try:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
  except OSError:
    return False
  try:
    if not os.path.isdir(path):
      access &= _FS_FILE_ONLY
    attr = struct.pack("=Qi", access, fd)
    _check(_libc.syscall(_SYS_LANDLOCK[1], ruleset, 1, attr, 0), f"landlock_add_rule({path})")
    return True
  finally:
    os.close(fd)


def _landlock_ruleset(policy: Policy) -> tuple[int | None, str]:
  """Builds the ruleset (while paths can still be opened with the worker's rights)."""
  abi = landlock_abi()
  if abi == 0:
    return None, "off: the kernel has no Landlock (see /sys/kernel/security/lsm)"
  handled_fs = _fs_rights(abi)
  # landlock_ruleset_attr: handled fs rights; handled net rights (BIND_TCP | CONNECT_TCP, with
  # no rule allowing either); scoped (abstract unix sockets and signals). Its size selects fields.
  fields = [handled_fs] + ([0b11] if abi >= 4 else []) + ([0b11] if abi >= 6 else [])
  attr = struct.pack(f"={len(fields)}Q", *fields)
  ruleset = _check(_libc.syscall(_SYS_LANDLOCK[0], attr, ctypes.c_size_t(len(attr)), 0),
                   "landlock_create_ruleset")
  try:
    read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    for path in policy.read_only:
      _add_path_rule(ruleset, path, read)
    _add_path_rule(ruleset, policy.job_dir, handled_fs & ~((1 << 6) | (1 << 11)))  # no devices
    for dev in ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"):
      _add_path_rule(ruleset, dev, _FS_READ_FILE | _FS_WRITE_FILE)
    for dev in glob.glob("/dev/nvidia*"):
      _add_path_rule(ruleset, dev, read | _FS_WRITE_FILE | (handled_fs & _FS_IOCTL_DEV))
    own_proc = f"/proc/{os.getpid()}"
    for path in (own_proc, "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys",
                 "/proc/driver"):
      _add_path_rule(ruleset, path, read)
  except OSError:
    os.close(ruleset)
    raise
  extras = (["no TCP"] if abi >= 4 else []) + (["scoped signals/sockets"] if abi >= 6 else [])
  return ruleset, f"on (ABI {abi}{', ' if extras else ''}{', '.join(extras)})"


def _landlock_enforce(ruleset: int) -> None:
  try:
    _check(_libc.syscall(_SYS_LANDLOCK[2], ruleset, 0), "landlock_restrict_self")
  finally:
    os.close(ruleset)


# ----------------------------------------------------------------------------- seccomp


def _seccomp(notify_sock: socket.socket | None) -> str:
  if pyseccomp is None:
    if notify_sock is not None:
      notify_sock.close()
    return f"off: pyseccomp/libseccomp unavailable ({_PYSECCOMP_ERROR})"
  deny = pyseccomp.ERRNO(errno.EPERM)
  report = notify_sock is not None
  action = pyseccomp.NOTIFY if report else deny
  filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
  for names in FORBIDDEN.values():
    for name in names:
      try:
        filt.add_rule(action, name)
      except OSError:
        pass  # not a syscall on this architecture (e.g. fork on aarch64)
  # Threads are clones with CLONE_THREAD; anything else makes a process.
  filt.add_rule(action, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_THREAD, 0))
  # Signals only to itself: the judge, the worker and other jobs are processes of the same uid.
  me = os.getpid()
  for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
    filt.add_rule(action, name, pyseccomp.Arg(0, pyseccomp.NE, me))
  for name in ("tkill", "pidfd_send_signal"):
    filt.add_rule(action, name)
  # clone3 passes its flags in memory seccomp cannot read: ENOSYS makes glibc fall back to clone.
  filt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
  filt.add_rule(action, "socket", pyseccomp.Arg(0, pyseccomp.NE, socket.AF_UNIX))
  filt.add_rule(pyseccomp.ERRNO(errno.EACCES), "socket",
                pyseccomp.Arg(0, pyseccomp.EQ, socket.AF_UNIX))
  try:
    filt.load()
  except OSError:
    if not report:
      raise
    notify_sock.close()  # tells the worker no listener is coming
    return _seccomp(None) + " (no user notification on this kernel)"
  if report:
    # pyseccomp has no public accessor for the listener fd; libseccomp's C API does.
    fd = pyseccomp._libseccomp.seccomp_notify_fd(filt._filter)  # pylint: disable=protected-access
    _check(fd, "seccomp_notify_fd")
    socket.send_fds(notify_sock, [b"n"], [fd])
    os.close(fd)
    notify_sock.close()
  return "on (refused calls reported)" if report else "on (refused calls not reported)"


# ----------------------------------------------------------------------------- lock_down


def scrubbed_env(job_dir: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
  """Allow-listed variables plus caches pointed into the job folder."""
  environ = os.environ if environ is None else environ
  env = {k: v for k, v in environ.items() if k.startswith(_ENV_KEEP_PREFIXES)}
  env.update(PATH="/usr/bin:/bin", HOME=job_dir, TMPDIR=job_dir, USER="dice-sandbox",
             LOGNAME="dice-sandbox", PYTHONDONTWRITEBYTECODE="1",
             CUDA_CACHE_PATH=os.path.join(job_dir, ".nv"),
             TRITON_CACHE_DIR=os.path.join(job_dir, ".triton"),
             TORCHINDUCTOR_CACHE_DIR=os.path.join(job_dir, ".inductor"),
             XDG_CACHE_HOME=os.path.join(job_dir, ".cache"))
  return env


def _rlimits(policy: Policy) -> str:
  limits = [(resource.RLIMIT_CPU, policy.cpu_s, policy.cpu_s + 5),
            (resource.RLIMIT_DATA, policy.memory_bytes, policy.memory_bytes),
            (resource.RLIMIT_FSIZE, policy.file_bytes, policy.file_bytes),
            (resource.RLIMIT_NOFILE, policy.open_files, policy.open_files),
            (resource.RLIMIT_CORE, 0, 0)]
  if os.getuid() == 0:  # counts every process of the uid: only meaningful for the slot's own
    limits.append((resource.RLIMIT_NPROC, policy.processes, policy.processes))
  for which, soft, hard in limits:
    _, old_hard = resource.getrlimit(which)
    if old_hard != resource.RLIM_INFINITY:
      hard = min(hard, old_hard)
      soft = min(soft, hard)
    resource.setrlimit(which, (soft, hard))
  return (f"on (cpu {policy.cpu_s} s, data {policy.memory_bytes >> 20} MiB, file "
          f"{policy.file_bytes >> 20} MiB)")


def lock_down(policy: Policy, netns: str, notify_sock: socket.socket | None) -> dict[str, str]:
  """Applies every layer; returns {layer: "on ..." | "off: why"}. Irreversible."""
  layers = {"network": netns}
  os.environ.clear()
  os.environ.update(scrubbed_env(policy.job_dir))
  layers["environment"] = "on (allow-list)"
  layers["rlimits"] = _rlimits(policy)
  path_fds = {}
  for entry in sys.path:
    if entry and os.path.isdir(entry):
      path_fds[entry] = os.open(entry, os.O_PATH | os.O_DIRECTORY)
  if os.getuid() == 0:
    os.chown(policy.job_dir, policy.uid, policy.uid)
  ruleset, layers["landlock"] = _landlock_ruleset(policy)
  layers["identity"] = _drop_identity(policy.uid)
  _reachable_sys_path(path_fds)
  _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
  _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
  if os.getppid() == 1:  # the worker died before PDEATHSIG was armed
    os._exit(1)  # pylint: disable=protected-access
  layers["no_new_privs"] = "on"
  if ruleset is not None:
    _landlock_enforce(ruleset)
  layers["seccomp"] = _seccomp(notify_sock)
  missing = {k: v for k, v in layers.items() if v.startswith("off")}
  if policy.strict and missing:
    raise SandboxError(f"sandbox layers unavailable: {missing}")
  return layers


# ----------------------------------------------------------------------------- supervisor

_NOTIF_RECV, _NOTIF_SEND = 0xC0502100, 0xC0182101  # SECCOMP_IOCTL_NOTIF_RECV / _SEND
_NOTIF = struct.Struct("=QII iIQ6Q")
_RESP = struct.Struct("=QqiI")
_KIND = {name: kind for kind, names in FORBIDDEN.items() for name in names}
_KIND.update(clone=enums.PROCESS_SPAWN, socket=enums.NETWORK_ACCESS)
_KIND.update({name: enums.SANDBOX_VIOLATION for name in (
    "kill", "tgkill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal")})


class Supervisor:
  """The worker's end of SECCOMP_RET_USER_NOTIF: names each refused call, answers EPERM."""

  def __init__(self, fd: int):
    self.fd = fd
    self.violations: list[dict[str, str]] = []

  def handle(self) -> None:
    buf = bytearray(_NOTIF.size)
    try:
      fcntl.ioctl(self.fd, _NOTIF_RECV, buf, True)
    except OSError:
      return  # the calling thread was killed, or the child is gone
    notif_id, pid, _, nr, _, _, *args = _NOTIF.unpack(buf)
    name = _syscall_name(nr)
    detail = f"{name}(family {args[0]})" if name == "socket" else name
    evidence = f"{detail} refused by seccomp (pid {pid})"
    if len(self.violations) < 32 and evidence not in (v["evidence"] for v in self.violations):
      self.violations.append({"kind": _KIND.get(name, enums.SANDBOX_VIOLATION),
                              "evidence": evidence})
    try:
      fcntl.ioctl(self.fd, _NOTIF_SEND, _RESP.pack(notif_id, 0, -errno.EPERM, 0))
    except OSError:
      pass

  def close(self) -> None:
    os.close(self.fd)


def _syscall_name(nr: int) -> str:
  try:
    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, nr).decode()
  except Exception:  # pylint: disable=broad-except
    return f"syscall {nr}"
