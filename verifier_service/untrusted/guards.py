"""Observers that run beside candidate code in its process and record what it does.

Each returns findings as (Exploit name, evidence) pairs: evidence the worker weighs
(`trusted/exploits.py`, `run/policy.py`); nothing here decides a verdict. What torch computed in
forward is recorded by `ops.OpRecorder` (shared with the judge, which records the reference's ops).

- `ForwardTracer`: a `sys.settrace` hook over the same calls: frames of the reference's code during
  ModelNew.forward (INHERITS_REFERENCE), and exceptions raised in the candidate's frames that
  forward swallowed (TRY_EXCEPT_FALLBACK).
- `Tripwire`: a CPython audit hook (it cannot be removed once added) that attributes file, network,
  process and introspection events to candidate code: FILE_ACCESS, NETWORK_ACCESS, PROCESS_SPAWN,
  and MONKEY_PATCH for reading the verifier's frames or the garbage collector's object lists.
- `StateGuard`: identity snapshot of torch's, time's, builtins' and the verifier's functions and
  classes plus torch's global numeric settings, compared at every checkpoint: MONKEY_PATCH.
"""

from __future__ import annotations

import builtins
import collections
import os
import sys
import threading
import time
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from verifier_service import enums

_IGNORED_EXCEPTIONS = (StopIteration, StopAsyncIteration, GeneratorExit)


class ForwardTracer:
  """sys.settrace over one call: reference frames entered, exceptions swallowed by the candidate."""

  def __init__(self, candidate_files: set[str], reference_files: set[str]):
    self.candidate_files = candidate_files
    self.reference_files = reference_files
    self.reference_calls: collections.Counter[str] = collections.Counter()
    self.raised: list[str] = []
    self._previous: Any = None

  def _local(self, frame, event, arg):
    if event == "exception" and not issubclass(arg[0], _IGNORED_EXCEPTIONS):
      text = f"{arg[0].__name__}: {str(arg[1])[:120]} (candidate line {frame.f_lineno})"
      if text not in self.raised and len(self.raised) < 8:
        self.raised.append(text)
    return self._local

  def _global(self, frame, event, arg):
    del event, arg
    filename = frame.f_code.co_filename
    if filename in self.reference_files:
      self.reference_calls[getattr(frame.f_code, "co_qualname", frame.f_code.co_name)] += 1
      return None
    return self._local if filename in self.candidate_files else None

  def __enter__(self) -> ForwardTracer:
    self._previous = sys.gettrace()
    sys.settrace(self._global)
    return self

  def __exit__(self, *exc) -> None:
    sys.settrace(self._previous)

  def findings(self, returned: bool) -> list[tuple[str, str]]:
    out = []
    if self.reference_calls:
      calls = ", ".join(f"{k} x{n}" for k, n in sorted(self.reference_calls.items()))
      out.append((enums.INHERITS_REFERENCE, f"ModelNew.forward ran the reference's code: {calls}"))
    if returned and self.raised:
      out.append((enums.TRY_EXCEPT_FALLBACK,
                  "forward caught an exception and carried on: " + "; ".join(self.raised)))
    return out


_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty",
                   "os.posix_spawn", "os.spawn", "pty.spawn", "os.startfile"}
_INTROSPECTION_EVENTS = {"sys._getframe", "sys._current_frames", "gc.get_objects",
                         "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
                         "object.__getattr__", "code.__new__", "function.__new__",
                         "sys._getframemodulename"}


class Tripwire:
  """An audit hook that records what candidate code asks the interpreter to do."""

  def __init__(self, candidate_files: set[str], job_dir: str, read_roots: Iterable[str]):
    self.candidate_files = candidate_files
    self.job_dir = os.path.realpath(job_dir) + os.sep
    self.read_roots = tuple(os.path.realpath(r) for r in read_roots)
    self.own_proc = (f"/proc/{os.getpid()}/", "/proc/self/", "/proc/thread-self/")
    self.findings: list[tuple[str, str]] = []
    self.armed = False
    self._busy = threading.local()

  def install(self) -> None:
    sys.addaudithook(self._hook)

  def _add(self, kind: str, evidence: str) -> None:
    if (kind, evidence) not in self.findings and len(self.findings) < 32:
      self.findings.append((kind, evidence))

  def _from_candidate(self, frame: Any, immediate: bool) -> bool:
    """Whether candidate code made the call (`immediate`: directly; else anywhere below)."""
    while frame is not None:
      if frame.f_code.co_filename in self.candidate_files:
        return True
      if immediate:
        return False
      frame = frame.f_back
    return False

  def _allowed_path(self, path: str, write: bool) -> bool:
    if path.startswith(self.own_proc) or path in ("/dev/null", "/dev/urandom", "/dev/random",
                                                  "/dev/zero"):
      return True
    real = os.path.realpath(path)
    if real.startswith(self.job_dir) or real + os.sep == self.job_dir:
      return True
    if real.startswith("/dev/nvidia"):
      return True
    return not write and any(real == r or real.startswith(r + os.sep) for r in self.read_roots)

  def _hook(self, event: str, args: tuple) -> None:
    if not self.armed or getattr(self._busy, "on", False):
      return
    self._busy.on = True
    try:
      self._dispatch(event, args, sys._getframe(1))  # pylint: disable=protected-access
    except Exception:  # pylint: disable=broad-except
      pass  # an audit hook must never break the interpreter
    finally:
      self._busy.on = False

  def _dispatch(self, event: str, args: tuple, caller: Any) -> None:
    if event == "open":
      path, mode = args[0], args[1]
      if isinstance(path, bytes):
        path = os.fsdecode(path)
      if not isinstance(path, str):
        return
      path = os.path.join(os.getcwd(), path) if not os.path.isabs(path) else path
      flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
      write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
          flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
      if not self._allowed_path(path, bool(write)) and self._from_candidate(caller, False):
        self._add(enums.FILE_ACCESS, f"{'wrote' if write else 'opened'} {path}")
    elif event.startswith("socket.") and self._from_candidate(caller, False):
      self._add(enums.NETWORK_ACCESS, f"{event}{_short(args)}")
    elif event in _PROCESS_EVENTS and self._from_candidate(caller, False):
      self._add(enums.PROCESS_SPAWN, f"{event}{_short(args)}")
    elif event == "compile" and self._from_candidate(caller, True) and len(args) > 1:
      filename = args[1]
      if isinstance(filename, (str, bytes)):  # code the candidate compiles is the candidate's
        self.candidate_files.add(os.fsdecode(filename))
    elif event in _INTROSPECTION_EVENTS and self._from_candidate(caller, True):
      self._add(enums.MONKEY_PATCH, f"inspected the interpreter: {event}{_short(args[1:2])}")


