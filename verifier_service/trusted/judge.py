"""The judge: the trusted side of one job. It never loads candidate code.

Forked by the worker beside the candidate's process (untrusted/child.py). It is sandboxed too (the
reference is request-supplied code), but on its own: the candidate's process cannot signal, trace
or read it (seccomp, separate Landlock domains) and shares no memory with it, only a socket.

In order:
1. Trusted setup (CUDA), sandbox.
2. The reference is executed, built with the job's seed and run once: its output layout
   (structure, dtype, shape, device), fixed before the candidate runs; the byte sizes the
   candidate's allocator is primed with; the ops it computes (for the policy). A reference that
   fails is BAD_REFERENCE before the candidate is ever imported.
3. It drives the candidate's process (commands in untrusted/child.py):
   - correctness: per trial seed it regenerates the inputs itself, runs the reference on them,
     reads the candidate's outputs and inputs-after-the-call as bytes (run/wire.py) and compares
     them (compare.py; mutation: the candidate's inputs after its call against the reference's);
   - probes: caching (two calls on the same tensors with new values, both compared here) and
     aftermath (the candidate's process reports that);
   - timing (run/timing.py): in batches of calls, a batch of the reference here, then a batch of the
     candidate there (never both at once; who goes first alternates), every call on fresh input
     values (the same rolls on both sides). After each batch the judge decides, by a secret
     random draw, which of the candidate's outputs to read back and compare with its own for the
     same values (OUTPUT_CACHING; SIDE_STREAM when it was right only later), within a byte
     budget. Batches keep the round trips between the processes to a few per job. A problem
     whose drawn outputs would not fit KEPT_BYTES has them checked after their batch instead of
     after timing, and one whose timing copies cannot fit the candidate process's memory share
     at all ends INFRA_ERROR before timing (`timing_plan`).
   - profile: the candidate's own kernels launched and their share of the GPU time (its process
     reports them), and the partial-replacement policy on that split. Last, so that no profiler
     session runs before a timed call in either process.
4. It reports to the worker: trials, timing, its own findings, the reference's ops, where the
   candidate's side stopped if it did, and the problem's size against the candidate process's
   memory share (`memory`: what decides whether a candidate that ran out of memory gets a run
   alone on its GPU, verdict.short_of_memory). The worker merges that with the candidate's
   report and both exit statuses (trusted/verdict.py).
5. Whether it may serve another job (`reusable`): a worker that keeps judges (`judge_jobs`,
   worker/process.py) hands a judge the slot's next job only when its run ended in step with the
   candidate's side, its device still synchronises, and the torch globals `Globals` checks are as
   they were before the job. Each job still gets a candidate's process of its own.

Whatever the candidate's side sends that does not parse, is too large, contradicts the layout or
never arrives ends the run as the candidate's failure; the judge never raises for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import secrets
import sys
import time
from typing import Any, Callable

import torch

from verifier_service import enums
from verifier_service.run import budget as budget_lib
from verifier_service.run import envelope as envelope_lib
from verifier_service.run import job as job_lib
from verifier_service.run import ops
from verifier_service.run import policy
from verifier_service.run import problem
from verifier_service.run import timing
from verifier_service.run import wire
from verifier_service.trusted import compare

# Timed outputs of the candidate read back and compared, per job: at most VERIFIED_CALLS and
# VERIFY_BUDGET_BYTES, at least MIN_VERIFIED_CALLS. Decision: a sample, not every call. Speedups
# use the median, so a candidate must cheat on half of its timed calls to move it, and 24 calls
# drawn in secret miss that with probability 2^-24; checking all 200 calls cost ~50 ms a verdict.
VERIFIED_CALLS = 24
VERIFY_BUDGET_BYTES = 128 << 20
MIN_VERIFIED_CALLS = 4
BATCH_CALLS = 20  # timed calls per side and turn: 10 trials (cold + warm)
KEPT_BYTES = 512 << 20  # a batch's outputs each side keeps until the draw (bounds the batch)
_READ_BYTES = 256 << 20  # timed outputs read back per round trip (at least one call's)


def timing_bytes(input_bytes: int, output_bytes: int, batch_calls: int, kept_calls: int) -> int:
  """Bytes the timing stage makes the candidate's process hold at once (untrusted/child.py): the
  inputs twice (the timed values and the buffer they are rolled into), and two copies of every
  output of the batch and of every call kept for the secret check (the snapshot taken when the
  timer stopped, and the output itself).

  Why it is counted: on a problem with 4 GiB outputs (DICE 3497) the four kept calls and a batch of
  two come to 48 GiB in that process, our memory, not the candidate's; counted, running out there
  earns the run alone on its GPU (verdict.short_of_memory) instead of a RUNTIME_ERROR."""
  return 2 * input_bytes + 2 * (batch_calls + kept_calls) * output_bytes


@dataclasses.dataclass(frozen=True)
class TimingPlan:
  """How the timing stage runs on one problem (`Judge.timing_plan`): timed calls per batch, calls
  drawn for the secret check in all, whether each batch's drawn calls are read back and compared
  right after it (`each_batch`) rather than after timing, and the bytes that makes the candidate's
  process hold at most (`timing_bytes`).

  Decision: drawn calls whose outputs add up to more than KEPT_BYTES are checked after their batch,
  under the GPU's timing lock. Kept to the end they held 2 x 4 x 4 GiB on DICE 3497, which with a
  batch of two ran out of a 35.6 GiB share even alone on an H100 (2026-12-05); checked per batch,
  that process holds at most the batch's copies. The read-back costs the lock a few round trips,
  on such problems only (outputs over 128 MiB); what is compared is the same snapshot."""

  batch: int
  quota: int
  each_batch: bool
  peak_bytes: int


def plan_timing(input_bytes: int, output_bytes: int, verify: bool) -> TimingPlan:
  """The timing stage's plan for a problem whose largest trial's inputs take `input_bytes` and
  whose outputs take `output_bytes` a call (`verify`: timed outputs are checked at all)."""
  per_call = max(1, output_bytes)
  batch = max(2, min(BATCH_CALLS, KEPT_BYTES // per_call)) // 2 * 2
  quota = max(MIN_VERIFIED_CALLS, min(VERIFIED_CALLS, VERIFY_BUDGET_BYTES // per_call)) if (
      verify) else 0
  each_batch = quota * per_call > KEPT_BYTES
  return TimingPlan(batch, quota, each_batch,
                    timing_bytes(input_bytes, per_call, batch, 0 if each_batch else quota))


def _flags(device: torch.device) -> dict[str, Any]:
  """The torch settings that decide a computation's numerics or where it runs, as values."""
  cuda = torch.backends.cuda
  getters: dict[str, Callable[[], Any]] = {
      "default_dtype": torch.get_default_dtype,
      "default_device": lambda: str(torch.get_default_device()),
      "grad": torch.is_grad_enabled,
      "inference_mode": torch.is_inference_mode_enabled,
      "anomaly": torch.is_anomaly_enabled,
      "deterministic": torch.are_deterministic_algorithms_enabled,
      "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled,
      "float32_matmul_precision": torch.get_float32_matmul_precision,
      "threads": torch.get_num_threads,
      "cudnn": lambda: (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark,
                        torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32),
      "cuda_matmul": lambda: (cuda.matmul.allow_tf32,
                              cuda.matmul.allow_fp16_reduced_precision_reduction,
                              cuda.matmul.allow_bf16_reduced_precision_reduction),
      "fp32_precision": lambda: tuple(getattr(b, "fp32_precision", None) for b in (
          torch.backends, cuda.matmul, torch.backends.cudnn)),
      "sdp": lambda: (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
                      cuda.math_sdp_enabled()),
      "function_modes": torch._C._len_torch_function_stack,  # pylint: disable=protected-access
  }
  if device.type == "cuda":
    getters["cuda_stream"] = lambda: (torch.cuda.current_device(),
                                      torch.cuda.current_stream(device).cuda_stream)
  out: dict[str, Any] = {}
  for name, getter in getters.items():
    try:
      out[name] = getter()
    except Exception as e:  # pylint: disable=broad-except  (absent from this torch)
      out[name] = f"unreadable: {type(e).__name__}"
  return out


