"""Bounds on every compile-stage process tree, and how going over one is recognised and worded.

Each process the compile stage starts (a compiler command and everything it runs) is bounded
(compile/confine.py applies the bounds through its exec wrapper, confine_exec.c):
  memory      RLIMIT_DATA of each process (its heap and private mappings; RLIMIT_AS would also
              count program text and reservations), and where the host lets us have a cgroup v2,
              memory.max of the whole tree (cgroups.py);
  CPU time    RLIMIT_CPU of each process (SIGXCPU at the limit, SIGKILL 5 s later);
  file size   RLIMIT_FSIZE of each file written (SIGXFSZ);
  processes   pids.max of the tree's cgroup (v2, or v1's pids controller) where there is one;
              otherwise RLIMIT_NPROC, which the kernel does not enforce for root;
  output      what the server reads back of one process's output (procs.py kills it beyond).
Defaults are sized against the largest honest compile of DICE's data with headroom
(benchmarks/verifier_compile_limits.py; RELIABILITY.md, "The compile stage").

Going over a bound is the candidate's outcome (its source did it): compiler.py turns it into
COMPILE_ERROR, or TIMEOUT for CPU time, with a message naming the limit; never INFRA_ERROR.

How a breach is recognised (`exceeded`): the cgroup's own event counters where there is one;
otherwise the wrapper's report (the command killed by SIGXCPU or SIGXFSZ, the largest process's
peak memory at the limit) and the tools' own words for a refused allocation, a CPU or file-size
signal, or a refused fork. A candidate can make its own failure read like one of those (an
`#error` with those words): it then gets the same outcome with another wording, never a better
one, and never INFRA_ERROR.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import signal


class Limit(enum.Enum):
  """The bound a compile went over."""
  MEMORY = "memory"
  CPU = "CPU-time"
  FILE_SIZE = "file-size"
  PROCESSES = "process"
  OUTPUT = "output"


@dataclasses.dataclass(frozen=True)
class Limits:
  """Bounds of one compile-stage process tree. Bytes and seconds."""
  # Headroom over the largest honest compile measured (RELIABILITY.md has the runs): memory 1.7x
  # (3.5 GiB data: torch/extension.h parsed whole), CPU 2.8x (43 s), files 16x (16 MiB), tasks 16x.
  memory_bytes: int = 6 << 30
  cpu_s: int = 120
  file_bytes: int = 256 << 20
  processes: int = 64  # tasks (threads count) alive at once in one tree
  output_bytes: int = 16 << 20

  def __post_init__(self) -> None:
    for field in dataclasses.fields(self):
      if getattr(self, field.name) <= 0:
        raise ValueError(f"compile limit {field.name} must be positive, got "
                         f"{getattr(self, field.name)}")

  def shared(self) -> Limits:
    """The bounds of the server's own header builds: these, raised to SHARED where lower."""
    return Limits(*(max(mine, floor) for mine, floor in zip(dataclasses.astuple(self),
                                                            dataclasses.astuple(SHARED))))

  def describe(self, limit: Limit) -> str:
    """'its memory limit of 8.0 GiB per process' and the like."""
    value = {Limit.MEMORY: _size(self.memory_bytes), Limit.CPU: f"{self.cpu_s} s",
             Limit.FILE_SIZE: _size(self.file_bytes), Limit.PROCESSES: str(self.processes),
             Limit.OUTPUT: _size(self.output_bytes)}[limit]
    scope = {Limit.MEMORY: " per compiler process", Limit.CPU: " per compiler process",
             Limit.FILE_SIZE: " per file", Limit.PROCESSES: " at once",
             Limit.OUTPUT: " of compiler output"}[limit]
    return f"its {limit.value} limit of {value}{scope}"

  def message(self, limit: Limit) -> str:
    """The first line of a failed build's log, which the verdict's message quotes."""
    return f"error: compile exceeded {self.describe(limit)}"


# The server's own header builds (precompiled headers, header-tier environments): no candidate
# text, so bounded only against a runaway, with room for torch/extension.h's precompiled header
# (a ~750 MB file, mapped whole by every g++ that reads it).
SHARED = Limits(memory_bytes=16 << 30, cpu_s=1800, file_bytes=4 << 30)


def _size(n: int) -> str:
  for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
    if n >= 1 << shift:
      return f"{n / (1 << shift):.1f} {unit}"
  return f"{n} B"


@dataclasses.dataclass(frozen=True)
class Usage:
  """What the exec wrapper reported about one command: how it ended and what its tree used."""
  signal: int = 0  # the command was killed by this signal (0: it exited)
  code: int = 0
  max_rss_bytes: int = 0  # the largest single process of the tree
  cpu_s: float = 0.0  # user + system, the whole tree
  setup: str = ""  # the wrapper could not apply a layer: why (the command never ran)

  @classmethod
  def parse(cls, line: str) -> Usage | None:
    """The wrapper's report line (confine_exec.c); None if there is none (it was killed)."""
    words = line.split()
    if not words:
      return None
    if words[0] == "setup":
      return cls(setup=line.strip()[len("setup "):] or "unknown")
    try:
      kind, value, rss_kb, user, system = words[:5]
      number = int(value)
      return cls(signal=number if kind == "signal" else 0,
                 code=number if kind == "exit" else 0, max_rss_bytes=int(rss_kb) << 10,
                 cpu_s=float(user) + float(system))
    except ValueError:
      return None


# The tools' own words when a bound refused them (gcc, cc1plus, as, ld, nvcc, cicc, ptxas, sh).
_MEMORY_RE = re.compile(r"out of memory|memory exhausted|Cannot allocate memory|std::bad_alloc|"
                        r"[Mm]emory allocation failure|insufficient memory|"
                        r"memory segment unavailable", re.I)
_CPU_RE = re.compile(r"CPU time limit exceeded|signal 24\b|SIGXCPU")
_FILE_RE = re.compile(r"File size limit exceeded|File too large|signal 25\b|SIGXFSZ")
_FORK_RE = re.compile(r"(fork|spawn|clone|vfork)[^\n]*Resource temporarily unavailable|"
                      r"Resource temporarily unavailable[^\n]*(fork|spawn)|cannot fork", re.I)


def exceeded(usage: Usage | None, output: str, limits: Limits,
             events: Limit | None = None) -> Limit | None:
  """Which bound a failed command went over, if any. `events`: what the tree's cgroup counted."""
  if events is not None:
    return events
  if (usage is not None and usage.signal == signal.SIGXCPU) or _CPU_RE.search(output):
    return Limit.CPU
  if (usage is not None and usage.signal == signal.SIGXFSZ) or _FILE_RE.search(output):
    return Limit.FILE_SIZE
  if _MEMORY_RE.search(output) or (usage is not None and usage.max_rss_bytes
                                   >= 0.9 * limits.memory_bytes):
    return Limit.MEMORY
  if _FORK_RE.search(output):
    return Limit.PROCESSES
  return None
