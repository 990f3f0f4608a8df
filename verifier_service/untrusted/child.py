"""The candidate's process: the only code that executes candidate Python or loads its kernels.

Forked by the worker (worker/process.py) from a process that imported torch once; it has its own
session, working folder and stdout, is sandboxed (run/sandbox.py) before any problem or candidate
code runs, and exits after this one job. Nothing here decides a verdict. It answers the judge's
commands (trusted/judge.py) over the boundary socket, sending the candidate's outputs as bytes
(run/wire.py), and reports evidence against the candidate (exploit findings, the torch ops forward
ran, the kernels it launched) to the worker on its own pipe. A candidate that subverts this process
can withhold evidence or send wrong bytes; it cannot change the judge's inputs, reference outputs,
comparison or reference timing, and a run it cuts short is never OK.

Order:
1. Trusted setup: CUDA context, GPU memory cap, imports (the profiler's included; no profiler
   session runs before timing). Nothing untrusted yet.
2. `lock_down()`: the sandbox, then the audit-hook tripwire and the state snapshot. (The
   dispatcher's snapshot was taken by the worker before it forked: untrusted/dispatch.py.)
3. The reference is executed here too, for `get_inputs`, `get_init_inputs` and Model's initial
   weights; its forward never runs in this process.
4. The judge's commands (each answered once; `stop` in an answer means this process already found
   a rejecting exploit, and the judge ends the run):
   meta          the reference's output layout and op list, fixed by the judge
   load          import the candidate (`load_inline` answered from the compile cache, normalised
                 as the compile stage normalised it: `InlineExtension.from_call`), build ModelNew
                 with the same seed and init inputs, copy matching weights from the reference
   trial S       inputs of seed S, allocator primed with NaN blocks of the output sizes, one
                 observed call; answer: the outputs and the inputs after the call, as bytes
   repeat A B    call on inputs A, overwrite the same tensors with B's values, call again
   aftermath S   side streams and threads (probes.py)
   warmup S C    warm-up calls on the inputs of seed S, on the judge's timing CPU core C
   time          a batch of timed calls (run/timing.py), each on the inputs rolled as the judge says
   keep          the calls of the last batch the judge drew for its secret check, kept
   output        outputs of the kept calls, as snapshotted when each timer stopped ("early") or
                 as they are now ("late")
   drop          forget the kept calls (the judge checked them after their batch: large outputs)
   profile S     own kernels launched and their share of the time (GPU: CUPTI; CPU: op times);
                 after timing: a CUPTI session slows every later launch in the process
   finish        the end: final checks, then the report
Any exception once candidate code has been loaded is the candidate's (it may have broken torch
under the verifier's feet): RUNTIME_ERROR, never INFRA_ERROR. The report says when it was the
allocator's out-of-memory error (`out_of_memory`): the scheduler may then run the job once more,
alone on its GPU with every slot's memory (service/scheduler.py), if the judge finds the problem
itself large for this process's share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import time
from typing import Any, Callable

import torch

from verifier_service import enums
from verifier_service.compile import sources
from verifier_service.run import envelope as envelope_lib
from verifier_service.run import ops
from verifier_service.run import policy
from verifier_service.run import problem
from verifier_service.run import timing
from verifier_service.run import wire
from verifier_service.untrusted import dispatch
from verifier_service.untrusted import guards
from verifier_service.untrusted import probes

_OOM_MARKERS = ("out of memory", "MemoryError", "bad_alloc", "Cannot allocate memory",
                "File too large", "No space left on device", "Too many open files")
_REJECTING_NOW = frozenset({
    enums.TRY_EXCEPT_FALLBACK, enums.INHERITS_REFERENCE, enums.OUTPUT_REUSE, enums.OUTPUT_CACHING,
    enums.SIDE_STREAM, enums.MONKEY_PATCH, enums.TENSOR_SUBCLASS, enums.FILE_ACCESS,
    enums.NETWORK_ACCESS, enums.PROCESS_SPAWN, enums.SANDBOX_VIOLATION, enums.DISPATCH_OVERRIDE})


class CandidateError(Exception):
  """The candidate (or what it did to this process) ended the run: a candidate outcome."""

  def __init__(self, outcome: str, message: str, found: list[tuple[str, str]] | None = None):
    super().__init__(message)
    self.outcome, self.message, self.found = outcome, message, found or []


def _oom(error: BaseException) -> list[tuple[str, str]]:
  text = f"{type(error).__name__}: {error}"
  return [(enums.RESOURCE_EXHAUSTION, text[:300])] if any(m in text for m in _OOM_MARKERS) else []


_OUT_OF_MEMORY = torch.OutOfMemoryError  # bound before any candidate code can rebind torch's


def _out_of_memory(error: BaseException | None) -> bool:
  """The device allocator refused an allocation (torch.OutOfMemoryError: CUDA's caching
  allocator over this process's cap or the GPU's memory)."""
  return isinstance(error, _OUT_OF_MEMORY)


def _patch_load_inline(modules: dict[str, str]) -> None:
  """Answers the candidate's load_inline calls with the modules the compile stage built."""
  from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel

  def load_inline(*args: Any, **kwargs: Any) -> Any:
    ext = sources.InlineExtension.from_call(*args, **kwargs)
    path = modules.get(ext.fingerprint)
    if path is None:
      raise RuntimeError(
          f"load_inline({ext.name!r}) was called with arguments the verifier did not see "
          "statically; sources must be literal strings or module-level constants")
    if not ext.is_python_module:
      torch.ops.load_library(path)
      return path
    spec = importlib.util.spec_from_file_location(ext.name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

  def load(*args: Any, **kwargs: Any) -> Any:
    del args, kwargs
    raise RuntimeError("torch.utils.cpp_extension.load is not supported; use load_inline")

  cpp_extension.load_inline = load_inline
  cpp_extension.load = load


def prepare_worker() -> None:
  """Run once in the worker before it forks: the first TorchDispatchMode imports torch._dynamo
  (seconds), torch.utils.cpp_extension (`_import_cpp_extension`), and the dispatcher's snapshot;
  every job's process inherits all three. Touches no CUDA and starts no thread."""
  with ops.OpRecorder(), guards.ForwardTracer(set(), set()):
    torch.ones(2).add(1)
  _import_cpp_extension()
  dispatch.baseline()


def _import_cpp_extension() -> None:
  """Imports torch.utils.cpp_extension (load_inline's module, which `_patch_load_inline` answers)
  without the one CUDA call its import makes: `_find_cuda_home` asks torch.cuda.is_available()
  only to word a warning, and that initialises the CUDA driver, after which no forked child can
  use CUDA. Decision: imported in each job's candidate process instead, the import step cost
  0.50 CPU-s of a 0.68 s set-up (setuptools, Cython, and the driver's initialisation that
  is_available() made, which the child now pays in torch.cuda.init: 0.25 CPU-s); the whole set-up
  went from 0.68 to 0.44 s alone, 1.44 to 1.15 s with 8 at once (H100 host,
  benchmarks/gpu_setup_cost.py, 2026-12-06, two machine starts)."""
  if "torch.utils.cpp_extension" in sys.modules:
    return
  available = torch.cuda.is_available
  torch.cuda.is_available = lambda: True  # no warning to word: the worker never uses CUDA
  try:
    importlib.import_module("torch.utils.cpp_extension")
  finally:
    torch.cuda.is_available = available


def trusted_setup(device_name: str, fraction: float) -> dict[str, str]:
  """Everything that needs more than the sandbox allows, done before it is applied and before
  the job is known (worker/pair.py). Returns the Verdict environment fields (GPU name and arch)."""
  device = torch.device(device_name)
  torch.set_num_threads(1)
  prepare_worker()  # a no-op after the worker's own call
  if device.type != "cuda":
    return {}
  torch.cuda.init()
  torch.zeros(1, device=device)
  if 0.0 < fraction < 1.0:
    # torch wants an index here; "cuda" alone (the worker's one visible GPU) is refused.
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
  props = torch.cuda.get_device_properties(device)
  # The profiler's Python side is imported now; its first session (after timing, sandboxed) then
  # only starts CUPTI, whose library `import torch` already mapped.
  importlib.import_module("torch.profiler")
  return {"gpu_name": props.name, "gpu_arch": f"sm_{props.major}{props.minor}"}


def _poison_allocator(sizes: list[int], device: torch.device) -> None:
  """Leaves NaN-filled blocks of these byte sizes in the caching allocator's free lists, so an
  output the candidate never writes reads NaN, not a right answer left from an earlier call."""
  blocks = [torch.full(((n + 3) // 4,), float("nan"), dtype=torch.float32, device=device)
            for n in sizes]
  del blocks


class _Observer:
  """What every observed ModelNew call records: ATen ops, reference frames, swallowed errors."""

  def __init__(self) -> None:
    self.recorder = ops.OpRecorder()
    self.found: list[tuple[str, str]] = []

  @contextlib.contextmanager
  def __call__(self):
    tracer = guards.ForwardTracer({problem.CANDIDATE_FILE}, {problem.REFERENCE_FILE})
    returned = False
    try:
      with self.recorder, tracer:
        yield
      returned = True
    finally:
      self.found += tracer.findings(returned)
      threads = guards.python_threads()
      if threads:
        self.found.append((enums.SIDE_STREAM, f"Python threads alive after forward: "
                           f"{', '.join(threads[:4])}"))


class CandidateSide:
  """State of one job in the candidate's process, and one handler per judge command."""

  def __init__(self, envelope: envelope_lib.Envelope, chan: wire.Channel,
               emit: Callable[[dict[str, Any]], None]):
    self.job, self.share, self.chan, self.emit = envelope.job, envelope.share, chan, emit
    self.device = torch.device(envelope.device)
    self.opts = envelope.job.options
    precision = self.opts.precision
    self.dtype = None if precision == enums.FP32 else problem.DTYPES[precision]
    self.seed = self.opts.seed
    self.found: list[tuple[str, str]] = []
    self.evidence: dict[str, Any] = {"kernel_names": list(self.job.kernel_names), "launched": None,
                                     "own_fraction": None, "library": [], "compute_ops": {}}
    self.observer = _Observer()
    self.meta: dict[str, Any] = {}
    self.ref: Any = None  # the reference's module, then the candidate's: candidate code
    self.reference: Any = None
    self.candidate: Any = None
    self.tripwire: guards.Tripwire | None = None
    self.state: guards.StateGuard | None = None
    self.registrations: dispatch.Registrations | None = None
    self.baseline_tids: set[int] = set()
    self.timer: timing.Timer | None = None
    self.base = self.buf = None
    self.early: list[Any] = []
    self.outs: list[Any] = []
    self.kept_early: list[Any] = []  # the outputs of the calls the judge drew (`keep`)
    self.kept_outs: list[Any] = []
    self.loading = self.dispatch_checked = False

  # ------------------------------------------------------------------ checks

  def sync(self) -> None:
    if self.device.type == "cuda":
      torch.cuda.synchronize()

  def findings(self) -> list[tuple[str, str]]:
    return self.found + self.observer.found + (self.tripwire.findings if self.tripwire else [])

  def checkpoint(self, registrations: bool = False) -> bool:
    """Collects tampering findings; True when one of them already rejects the candidate."""
    if self.state is not None:
      self.found.extend(f for f in self.state.changes() if f not in self.found)
    if registrations and self.registrations is not None and not self.dispatch_checked:
      self.dispatch_checked = True  # once, at the end: a full dump is the costly check
      self.found.extend(f for f in self.registrations.changes() if f not in self.found)
    return any(kind in _REJECTING_NOW for kind, _ in self.findings())

  # ------------------------------------------------------------------ setup

  def arm(self, lock_down: Callable[[], dict[str, str]]) -> dict[str, str]:
    layers = lock_down()
    self.tripwire = guards.Tripwire({problem.CANDIDATE_FILE}, os.getcwd(),
                                    list(self.share.read_only))
    self.tripwire.install()
    own = [sys.modules[__name__], guards, probes, ops, policy, problem, timing, wire, dispatch]
    self.state = guards.StateGuard([ops.OpRecorder, guards.ForwardTracer, guards.Tripwire,
                                    guards.StateGuard, _Observer, CandidateSide, wire.Channel,
                                    timing.Timer], own_modules=own)
    self.registrations = dispatch.baseline()
    self.ref = problem.exec_module("dice_reference", self.job.reference_source,
                                   problem.REFERENCE_FILE)
    sys.modules.pop("dice_reference", None)
    self.reference = problem.build(self.ref.Model, self.ref.get_init_inputs, self.seed,
                                   self.device)
    self.baseline_tids = set(guards.os_thread_times())
    # The naive baseline (no prebuilt modules) compiles inside load_inline: files and processes
    # the tripwire would name. It arms once the candidate is imported.
    self.tripwire.armed = self.job.modules is not None
    return layers

  def inputs(self, seed: int) -> Any:
    return problem.inputs(self.ref.get_inputs, seed, self.device, self.dtype)

  # ------------------------------------------------------------------ commands

  def on_meta(self, header: dict[str, Any]) -> None:
    self.meta = header

  def on_load(self, header: dict[str, Any]) -> dict[str, Any]:
    del header
    self.loading = True  # from here on, candidate code may run at any time
    self.emit({"phase": "CANDIDATE_LOADING"})
    if self.job.modules is not None:  # None: the naive baseline, torch compiles itself
      _patch_load_inline(self.job.modules)
    try:
      cand = problem.exec_module("dice_candidate", self.job.candidate_source,
                                 problem.CANDIDATE_FILE)
      new_cls = cand.ModelNew
    except Exception as e:  # pylint: disable=broad-except
      raise CandidateError(enums.RUNTIME_ERROR, f"candidate failed to import: {type(e).__name__}: "
                           f"{e}", _oom(e)) from e
    self.tripwire.armed = True
    model_cls = self.ref.Model
    if isinstance(new_cls, type) and issubclass(new_cls, model_cls):
      self.found.append((enums.INHERITS_REFERENCE, f"ModelNew subclasses the reference Model: "
                         f"{[c.__name__ for c in new_cls.__mro__]}"))
    try:
      candidate = problem.build(new_cls, self.ref.get_init_inputs, self.seed, self.device)
      problem.copy_matching_state(self.reference, candidate)
      candidate = candidate.to(self.device)
      self.candidate = candidate.to(self.dtype) if self.dtype else candidate
      self.sync()
    except Exception as e:  # pylint: disable=broad-except
      raise CandidateError(enums.RUNTIME_ERROR, f"building ModelNew failed: {type(e).__name__}: "
                           f"{e}", _oom(e)) from e
    if isinstance(self.candidate, torch.nn.Module) and any(
        isinstance(m, model_cls) for m in self.candidate.modules()):
      self.found.append((enums.INHERITS_REFERENCE,
                         "ModelNew holds an instance of the reference Model"))
    self.reference = None  # its weights are copied; nothing else here needs it
    return {"stop": self.checkpoint()}

  def call(self, args: Any, what: str = "ModelNew forward") -> Any:
    try:
      with torch.no_grad():
        out = self.candidate(*args)
      self.sync()
      return out
    except Exception as e:  # pylint: disable=broad-except
      raise CandidateError(enums.RUNTIME_ERROR, f"{what} raised {type(e).__name__}: {e}",
                           _oom(e)) from e

  def on_trial(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    seed = int(header["seed"])
    args = self.inputs(seed)
    _poison_allocator(self.meta.get("sizes", []), self.device)
    problem.set_seed(seed)
    with self.observer():
      out = self.call(args)
    outputs, out_bufs = wire.encode(out)
    inputs, in_bufs = wire.encode(args)
    aliases = problem.overlap(problem.spans(out), problem.spans(args))
    return ({"outputs": outputs, "inputs": inputs, "aliases_inputs": aliases,
             "stop": self.checkpoint()}, out_bufs + in_bufs)

  def on_repeat(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    held = self.inputs(int(header["seed_a"]))
    second_values = self.inputs(int(header["seed_b"]))
    first = problem.clone_tree(self.call(held, "ModelNew (repeated call)"))
    for dst, src in zip(problem.tensors(held), problem.tensors(second_values)):
      dst.copy_(src)
    second = problem.clone_tree(self.call(held, "ModelNew (repeated call)"))
    first_leaves, first_bufs = wire.encode(first)
    second_leaves, second_bufs = wire.encode(second)
    return ({"first": first_leaves, "second": second_leaves, "stop": self.checkpoint()},
            first_bufs + second_bufs)

  def on_aftermath(self, header: dict[str, Any]) -> dict[str, Any]:
    try:
      self.found += probes.aftermath_probe(self.candidate, self.inputs(int(header["seed"])),
                                           self.device, self.baseline_tids)
    except Exception as e:  # pylint: disable=broad-except
      raise CandidateError(enums.RUNTIME_ERROR, f"ModelNew raised on a repeated call: "
                           f"{type(e).__name__}: {e}", _oom(e)) from e
    return {"stop": self.checkpoint()}

  def on_profile(self, header: dict[str, Any]) -> dict[str, Any]:
    held = self.inputs(int(header["seed"]))
    self.evidence["compute_ops"] = self.observer.recorder.compute_ops()
    if self.device.type == "cuda":
      if self.job.kernel_names:
        profile = probes.kernel_profile(lambda: self.call(held), list(self.job.kernel_names),
                                        list(self.job.kernel_namespaces))
        if profile["note"]:
          self.evidence["note"] = profile["note"]
        else:
          self.evidence.update(launched=profile["launched"], own_fraction=profile["own_share"],
                               library=profile["library"], foreign_kernels=profile["foreign"])
    else:  # CPU test worker: the share of forward's CPU time outside torch's compute ops
      recorder = ops.OpRecorder()
      start = time.perf_counter()
      with recorder:
        self.call(held)
      total = time.perf_counter() - start
      self.evidence["own_fraction"] = max(0.0, 1.0 - recorder.compute_s / max(total, 1e-9))
    return {"evidence": self.evidence, "stop": self.checkpoint()}

  def on_warmup(self, header: dict[str, Any]) -> dict[str, Any]:
    core = header.get("cpu")
    if isinstance(core, int):  # the judge's timing core (run/timing.py), kept to the end
      with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {core})
    self.timer = timing.Timer(self.device)
    self.base = self.inputs(int(header["seed"]))
    self.buf = problem.clone_tree(self.base)
    min_s = min(max(0.0, float(header.get("min_s", timing.WARMUP_S))), timing.WARMUP_S)
    timing.warm_up(lambda: self.call(self.buf, "ModelNew (timed call)"), min_s=min_s)
    return {"stop": self.checkpoint()}

  def on_time(self, header: dict[str, Any]) -> dict[str, Any]:
    """A batch of timed calls: per call fresh values (the judge's roll), a snapshot of the output
    taken right after the end event, and the output itself, kept until the next batch."""
    self.early, self.outs, times = [], [], []
    keep = lambda out: self.early.append(problem.clone_tree(out))
    try:
      for shift, cold in zip(header["shifts"], header["colds"]):
        problem.copy_into(self.buf, problem.roll(self.base, int(shift)))
        with torch.no_grad():
          elapsed, out = self.timer(lambda: self.candidate(*self.buf), bool(cold), keep)
        times.append(elapsed)
        self.outs.append(out)
    except Exception as e:  # pylint: disable=broad-except
      raise CandidateError(enums.RUNTIME_ERROR, f"timing raised {type(e).__name__}: {e}",
                           _oom(e)) from e
    return {"us": times}

  def on_keep(self, header: dict[str, Any]) -> dict[str, Any]:
    """Keeps the drawn calls of the last batch (by index in it), for `output` after timing."""
    for index in header["calls"]:
      self.kept_early.append(self.early[int(index)])
      self.kept_outs.append(self.outs[int(index)])
    return {}

  def on_drop(self, header: dict[str, Any]) -> dict[str, Any]:
    """Forgets the kept calls: the judge has read back and compared them (judge.TimingPlan)."""
    del header
    self.kept_early, self.kept_outs = [], []
    return {}

  def on_output(self, header: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Outputs of the kept calls (by index among them), as snapshotted when the timer stopped or
    as they are now."""
    kept = self.kept_early if header.get("when") != "late" else self.kept_outs
    leaves, buffers = [], []
    for index in header["calls"]:
      out_leaves, out_buffers = wire.encode(kept[int(index)])
      leaves.append(out_leaves)
      buffers += out_buffers
    return {"outputs": leaves}, buffers

  def on_finish(self, header: dict[str, Any]) -> dict[str, Any]:
    del header
    return {"stop": self.checkpoint(registrations=True)}


def serve(side: CandidateSide) -> bool:
  """Answers the judge's commands until `finish` (True) or the judge closes the socket (False)."""
  handlers = {"meta": side.on_meta, "load": side.on_load, "trial": side.on_trial,
              "repeat": side.on_repeat, "aftermath": side.on_aftermath,
              "profile": side.on_profile, "warmup": side.on_warmup, "time": side.on_time,
              "output": side.on_output, "keep": side.on_keep, "drop": side.on_drop,
              "finish": side.on_finish}
  while True:
    try:
      header, _ = side.chan.recv()
    except wire.ProtocolError:
      return False
    op = header.get("op")
    answer = handlers[op](header)
    if answer is None:
      continue
    reply, buffers = answer if isinstance(answer, tuple) else (answer, [])
    side.chan.send(dict(reply, op=op), buffers)
    if op == "finish":  # when the judge had its answer (the worker's `candidate_after_finish`)
      side.emit({"phase": "CANDIDATE_FINISHED", "at": time.monotonic()})
      return True


def run(envelope: envelope_lib.Envelope, chan: wire.Channel,
        emit: Callable[[dict[str, Any]], None], lock_down: Callable[[], dict[str, str]],
        set_up: dict[str, Any]) -> envelope_lib.CandidateReport:
  """The candidate's side of one job; returns its report for the worker. Raises only where its
  report does not fit `CandidateReport` (the worker then has none). `set_up` is what
  `trusted_setup` returned before the job, or why it failed ({"error": ...})."""
  report = _run(envelope, chan, emit, lock_down, set_up)
  if report.get("evidence") is not None:
    report["evidence"] = {**dataclasses.asdict(envelope_lib.Evidence()), **report["evidence"]}
  return envelope_lib.CandidateReport.from_json({**envelope_lib.CandidateReport().to_json(),
                                                 **report})


def _run(envelope: envelope_lib.Envelope, chan: wire.Channel,
         emit: Callable[[dict[str, Any]], None], lock_down: Callable[[], dict[str, str]],
         set_up: dict[str, Any]) -> dict[str, Any]:
  """The fields of the report this run has; never raises."""
  report: dict[str, Any] = {"error": None, "infra": "", "finished": False}
  side = CandidateSide(envelope, chan, emit)
  try:
    if "error" in set_up:
      report["infra"] = f"CUDA unavailable in the candidate's process: {set_up['error']}"
      return report
    report["environment"] = dict(set_up["environment"])
    try:
      report["sandbox"] = side.arm(lock_down)
    except Exception as e:  # pylint: disable=broad-except
      report["infra"] = f"sandbox or reference setup failed: {type(e).__name__}: {e}"
      return report
    report["finished"] = serve(side)
  except CandidateError as e:
    report["error"] = {"outcome": e.outcome, "message": e.message,
                       "out_of_memory": _out_of_memory(e.__cause__)}
    side.found.extend(e.found)
  except BaseException as e:  # pylint: disable=broad-except
    # The verifier's own code raised in this process after the candidate was loaded: the
    # candidate broke the ground it stands on (an op it re-registered, a patched function), or
    # its memory and ours no longer fit in this process's share.
    if not side.loading:
      report["infra"] = f"{type(e).__name__}: {e}"
    else:
      report["error"] = {"outcome": enums.RUNTIME_ERROR, "message": (
          f"verifier code in the candidate's process raised {type(e).__name__}: "
          f"{str(e)[:300]} (after the candidate was loaded, so the candidate's doing)"),
          "out_of_memory": _out_of_memory(e)}
      side.found.extend(_oom(e))
  finally:
    if side.loading:
      with contextlib.suppress(Exception):
        side.checkpoint(registrations=True)
      report["findings"] = side.findings()
      report["evidence"] = dict(side.evidence,
                                compute_ops=side.observer.recorder.compute_ops())
      report["forward_ops"] = side.observer.recorder.summary()[:64]
  return report