_MISSING = object()


class Globals:
  """What a reference's code could change in the judge's torch and leave behind for the judge's
  next job (a kept judge, worker/process.py): the settings `_flags` reads, and which object each
  name of torch's main namespaces (torch, torch.nn, torch.nn.functional, torch.Tensor,
  torch.nn.Module, torch.linalg, torch.fft) is bound to. Taken before a job, compared after it:
  a rebound or deleted name (a monkey-patch), a name added to a class, or a changed setting is a
  change; a name added to a module is not (torch imports submodules lazily). What this does not
  see (another module's globals, state inside C++ libraries) a reference from a problem set does
  not usually touch; the worker's `judge_jobs` bounds how far such state could carry."""

  def __init__(self, device: torch.device):
    self.device = device
    self.flags = _flags(device)
    self.names = {name: dict(vars(space)) for name, space in self._spaces()}

  @staticmethod
  def _spaces() -> list[tuple[str, Any]]:
    return [("torch", torch), ("torch.nn", torch.nn), ("torch.nn.functional", torch.nn.functional),
            ("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
            ("torch.linalg", torch.linalg), ("torch.fft", torch.fft)]

  def changed(self) -> list[str]:
    """What differs now from when this was taken (empty: nothing it checks)."""
    now = _flags(self.device)
    out = [f"{k}: {v!r} -> {now.get(k)!r}" for k, v in self.flags.items() if now.get(k) != v]
    for name, space in self._spaces():
      current, before = vars(space), self.names[name]
      out += [f"{name}.{key}" for key, value in before.items()
              if current.get(key, _MISSING) is not value]
      if isinstance(space, type):  # a name added to a class shadows its bases' (a patch)
        out += [f"{name}.{key} (added)" for key in current if key not in before]
    return out


@functools.cache
def _gpu_lock(device: torch.device) -> timing.GpuLock:
  """The GPU's timing lock, opened once per judge process: before its first sandbox closes, and
  kept for a kept judge's later jobs, which could not open it any more."""
  return timing.GpuLock.for_device(device)


class Ended(Exception):
  """Ends the judge's run with an outcome (None: the candidate's side decides, see verdict.py).

  `candidate` says why the candidate's side ended it; `in_step` is False when the socket can no
  longer be trusted to carry a command (the other side broke the protocol or went away).
  """

  def __init__(self, outcome: str | None, message: str, candidate: str = "",
               in_step: bool = True):
    super().__init__(message)
    self.outcome, self.message, self.candidate, self.in_step = (outcome, message, candidate,
                                                                in_step)


class Judge:
  """One job, seen from the trusted side."""

  def __init__(self, envelope: envelope_lib.Envelope, chan: wire.Channel,
               emit: Callable[[dict[str, Any]], None]):
    self.job, self.share, self.chan, self.emit = envelope.job, envelope.share, chan, emit
    self.device = torch.device(envelope.device)
    self.opts = envelope.job.options
    precision = self.opts.precision
    self.dtype = None if precision == enums.FP32 else problem.DTYPES[precision]
    self.seed = self.opts.seed
    self.atol = self.opts.atol or problem.DEFAULT_TOLERANCE[precision]
    self.rtol = self.opts.rtol or problem.DEFAULT_TOLERANCE[precision]
    self.result: dict[str, Any] = {"stage_timings": [], "trials": [], "findings": [],
                                   "stage": enums.STAGE_LOAD}
    self._started = time.monotonic()
    self.get_inputs: Callable[..., Any] | None = None
    self.reference: Any = None
    self.spec: list[dict[str, Any]] = []
    self.ref_aliases_inputs = False
    self.input_bytes = 0  # the largest inputs of a trial so far
    self.held_bytes = 0  # the most the timing stage made the candidate's process hold (`holding`)
    self.reference_s = 0.0  # one call of the reference (run/budget.py)
    self.pace_s = 0.0  # the slowest trial's exchange with the candidate's side, as timed here
    self.parts: dict[str, float] = {}  # seconds per part of the timing stage and after (`part`)
    # Timed calls whose outputs the candidate's process keeps for `check_timed_outputs`: their
    # index among all timed calls, and the reference's output for the same values.
    self.kept_calls: list[int] = []
    self.kept_outputs: list[Any] = []

  # ------------------------------------------------------------------ plumbing

  def enter(self, stage: str) -> None:
    now = time.monotonic()
    self.result["stage_timings"].append({"stage": self.result["stage"],
                                         "duration_s": now - self._started})
    self.result["stage"], self._started = stage, now
    self.emit({"phase": stage})

  def part(self, name: str, since: float) -> float:
    """Adds the seconds since `since` to part `name` of the report's `timing_parts` (where the
    judge's run goes: loading the reference and the candidate, the correctness trials, the probes,
    the timing stage's parts, the profile; the worker passes them on with its own,
    worker/process._timings)."""
    now = time.monotonic()
    self.parts[name] = self.parts.get(name, 0.0) + now - since
    return now

  def holding(self, batch_calls: int) -> None:
    """Notes what the next timed batch makes the candidate's process hold (`timing_bytes`), before
    it is asked to run it: if that process runs out of memory there, `memory` says so."""
    self.held_bytes = max(self.held_bytes, timing_bytes(
        self.input_bytes, wire.payload_bytes(self.spec), batch_calls, len(self.kept_calls)))

  def memory(self) -> envelope_lib.Memory:
    """Bytes the verifier's own work puts in the candidate's process (the largest trial's inputs
    and the reference's outputs; during timing, what `holding` noted) and of the memory that
    process may hold on this device: its GPU share (the allocator cap the worker set: a fraction
    of the GPU) or, on the CPU test device, its RLIMIT_DATA; 0 where neither is set."""
    if self.device.type == "cuda":
      total = torch.cuda.get_device_properties(self.device).total_memory
      fraction = self.share.gpu_memory_fraction
      share = int(total * fraction) if 0.0 < fraction < 1.0 else total
    else:
      share = self.share.memory_bytes if self.share.sandboxed else 0
    own = max(self.input_bytes + wire.payload_bytes(self.spec), self.held_bytes)
    return envelope_lib.Memory(problem_bytes=own, share_bytes=share)

  def sync(self) -> None:
    if self.device.type == "cuda":
      torch.cuda.synchronize()

  def budget(self, budget: budget_lib.Budget | None) -> None:
    """Tells the worker (and through it the pool) how long the next stretch of the job may take."""
    if budget is not None:
      self.emit(budget.to_message())

  def tell(self, header: dict[str, Any]) -> None:
    try:
      self.chan.send(header)
    except OSError as e:
      raise Ended(None, "", f"the candidate's process stopped listening ({e})", False) from e

  def ask(self, header: dict[str, Any], max_payload: int = 0) -> tuple[dict[str, Any], bytearray]:
    """One command and its answer; the candidate's side failing to answer ends the run."""
    self.tell(header)
    return self.answer(header, max_payload)

  def answer(self, header: dict[str, Any], max_payload: int = 0
             ) -> tuple[dict[str, Any], bytearray]:
    """The answer to `header`, a command told earlier (`ask`)."""
    try:
      reply, payload = self.chan.recv(max_payload)
    except (wire.ProtocolError, OSError) as e:
      raise Ended(None, "", f"no valid answer to {header['op']!r}: {e}", False) from e
    if reply.get("op") != header["op"]:
      raise Ended(None, "", f"answered {str(reply.get('op'))[:40]!r} to {header['op']!r}", False)
    if reply.get("stop"):
      raise Ended(None, "", f"its process reported a rejecting finding at {header['op']!r}")
    return reply, payload

  def decode(self, expected: list[dict[str, Any]], declared: Any,
             payload: memoryview) -> tuple[list[Any] | None, str, list[tuple[str, str]]]:
    try:
      return wire.decode(expected, declared, payload, self.device)
    except wire.ProtocolError as e:
      raise Ended(None, "", f"sent malformed output bytes: {e}", False) from e

  # ------------------------------------------------------------------ stages

  def load_reference(self) -> None:
    try:
      ref = problem.exec_module("dice_reference", self.job.reference_source,
                                problem.REFERENCE_FILE)
      sys.modules.pop("dice_reference", None)
      self.get_inputs = ref.get_inputs
      reference = problem.build(ref.Model, ref.get_init_inputs, self.seed, self.device)
      reference = reference.to(self.device)
      self.reference = reference.to(self.dtype) if self.dtype else reference
      args = problem.inputs(self.get_inputs, self.seed, self.device, self.dtype)
      recorder = ops.OpRecorder()
      start = time.perf_counter()
      with torch.no_grad(), recorder:
        out = self.reference(*args)
      self.sync()
      self.reference_s = time.perf_counter() - start
      if self.reference_s < budget_lib.REMEASURE_BELOW_S:
        start = time.perf_counter()
        with torch.no_grad():
          self.reference(*args)
        self.sync()
        self.reference_s = min(self.reference_s, time.perf_counter() - start)
    except Exception as e:  # pylint: disable=broad-except
      raise Ended(enums.BAD_REFERENCE, f"reference failed to load or run: {type(e).__name__}: "
                  f"{e}") from e
    self.spec = wire.spec(out)
    self.input_bytes = wire.payload_bytes(wire.spec(args))
    self.ref_aliases_inputs = problem.overlap(problem.spans(out), problem.spans(args))
    self.result["reference_ops"] = sorted(recorder.counts)
    self.tell({"op": "meta", "sizes": problem.output_sizes(out),
               "reference_ops": self.result["reference_ops"]})

  def run_reference(self, args: Any) -> Any:
    try:
      with torch.no_grad():
        out = self.reference(*args)
      self.sync()
      return out
    except Exception as e:  # pylint: disable=broad-except
      raise Ended(enums.BAD_REFERENCE, f"reference forward raised {type(e).__name__}: {e}") from e

  def trial(self, seed: int) -> dict[str, Any]:
    try:
      args = problem.inputs(self.get_inputs, seed, self.device, self.dtype)
    except Exception as e:  # pylint: disable=broad-except
      raise Ended(enums.BAD_REFERENCE, f"get_inputs() raised {type(e).__name__}: {e}") from e
    in_spec = wire.spec(args)
    self.input_bytes = max(self.input_bytes, wire.payload_bytes(in_spec))
    sent = time.perf_counter()
    self.tell({"op": "trial", "seed": seed})  # the candidate computes while the reference does
    ref_out = self.run_reference(args)
    try:
      reply, payload = self.chan.recv(wire.payload_bytes(self.spec) + wire.payload_bytes(in_spec))
      self.pace_s = max(self.pace_s, time.perf_counter() - sent)
    except wire.OversizedPayload as e:  # e.g. float64 outputs where the reference has float32
      _, why, _ = self.decode(self.spec, e.header.get("outputs"), memoryview(b""))
      if why:
        raise Ended(enums.INCORRECT,
                    f"trial {len(self.result['trials']) + 1} (seed {seed}): {why}") from e
      raise Ended(None, "", f"no valid answer to 'trial': {e}", False) from e
    except (wire.ProtocolError, OSError) as e:
      raise Ended(None, "", f"no valid answer to 'trial': {e}", False) from e
    if reply.get("op") != "trial":
      raise Ended(None, "", f"answered {str(reply.get('op'))[:40]!r} to 'trial'", False)
    if reply.get("stop"):
      raise Ended(None, "", "its process reported a rejecting finding at 'trial'")
    view = memoryview(payload)
    split = wire.payload_bytes(self.spec)
    outputs, why, found = self.decode(self.spec, reply.get("outputs"), view[:split])
    inputs_after, _, _ = self.decode(in_spec, reply.get("inputs"), view[split:])
    record = {"seed": seed, "passed": False, "max_abs_error": math.inf, "max_rel_error": math.inf,
              "message": why}
    if outputs is not None:
      ok, max_abs, max_rel, why, found = compare.compare(ref_out, outputs, self.atol, self.rtol)
      record.update(passed=ok, max_abs_error=max_abs, max_rel_error=max_rel, message=why)
    self.result["findings"] += found
    same = inputs_after is not None and compare.compare(
        problem.flatten(args), inputs_after, self.atol, self.rtol, what="input")[0]
    if not same:
      why = "ModelNew modified its inputs" if inputs_after is not None else "inputs unreadable"
      self.result["findings"].append((enums.INPUT_MUTATION, f"{why} (trial seed {seed})"))
      if record["passed"]:
        record.update(passed=False, message=f"{why}")
    elif reply.get("aliases_inputs") is True and not self.ref_aliases_inputs:
      self.result["findings"].append((enums.OUTPUT_REUSE, "returned memory of its own inputs; the "
                                      "reference does not"))
    return record

  @property
  def trial_bytes(self) -> int:
    """Bytes of one trial's answer: the outputs and the inputs after the call."""
    return wire.payload_bytes(self.spec) + self.input_bytes

  def correctness(self) -> None:
    self.enter(enums.STAGE_CORRECTNESS)
    seeds = problem.trial_seeds(self.seed, self.opts.num_correctness_trials)
    for n, seed in enumerate(seeds):
      record = self.trial(seed)
      self.result["trials"].append(record)
      if not record["passed"]:
        raise Ended(enums.INCORRECT, f"trial {len(self.result['trials'])} (seed {seed}): "
                    f"{record['message']}")
      if n == 0:
        self.budget(budget_lib.after_trial(self.opts, self.pace_s, len(seeds) - 1,
                                           self.trial_bytes))

  def probes(self) -> None:
    seed_a, seed_b = self.seed + 1, self.seed + 2
    expect_a = self.run_reference(problem.inputs(self.get_inputs, seed_a, self.device, self.dtype))
    expect_b = self.run_reference(problem.inputs(self.get_inputs, seed_b, self.device, self.dtype))
    n = wire.payload_bytes(self.spec)
    reply, payload = self.ask({"op": "repeat", "seed_a": seed_a, "seed_b": seed_b}, 2 * n)
    view = memoryview(payload)
    first, _, _ = self.decode(self.spec, reply.get("first"), view[:n])
    second, _, _ = self.decode(self.spec, reply.get("second"), view[n:])
    ok = lambda expect, got: got is not None and compare.compare(
        expect, got, self.atol, self.rtol)[0]
    if ok(expect_a, first) and not ok(expect_b, second) and not compare.same_values(
        expect_a, expect_b):
      # Caching is an output that follows the earlier inputs; any other wrong answer to the new
      # values is a wrong answer (a kernel at the edge of the tolerance, say), not a hack.
      if second is not None and (compare.same_values(first, second) or ok(expect_a, second)):
        self.result["findings"].append((
            enums.OUTPUT_CACHING, "second call on the same input tensors with new values returned "
            "the first call's output"))
      else:
        raise Ended(enums.INCORRECT, "a second call on the same input tensors with new values "
                    "returned a wrong output")
    self.ask({"op": "aftermath", "seed": seed_a})

  def profile(self) -> None:
    """The candidate's kernels and their share of the GPU time, then the policy on that work
    split. Decision: after timing, not before. A torch.profiler session with CUDA activity
    (CUPTI) added 22-83 us to every later call of a launch-bound model in its process (H200,
    benchmarks/verifier_timing_env.py), which inflated the candidate's times against
    the reference's; a first session after timing works inside the sandbox. The cost: a
    candidate the policy rejects is timed first."""
    reply, _ = self.ask({"op": "profile", "seed": self.seed + 1})
    evidence = reply.get("evidence") if isinstance(reply.get("evidence"), dict) else {}
    if policy.findings(self.opts.policy, self.opts.min_custom_kernel_fraction, evidence,
                       self.result["reference_ops"]):
      self.result.pop("timing", None)  # a rejected candidate has no speedup
      raise Ended(None, "", "the policy rejects the work split it reported")

  # ------------------------------------------------------------------ timing

  def timing_checks(self, base: Any) -> tuple[bool, bool]:
    """(roll inputs per call, verify timed outputs), decided on the reference alone.

    Rolling keeps every input's values (indices stay valid) but moves them, so a result cached by
    content is stale. It is off when the reference turns non-finite on rolled inputs (inputs with
    structure, like a symmetric matrix). Verification is off when the reference itself does not
    repeat (dropout in training mode, nondeterministic atomics).
    """
    first = problem.clone_tree(self.run_reference(problem.clone_tree(base)))
    again = self.run_reference(problem.clone_tree(base))
    verify = compare.compare(first, again, self.atol, self.rtol)[0]
    finite = lambda tree: all(bool(torch.isfinite(t).all()) for t in problem.tensors(tree)
                              if t.is_floating_point())
    try:
      with torch.no_grad():
        rolled = self.reference(*problem.roll(problem.clone_tree(base), 12345))
      rolling = finite(rolled) or not finite(first)
    except Exception:  # pylint: disable=broad-except
      rolling = False
    return rolling, verify

  def check_timed_outputs(self) -> None:
    """Reads back the timed calls the secret draw chose (the candidate's process kept them, as
    snapshotted when each call's timer stopped: `keep`) and compares each with the reference's
    output for the same values (10x the tolerance: the timed calls are not trials).

    Decision: after the GPU's timing lock is released, not batch by batch under it: reading back
    and comparing took a tenth of a second per job on the H200 box, while the lock is the one
    thing a GPU's slots wait for in turn. What is compared is the same: the snapshots were taken
    when each timer stopped."""
    calls, expected = self.kept_calls, self.kept_outputs
    self.kept_calls, self.kept_outputs = [], []
    if not calls or any(k in (enums.OUTPUT_CACHING, enums.SIDE_STREAM)
                        for k, _ in self.result["findings"]):
      return
    tol = (10 * self.atol, 10 * self.rtol)
    n = wire.payload_bytes(self.spec)

    def read(when: str, indices: list[int]) -> list[Any]:
      reply, payload = self.ask({"op": "output", "when": when, "calls": indices}, n * len(indices))
      declared = reply.get("outputs")
      if not isinstance(declared, list) or len(declared) != len(indices):
        raise Ended(None, "", "answered 'output' with the wrong number of outputs", False)
      view = memoryview(payload)
      return [self.decode(self.spec, d, view[k * n:(k + 1) * n])[0] for k, d in enumerate(declared)]

    ok = lambda expect, got: got is not None and compare.compare(expect, got, *tol)[0]
    # As many calls per round trip as fit in _READ_BYTES, at least one: the candidate's process
    # copies what it sends into host memory, so reading every kept call of a large problem at
    # once would cost that process the sum of their outputs (its memory, not the candidate's).
    per = max(1, _READ_BYTES // max(n, 1))
    wrong: list[int] = []
    for lo in range(0, len(calls), per):
      group = list(range(lo, min(lo + per, len(calls))))
      wrong = [k for k, got in zip(group, read("early", group)) if not ok(expected[k], got)]
      if wrong:
        break
    if not wrong:
      return
    k = wrong[0]
    late = read("late", [k])[0]
    kind = enums.SIDE_STREAM if ok(expected[k], late) else enums.OUTPUT_CACHING
    self.result["findings"].append((kind, f"timed call {calls[k]}: output did not match the "
                                    "reference for that call's inputs when the timer stopped"))

  def timing_plan(self, verify: bool) -> TimingPlan:
    """The timing stage's batches and secret check for this problem (`TimingPlan`), decided on the
    reference's output layout and the largest trial's inputs. When the copies it makes the
    candidate's process hold cannot fit that process's memory share, the run ends here,
    INFRA_ERROR (this slot cannot time the problem: the verifier's fault, never the candidate's),
    and `memory` reports those bytes, so the scheduler runs it once more alone on its GPU."""
    plan = plan_timing(self.input_bytes, wire.payload_bytes(self.spec), verify)
    share, peak = self.memory().share_bytes, plan.peak_bytes
    if share and peak > share:
      self.held_bytes = max(self.held_bytes, peak)
      raise Ended(enums.INFRA_ERROR, f"the timing stage's copies of inputs and outputs need "
                  f"{peak / 2**30:.2f} GiB in the candidate's process, more than its memory share "
                  f"({share / 2**30:.2f} GiB): this slot cannot time this problem")
    return plan

  def time_both(self, core: int | None, warmup_s: float = timing.WARMUP_S) -> None:
    """Timing, in batches of calls: the judge times a batch of the reference, the candidate's
    process a batch of the candidate on the same rolls, then (by a secret draw) some of the
    candidate's outputs are read back and compared; who goes first alternates per batch. The
    candidate's process is asked to time on `core`, the judge's own (run/timing.py); both sides
    warm up for `warmup_s` (timing.GpuLock.warmup_s), the candidate's first, or with
    `Share.warmup_together` both at once (neither is timed then: the lock is held for one warm-up
    instead of two in a row)."""
    self.enter(enums.STAGE_TIMING)
    mark = time.monotonic()
    base = problem.inputs(self.get_inputs, self.seed + 1, self.device, self.dtype)
    rolling, verify = self.timing_checks(base)
    plan = self.timing_plan(verify)  # ends the run here if our copies cannot fit the share
    buf = problem.clone_tree(base)
    timer = timing.Timer(self.device)
    mark = self.part("timing_setup", mark)
    warmup = {"op": "warmup", "seed": self.seed + 1, "cpu": core, "min_s": warmup_s}
    together = self.share.warmup_together
    self.tell(warmup)
    if not together:
      self.answer(warmup)
    timing.warm_up(lambda: self.run_reference(buf), min_s=warmup_s)
    if together:
      self.answer(warmup)
    mark = self.part("timing_warmup", mark)
    trials = self.opts.num_timing_trials
    batch, quota = plan.batch, plan.quota
    rng = random.Random(self.seed)  # (shift, cold) per call: cold, warm, cold, warm, ...
    calls = [(rng.randrange(1, 1 << 30) if rolling else 0, i % 2 == 0) for i in range(2 * trials)]
    secret = random.Random(secrets.randbits(64))
    samples: dict[bool, dict[str, list[float]]] = {True: {"ref": [], "cand": []},
                                                   False: {"ref": [], "cand": []}}
    for b, start in enumerate(range(0, len(calls), batch)):
      chunk = calls[start:start + batch]
      chosen = []  # selection sampling: `quota` calls of all, uniformly, unknown in advance
      for k in range(len(chunk)):
        if secret.random() * (len(calls) - start - k) < quota - len(chosen):
          chosen.append(k)
      kept = []
      for side in (("ref", "cand") if b % 2 == 0 else ("cand", "ref")):
        if side == "ref":
          for k, (shift, cold) in enumerate(chunk):
            problem.copy_into(buf, problem.roll(base, shift))
            try:
              with torch.no_grad():
                elapsed, out = timer(lambda: self.reference(*buf), cold)
            except Exception as e:  # pylint: disable=broad-except
              raise Ended(enums.BAD_REFERENCE, f"reference raised while timed: {e}") from e
            samples[cold]["ref"].append(elapsed)
            if k in chosen:
              kept.append(problem.clone_tree(out))
        else:
          self.holding(len(chunk))
          reply, _ = self.ask({"op": "time", "shifts": [s for s, _ in chunk],
                               "colds": [c for _, c in chunk]})
          times = reply.get("us")
          if not isinstance(times, list) or len(times) != len(chunk) or not all(
              isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in times):
            raise Ended(None, "", f"reported invalid times {str(times)[:60]}", False)
          for (_, cold), elapsed in zip(chunk, times):
            samples[cold]["cand"].append(float(elapsed))
      quota -= len(chosen)
      mark = self.part("timing_calls", mark)
      if chosen:  # the draw, told after the batch: the candidate's process keeps those outputs
        self.ask({"op": "keep", "calls": chosen})
        self.kept_calls += [start + k for k in chosen]
        self.kept_outputs += kept
        mark = self.part("timing_keep", mark)
        if plan.each_batch:
          self.check_timed_outputs()
          self.ask({"op": "drop"})  # both sides now hold only the next batch's copies
          mark = self.part("timing_verify_batch", mark)
    ref, cand = timing.stats(samples[True]["ref"]), timing.stats(samples[True]["cand"])
    ref_w, cand_w = timing.stats(samples[False]["ref"]), timing.stats(samples[False]["cand"])
    self.result["timing"] = {
        "reference": ref, "candidate": cand,
        "speedup": ref["median_us"] / max(cand["median_us"], 1e-9),
        "reference_warm": ref_w, "candidate_warm": cand_w,
        "speedup_warm": ref_w["median_us"] / max(cand_w["median_us"], 1e-9)}


def setup(device_name: str, fraction: float) -> dict[str, str]:
  """The judge's trusted setup, before its job (worker/pair.py): one CPU thread, and on a GPU its
  CUDA context and memory cap. Returns the Verdict environment fields (GPU name and arch)."""
  device = torch.device(device_name)
  torch.set_num_threads(1)
  if device.type != "cuda":
    return {}
  torch.cuda.init()
  torch.zeros(1, device=device)
  if 0.0 < fraction < 1.0:
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
  props = torch.cuda.get_device_properties(device)
  return {"gpu_name": props.name, "gpu_arch": f"sm_{props.major}{props.minor}"}


def _finish(chan: wire.Channel, largest: int) -> bool:
  """Lets the candidate's side make its final checks, report and exit, skipping an answer still
  in flight (a trial the judge stopped waiting for, at most `largest` bytes); True once it
  answered (the two sides ended in step)."""
  try:
    chan.send({"op": "finish"})
    for _ in range(3):
      reply, _ = chan.recv(largest)
      if reply.get("op") == "finish":
        return True
  except (wire.ProtocolError, OSError):
    pass
  return False


def _healthy(device: torch.device) -> bool:
  """The judge's device still completes its work (a CUDA error would surface here)."""
  try:
    if device.type == "cuda":
      torch.cuda.synchronize(device)
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def run(envelope: envelope_lib.Envelope, chan: wire.Channel,
        emit: Callable[[dict[str, Any]], None], lock_down: Callable[[], dict[str, str]],
        set_up: dict[str, Any]) -> envelope_lib.JudgeReport:
  """The trusted side of one job; returns the judge's report for the worker. `set_up` is what
  `setup` returned before the job ({"environment": ...}), or why it failed ({"error": ...})."""
  judge = Judge(envelope, chan, emit)
  before = Globals(judge.device)
  result = judge.result
  in_step = False  # the run ended with the candidate's side answering `finish`
  # When the run began and when the job was read (after the set-up, worker/job_process.py), by
  # the worker's clock too: the worker reads this line only once it serves the pair.
  emit({"phase": enums.STAGE_LOAD, "at": time.monotonic(),
        "job_read_at": set_up.get("job_read_at")})
  try:
    if "error" in set_up:
      raise Ended(enums.INFRA_ERROR, f"judge setup failed: {set_up['error']}")
    try:
      result["environment"] = dict(set_up["environment"])
      mark = time.monotonic()
      gpu_lock = _gpu_lock(judge.device)
      lock_down()
      mark = judge.part("lock_down", mark)
    except Exception as e:  # pylint: disable=broad-except
      raise Ended(enums.INFRA_ERROR, f"judge setup failed: {type(e).__name__}: {e}") from e
    judge.load_reference()
    mark = judge.part("load_reference", mark)
    judge.budget(budget_lib.first(judge.opts, judge.reference_s, judge.trial_bytes))
    judge.ask({"op": "load"})
    mark = judge.part("load_candidate", mark)
    judge.correctness()
    mark = judge.part("correctness", mark)
    judge.probes()
    judge.part("probes", mark)
    if not judge.opts.skip_timing:
      core = timing.timing_core(judge.device) if envelope.share.timing_core else None
      mark = time.monotonic()
      judge.budget(budget_lib.lock_wait(judge.opts))
      with gpu_lock.held() as state, timing.on_core(core) as where:
        judge.part("timing_lock_wait", mark)
        judge.budget(budget_lib.timed(judge.opts, judge.reference_s, judge.pace_s,
                                      wire.payload_bytes(judge.spec), VERIFIED_CALLS))
        result["environment"]["timing_lock"] = f"{state}; {where}"
        judge.time_both(core, gpu_lock.warmup_s())
      emit({"phase": job_lib.PHASE_TIMED})  # the worker's next pair may make its CUDA context now
      mark = time.monotonic()
      judge.check_timed_outputs()
      judge.part("timing_verify", mark)
    mark = time.monotonic()
    judge.profile()
    judge.part("profile", mark)
    judge.ask({"op": "finish"})
    result["outcome"], in_step = enums.OK, True
  except Ended as e:
    result.update(outcome=e.outcome, message=e.message, candidate_ended=e.candidate)
    if e.in_step:
      in_step = _finish(chan, 2 * wire.payload_bytes(judge.spec) + judge.input_bytes)
  stage = result["stage"]
  judge.enter(enums.STAGE_DONE)  # closes the stage that was running
  result["stage"] = enums.STAGE_DONE if result["outcome"] == enums.OK else stage
  result["timing_parts"] = judge.parts
  memory = None
  with contextlib.suppress(Exception):  # no CUDA (judge setup failed): nothing to weigh
    memory = dataclasses.asdict(judge.memory())
  reusable = (in_step and result["outcome"] not in (enums.INFRA_ERROR, enums.BAD_REFERENCE)
              and _healthy(judge.device))
  changed = before.changed() if reusable else []
  if changed:  # in the judge's log: why the worker replaces it
    print(f"judge: not kept for another job: changed {', '.join(changed)[:2000]}",
          file=sys.stderr)
  # Checked here as the worker will check it: a field this run left out takes its default.
  return envelope_lib.JudgeReport.from_json(
      {**envelope_lib.JudgeReport(stage=result["stage"], outcome=None).to_json(), **result,
       "memory": memory, "cpu_s": time.process_time(), "reusable": reusable and not changed})