def _short(args: tuple) -> str:
  text = repr(args)
  return text if len(text) < 160 else text[:157] + "..."


# ----------------------------------------------------------------------------- global state

_SETTINGS = {
    "torch.backends.cudnn.enabled": lambda: torch.backends.cudnn.enabled,
    "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
    "torch.backends.cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
    "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    "torch.backends.cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    "torch.get_float32_matmul_precision": torch.get_float32_matmul_precision,
    "torch.are_deterministic_algorithms_enabled": torch.are_deterministic_algorithms_enabled,
    "torch.get_default_dtype": torch.get_default_dtype,
    "torch._C._len_torch_function_stack": torch._C._len_torch_function_stack,  # pylint: disable=protected-access
    "torch._C._len_torch_dispatch_stack": torch._C._len_torch_dispatch_stack,  # pylint: disable=protected-access
    "torch.cuda.current_stream": lambda: (torch.cuda.current_stream().cuda_stream
                                          if torch.cuda.is_initialized() else None),
}


def _owners(extra: Iterable[Any]) -> list[Any]:
  owners: list[Any] = [torch, torch._C, torch.nn.functional, torch.cuda, time, builtins,  # pylint: disable=protected-access
                       torch.autograd, torch.profiler, torch.autograd.profiler, torch.overrides,
                       torch.utils._python_dispatch]  # pylint: disable=protected-access
  owners += [torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.cuda.Event,  # pylint: disable=protected-access
             torch.cuda.Stream, TorchDispatchMode]
  owners += list(extra)
  return owners


def _is_torch_wrapper(current: Any, original: Any) -> bool:
  """torch wraps some of its functions itself (torch._dynamo wraps manual_seed on import)."""
  code = getattr(current, "__code__", None)
  torch_dir = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
  return getattr(current, "__wrapped__", None) is original and code is not None and (
      os.path.realpath(code.co_filename).startswith(torch_dir))


class StateGuard:
  """Identity snapshot of functions and classes candidate code could replace.

  For torch, time and builtins only callables, classes and descriptors are compared; for the
  verifier's own modules (`own_modules`) every module-level value is, so a candidate cannot swap
  the policy's tables or the tolerances either.
  """

  def __init__(self, extra_owners: Iterable[Any] = (), own_modules: Iterable[Any] = ()):
    self._owners = _owners(extra_owners)
    self._own = list(own_modules)
    self._snapshot = [(o, dict(vars(o)), False) for o in self._owners] + [
        (m, dict(vars(m)), True) for m in self._own]
    self._settings = {k: self._read(f) for k, f in _SETTINGS.items()}

  @staticmethod
  def _read(getter) -> Any:
    try:
      return getter()
    except Exception:  # pylint: disable=broad-except
      return None

  def changes(self, ignore_settings: Iterable[str] = ()) -> list[tuple[str, str]]:
    found = []
    for owner, before, every_value in self._snapshot:
      now = vars(owner)
      for name, original in before.items():
        if not every_value and not (callable(original) or isinstance(
            original, (type, property, staticmethod, classmethod))):
          continue
        current = now.get(name, None)
        if current is not original and not _is_torch_wrapper(current, original):
          where = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
          found.append((enums.MONKEY_PATCH, f"replaced {where}"))
    for key, getter in _SETTINGS.items():
      if key in ignore_settings:
        continue
      value = self._read(getter)
      if value != self._settings[key]:
        kind = {"torch.cuda.current_stream": enums.SIDE_STREAM}.get(
            key, enums.TENSOR_SUBCLASS if key.endswith("_stack") else enums.MONKEY_PATCH)
        what = "left a torch mode active" if kind == enums.TENSOR_SUBCLASS else "changed"
        found.append((kind, f"{what}: {key} {self._settings[key]!r} -> {value!r}"))
    return found[:16]


def python_threads() -> list[str]:
  """Names of live Python threads other than the main one."""
  return [t.name for t in threading.enumerate() if t is not threading.main_thread()]


def os_thread_times() -> dict[int, tuple[int, str]]:
  """tid -> (user+system clock ticks, scheduler state "R"/"S"/...), from /proc/self/task."""
  times = {}
  try:
    tids = os.listdir("/proc/self/task")
  except OSError:
    return times
  for tid in tids:
    try:
      with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      times[int(tid)] = (int(fields[11]) + int(fields[12]), fields[0])
    except (OSError, IndexError, ValueError):
      pass
  return times
