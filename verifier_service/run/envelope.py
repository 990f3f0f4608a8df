"""The values that cross the worker's process boundaries: the job, and each side's report.

The scheduler builds a `Job`; it goes to the worker as one JSON line (pool.py), and the worker
hands it to both of its processes, with the device and what they may hold of their slot
(`Envelope`, written to each one's folder as job.json). Each process answers with one report
line: the judge's (`JudgeReport`, trusted) and the candidate's (`CandidateReport`, evidence that
candidate code may have bent; trusted/verdict.py bounds its values).

Each is read back with `from_json`, which refuses a value that is not an object, a missing or
unknown field, and a field of the wrong type, naming the field: a slip fails where the value is
read, not later as a KeyError or a verdict built from half a report. Every field is written, so
a reader sees the same fields whoever wrote them; the defaults are only for building one.

Decision: checked by hand against the dataclasses' own annotations (the few kinds used here:
str, int, float, bool, None, tuples, str-keyed dicts, unions, nested dataclasses), not with a
validation library: the GPU image ships without one, and its machines reach no package index.
Nested records that go into the Verdict unchanged (trials, timing, stage timings) are typed
here and checked again by the proto when the scheduler builds the Verdict.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar, Union

from verifier_service.run import job as job_lib

T = TypeVar("T")
Finding = tuple[str, str]  # (enums.EXPLOITS kind, evidence)


def _check(value: Any, hint: Any, where: str) -> Any:
  """`value` (parsed JSON) as `hint` says, or ValueError naming `where`; lists become tuples."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if hint is Any:
    return value
  if origin in (Union, types.UnionType):
    options = [a for a in args if a is not type(None)] if value is not None else [type(None)]
    if len(options) == 1:  # Optional: the error of the one type it could be
      return _check(value, options[0], where)
    errors = []
    for option in options:
      try:
        return _check(value, option, where)
      except ValueError as e:
        errors.append(str(e))
    raise ValueError(f"{where}: {value!r:.80} is none of {options}")
  if hint is type(None):
    if value is not None:
      raise ValueError(f"{where}: expected null, got {type(value).__name__}")
    return None
  if dataclasses.is_dataclass(hint) and isinstance(hint, type):
    return _from_object(hint, value, where)
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
      raise ValueError(f"{where}: expected {len(args)} items, got {len(value)}")
    return tuple(_check(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
  if origin is dict:
    if not isinstance(value, dict):
      raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    return {_check(k, args[0], f"{where} key"): _check(v, args[1], f"{where}[{k!r}]")
            for k, v in value.items()}
  if hint is float:  # an int is a number too, and stays one (a count in the timing stats)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ValueError(f"{where}: expected a number, got {type(value).__name__}")
    return value
  if hint in (int, str, bool):
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
      raise ValueError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
    return value
  raise TypeError(f"{where}: no check for {hint!r}")  # a field typed beyond what _check knows


def _from_object(cls: type[T], data: Any, where: str) -> T:
  if not isinstance(data, dict):
    raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
  hints = typing.get_type_hints(cls)
  fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
  missing, unknown = sorted(set(fields) - set(data)), sorted(set(data) - set(fields))
  if missing or unknown:
    raise ValueError(f"{where}: missing {missing}, unknown {unknown}")
  return cls(**{name: _check(data[name], hints[name], f"{where}.{name}") for name in fields})


class _Typed:
  """to_json / from_json for a frozen dataclass of the kinds `_check` knows."""

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)  # type: ignore[call-overload]

  def dumps(self) -> str:
    return json.dumps(self.to_json())

  @classmethod
  def from_json(cls: type[T], data: Any) -> T:
    return _from_object(cls, data, cls.__name__)


@dataclasses.dataclass(frozen=True)
class Job(_Typed):
  """One job, as the scheduler sends it to a worker slot."""
  job_id: str
  reference_source: str
  candidate_source: str
  options: job_lib.JobOptions
  # Fingerprint -> built module (in the compile cache; the worker copies each into the candidate's
  # folder). None: the candidate's load_inline compiles with torch's own (the naive benchmark).
  modules: dict[str, str] | None
  kernel_names: tuple[str, ...]
  kernel_namespaces: tuple[str, ...] = ()
  # Slots of its GPU whose memory this job may use (pool.WorkerPool.run, exclusive).
  memory_scale: int = 1


@dataclasses.dataclass(frozen=True)
class Share:
  """What a job's processes hold of their slot: what the sandbox settings give them."""
  sandboxed: bool
  gpu_memory_fraction: float = 0.0  # the candidate's process's CUDA allocator cap; 0: none
  memory_bytes: int = 0  # RLIMIT_DATA of each process where sandboxed
  read_only: tuple[str, ...] = ()  # what the sandbox leaves readable
  timing_core: bool = True  # both sides time on one CPU core (run/timing.py)
  warmup_together: bool = False  # both sides warm up at once (ServerConfig.warmup_together)

  @classmethod
  def of(cls, spec: dict[str, Any]) -> Share:
    """From the worker's sandbox settings (pool.sandbox_spec, scaled for the job)."""
    return cls(sandboxed=bool(spec.get("enabled")),
               gpu_memory_fraction=float(spec.get("gpu_memory_fraction") or 0.0),
               memory_bytes=int(spec.get("memory_bytes") or 0),
               read_only=tuple(spec.get("read_only") or ()),
               timing_core=bool(spec.get("timing_core", True)),
               warmup_together=bool(spec.get("warmup_together", False)))


@dataclasses.dataclass(frozen=True)
class Envelope(_Typed):
  """What the worker hands both of a job's processes (job.json in each one's folder)."""
  job: Job
  device: str  # torch device name: "cuda" (the slot's GPU) or "cpu" (test mode)
  share: Share


@dataclasses.dataclass(frozen=True)
class StageTiming:
  stage: str  # enums.STAGES
  duration_s: float


@dataclasses.dataclass(frozen=True)
class Trial:
  """One correctness trial (the Verdict's TrialResult)."""
  seed: int
  passed: bool
  max_abs_error: float
  max_rel_error: float
  message: str


@dataclasses.dataclass(frozen=True)
class Memory:
  """Bytes the verifier's own work puts in the candidate's process (the problem's tensors, and
  during timing the outputs it keeps: trusted/judge.timing_bytes), and that process's share (0:
  unbounded)."""
  problem_bytes: int
  share_bytes: int


Stats = dict[str, float]  # RuntimeStats fields (run/timing.stats)


@dataclasses.dataclass(frozen=True)
class JudgeReport(_Typed):
  """The judge's report: trusted, and the only word on correctness and timing."""
  stage: str  # the stage the run reached (STAGE_DONE when it finished)
  outcome: str | None  # None: the candidate's side ended the run (candidate_ended says how)
  message: str = ""
  candidate_ended: str = ""
  stage_timings: tuple[StageTiming, ...] = ()
  trials: tuple[Trial, ...] = ()
  findings: tuple[Finding, ...] = ()
  reference_ops: tuple[str, ...] | None = None  # None: the reference never ran
  environment: dict[str, str] = dataclasses.field(default_factory=dict)
  # The Verdict's TimingResult: "reference"/"candidate" (+ "_warm") stats and the speedups.
  timing: dict[str, float | Stats] | None = None
  timing_parts: dict[str, float] = dataclasses.field(default_factory=dict)
  memory: Memory | None = None
  cpu_s: float = 0.0  # the judge's process's CPU (user + system, every thread) at this report
  # The judge may serve another job (worker/process.py keeps it when the slot allows): its run
  # ended in step with the candidate's side, its device synchronised, and the torch globals it
  # checks are as they were before the job (trusted/judge.Globals).
  reusable: bool = False


@dataclasses.dataclass(frozen=True)
class CandidateFailure:
  """The candidate's process's own account of how the candidate failed."""
  outcome: str  # enums.OUTCOMES
  message: str
  out_of_memory: bool


@dataclasses.dataclass(frozen=True)
class Evidence:
  """What the candidate's process saw of the candidate's work (run/policy.py weighs it)."""
  kernel_names: tuple[str, ...] = ()
  launched: tuple[str, ...] | None = None  # None: not profiled
  own_fraction: float | None = None
  library: tuple[tuple[str, float], ...] = ()
  compute_ops: dict[str, int] = dataclasses.field(default_factory=dict)
  foreign_kernels: tuple[str, ...] = ()
  note: str = ""


@dataclasses.dataclass(frozen=True)
class CandidateReport(_Typed):
  """The candidate's process's report: evidence, never a way to an OK (trusted/verdict.py)."""
  error: CandidateFailure | None = None
  infra: str = ""  # the process failed before candidate code could have run
  finished: bool = False
  environment: dict[str, str] = dataclasses.field(default_factory=dict)
  sandbox: dict[str, str] = dataclasses.field(default_factory=dict)
  findings: tuple[Finding, ...] = ()
  evidence: Evidence | None = None  # None: the candidate never loaded
  forward_ops: tuple[str, ...] = ()
