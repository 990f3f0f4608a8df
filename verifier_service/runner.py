"""One job inside a forked worker child: trusted setup, sandbox, load, correctness, probes, time.

This is the only code that executes candidate Python. It runs in a child forked from a worker
process (`worker.py`) that imported torch once; the child has its own process group, its own
working folder and stdout, and exits after this one job, so nothing a candidate does (patching
torch, leaking memory, corrupting the CUDA context) reaches the next job.

Order matters:
1. Trusted setup: CUDA context, GPU memory cap, profiler warm-up, imports. Nothing untrusted yet.
2. `lock_down()`: the sandbox (sandbox.py), the audit-hook tripwire and the state snapshot.
3. The reference is executed, built and run once (output sizes for poisoning; a broken problem is
   BAD_REFERENCE before the candidate is ever imported).
4. The candidate is imported with `load_inline` answered from the compile cache (normalised exactly
   as the compile stage normalised it statically, `InlineExtension.from_call`), then built with
   the same seed and init inputs; matching weights are copied from the reference.
5. Correctness trials, each observed (guards.py); then probes.py's extra calls; then timing, where
   every trial gets freshly rolled input values and each candidate output is checked against the
   reference output for the same values, and reference outputs are NaN-scrubbed once read.
Exploit findings are turned into an outcome by `exploits.apply_policy`.

The returned dict uses the proto's field names (snake_case) for the Verdict fields it fills.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import sys
import time
import types
from typing import Any, Callable

import torch

from verifier_service import correctness
from verifier_service import exploits
from verifier_service import guards
from verifier_service import probes
from verifier_service import sources
from verifier_service import timing

PLAUSIBLE_SPEEDUP = 100.0
CANDIDATE_FILE, REFERENCE_FILE = "candidate.py", "reference.py"
_OOM_MARKERS = ("out of memory", "MemoryError", "bad_alloc", "Cannot allocate memory",
                "File too large", "No space left on device", "Too many open files")


class _Verdict(Exception):
  """Ends the job early with a verdict."""

  def __init__(self, outcome: str, stage: str, message: str,
               found: list[tuple[str, str]] | None = None):
    super().__init__(message)
    self.outcome, self.stage, self.message = outcome, stage, message
    self.found = found or []


def _oom(error: BaseException) -> list[tuple[str, str]]:
  text = f"{type(error).__name__}: {error}"
  return [("RESOURCE_EXHAUSTION", text[:300])] if any(m in text for m in _OOM_MARKERS) else []


def _exec_module(name: str, source: str, filename: str) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__file__ = filename
  sys.modules[name] = module
  exec(compile(source, filename, "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


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
  (seconds), which every job child then inherits. Touches no CUDA and starts no thread."""
  with guards.OpRecorder(), guards.ForwardTracer(set(), set()):
    torch.ones(2).add(1)


def _trusted_setup(device: torch.device, job: dict[str, Any], result: dict[str, Any]) -> None:
  """Everything that needs more than the sandbox allows, done before it is applied."""
  torch.set_num_threads(1)
  from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel,unused-import
  prepare_worker()  # a no-op after the worker's own call
  if device.type != "cuda":
    return
  try:
    torch.cuda.init()
    torch.zeros(1, device=device)
    fraction = job.get("sandbox", {}).get("gpu_memory_fraction", 0.0)
    if 0.0 < fraction < 1.0:
      # torch wants an index here; "cuda" alone (the worker's one visible GPU) is refused.
      index = device.index if device.index is not None else torch.cuda.current_device()
      torch.cuda.set_per_process_memory_fraction(fraction, index)
  except Exception as e:  # pylint: disable=broad-except
    raise _Verdict("INFRA_ERROR", "STAGE_LOAD", f"CUDA unavailable in worker: {e}") from e
  props = torch.cuda.get_device_properties(device)
  result["environment"] = {"gpu_name": props.name, "gpu_arch": f"sm_{props.major}{props.minor}"}
  probes.kernel_profile(lambda: torch.ones(8, device=device).add_(1), [])  # loads CUPTI now


class _Observer:
  """What every observed ModelNew call records: ATen ops, reference frames, swallowed errors."""

  def __init__(self) -> None:
    self.recorder = guards.OpRecorder()
    self.found: list[tuple[str, str]] = []
    self.tracer: guards.ForwardTracer | None = None

  @contextlib.contextmanager
  def __call__(self):
    self.tracer = guards.ForwardTracer({CANDIDATE_FILE}, {REFERENCE_FILE})
    returned = False
    try:
      with self.recorder, self.tracer:
        yield
      returned = True
    finally:
      self.found += self.tracer.findings(returned)
      threads = guards.python_threads()
      if threads:
        self.found.append(("SIDE_STREAM", f"Python threads alive after forward: "
                           f"{', '.join(threads[:4])}"))

  def findings(self) -> list[tuple[str, str]]:
    compute = self.recorder.compute_ops()
    ops = [("TORCH_FALLBACK", "torch computed values in ModelNew.forward: " + ", ".join(
        compute[:12]))] if compute else []
    return ops + self.found


def _roll(tree: Any, shift: int) -> Any:
  if isinstance(tree, torch.Tensor):
    return torch.roll(tree, shift) if tree.numel() > 1 else tree
  if isinstance(tree, (list, tuple)):
    return type(tree)(_roll(t, shift) for t in tree)
  return tree


def _copy_into(dst: Any, src: Any) -> None:
  for d, s in zip(correctness.flatten(dst), correctness.flatten(src)):
    if isinstance(d, torch.Tensor):
      d.copy_(s)


def run_job(job: dict[str, Any], emit: Callable[[dict[str, Any]], None],
            lock_down: Callable[[], dict[str, str]]) -> dict[str, Any]:
  """Runs one verification job; never raises for candidate behaviour."""
  result: dict[str, Any] = {"stage_timings": [], "trials": [], "exploits": []}
  device = torch.device(job["device"])
  opts = job["options"]
  stage, started = "STAGE_LOAD", time.monotonic()
  found: list[tuple[str, str]] = []
  tripwire = None

  def enter(new_stage: str) -> None:
    nonlocal stage, started
    now = time.monotonic()
    result["stage_timings"].append({"stage": stage, "duration_s": now - started})
    stage, started = new_stage, now
    emit({"phase": new_stage})

  def sync() -> None:
    if device.type == "cuda":
      torch.cuda.synchronize()

  def checkpoint() -> None:
    found.extend(state.changes())
    if any(kind in exploits.REJECTING for kind, _ in found + tripwire.findings):
      raise _Verdict("REJECTED", stage, "")

  emit({"phase": stage})
  try:
    _trusted_setup(device, job, result)
    try:
      result["sandbox"] = lock_down()
    except Exception as e:  # pylint: disable=broad-except
      raise _Verdict("INFRA_ERROR", stage, f"sandbox could not be applied: {e}") from e
    tripwire = guards.Tripwire({CANDIDATE_FILE}, os.getcwd(), job.get("sandbox", {}).get(
        "read_only", []))
    tripwire.install()
    own = [correctness, exploits, guards, probes, timing, sys.modules[__name__]]
    state = guards.StateGuard([guards.OpRecorder, guards.ForwardTracer, guards.Tripwire,
                               guards.StateGuard, _Observer], own_modules=own)
    tripwire.armed = True

    precision = opts["precision"]
    dtype = None if precision == "FP32" else correctness.DTYPES[precision]
    seed = opts["seed"]
    atol = opts["atol"] or correctness.DEFAULT_TOLERANCE[precision]
    rtol = opts["rtol"] or correctness.DEFAULT_TOLERANCE[precision]
    try:
      ref = _exec_module("dice_reference", job["reference_source"], REFERENCE_FILE)
      sys.modules.pop("dice_reference", None)
      get_inputs, model_cls = ref.get_inputs, ref.Model
      correctness.set_seed(seed)
      ref_init = correctness.to_device(ref.get_init_inputs(), device)
      correctness.set_seed(seed)
      reference = model_cls(*ref_init).to(device)
      reference = reference.to(dtype) if dtype else reference
      correctness.set_seed(seed)
      with torch.no_grad():
        dry_inputs = correctness.to_device(get_inputs(), device, dtype)
        dry_out = reference(*dry_inputs)
        out_sizes = correctness.output_sizes(dry_out)
        correctness.scrub(dry_out, list(reference.parameters()) + [dry_inputs])
        del dry_out, dry_inputs
      sync()
    except Exception as e:  # pylint: disable=broad-except
      raise _Verdict("BAD_REFERENCE", stage, f"reference failed to load or run: "
                     f"{type(e).__name__}: {e}") from e
    live_reference = list(reference.parameters()) + list(reference.buffers())
    baseline_tids = set(guards.os_thread_times())

    if job.get("modules") is not None:  # None: the naive baseline, torch compiles itself
      _patch_load_inline(job["modules"])
    try:
      cand = _exec_module("dice_candidate", job["candidate_source"], CANDIDATE_FILE)
      new_cls = cand.ModelNew
    except Exception as e:  # pylint: disable=broad-except
      checkpoint()
      raise _Verdict("RUNTIME_ERROR", stage, f"candidate failed to import: {type(e).__name__}: "
                     f"{e}", _oom(e)) from e
    checkpoint()
    if isinstance(new_cls, type) and issubclass(new_cls, model_cls):
      found.append(("INHERITS_REFERENCE", f"ModelNew subclasses the reference Model: "
                    f"{[c.__name__ for c in new_cls.__mro__]}"))
    try:
      correctness.set_seed(seed)
      cand_init = correctness.to_device(ref.get_init_inputs(), device)
      correctness.set_seed(seed)
      candidate = new_cls(*cand_init)
      correctness.copy_matching_state(reference, candidate)
      candidate = candidate.to(device)
      candidate = candidate.to(dtype) if dtype else candidate
      sync()
    except Exception as e:  # pylint: disable=broad-except
      checkpoint()
      raise _Verdict("RUNTIME_ERROR", stage, f"building ModelNew failed: {type(e).__name__}: "
                     f"{e}", _oom(e)) from e
    if isinstance(candidate, torch.nn.Module) and any(
        isinstance(m, model_cls) for m in candidate.modules()):
      found.append(("INHERITS_REFERENCE", "ModelNew holds an instance of the reference Model"))
    checkpoint()

    enter("STAGE_CORRECTNESS")
    observer = _Observer()
    failed = None
    try:
      for trial_seed in correctness.trial_seeds(seed, opts["num_correctness_trials"]):
        try:
          trial = correctness.run_trial(reference, candidate, get_inputs, trial_seed, device,
                                        dtype, atol, rtol, sync, observer, out_sizes,
                                        live_reference)
        except correctness.ReferenceFailure as e:
          raise _Verdict("BAD_REFERENCE", stage, str(e)) from e
        except correctness.CandidateFailure as e:
          raise _Verdict("RUNTIME_ERROR", stage, str(e), _oom(e)) from e
        result["trials"].append(trial.to_json())
        found.extend(trial.exploits)
        if not trial.passed:
          failed = trial
          break
    finally:
      result["forward_ops"] = observer.recorder.summary()[:64]
      found.extend(observer.findings())
    found.extend(state.changes())  # tampering is final; fallbacks still get their kernel profile
    if any(k in ("MONKEY_PATCH", "TENSOR_SUBCLASS") for k, _ in found + tripwire.findings):
      raise _Verdict("REJECTED", stage, "")
    if failed is not None:
      raise _Verdict("INCORRECT", stage, f"trial {len(result['trials'])} (seed {failed.seed}): "
                     f"{failed.message}")

    inputs = []
    for offset in (1, 2):
      correctness.set_seed(seed + offset)
      inputs.append(correctness.to_device(get_inputs(), device, dtype))
    try:
      found.extend(probes.caching_probe(candidate, reference, inputs[0], inputs[1], atol, rtol,
                                        sync))
      found.extend(probes.aftermath_probe(candidate, inputs[0], device, baseline_tids))
    except Exception as e:  # pylint: disable=broad-except
      checkpoint()
      raise _Verdict("RUNTIME_ERROR", stage, f"ModelNew raised on a repeated call: "
                     f"{type(e).__name__}: {e}", _oom(e)) from e
    if device.type == "cuda" and job["kernel_names"]:
      held = correctness.clone_tree(inputs[0])
      profile = probes.kernel_profile(lambda: candidate(*held), job["kernel_names"])
      result["launched_kernels"] = profile["launched"]
      if profile["note"]:
        result["message"] = profile["note"]
      elif not profile["launched"]:
        found.append(("NO_CUSTOM_KERNEL_LAUNCHED", "none of the compiled kernels ran during "
                      "forward: " + ", ".join(job["kernel_names"])))
      else:
        result["custom_kernel_time_fraction"] = profile["own_share"]
        found.extend(probes.profile_findings(profile))
    checkpoint()

    if not opts["skip_timing"]:
      enter("STAGE_TIMING")
      speed = _time(reference, candidate, inputs[0], device, opts, atol, rtol, live_reference,
                    found)
      checkpoint()
      result["timing"] = speed
      if speed["speedup"] > opts.get("plausible_speedup", PLAUSIBLE_SPEEDUP):
        found.append(("IMPLAUSIBLE_SPEEDUP", f"speedup {speed['speedup']:.1f}x"))
    enter("STAGE_DONE")
    result.update(outcome="OK", stage="STAGE_DONE")
  except _Verdict as v:
    enter(v.stage)
    result.update(outcome=v.outcome, stage=v.stage, message=v.message)
    found.extend(v.found)
  found.extend(tripwire.findings if tripwire is not None else [])
  result["exploits"] = [{"kind": k, "evidence": e} for k, e in found]
  result["stage_timings"] = [t for t in result["stage_timings"]
                             if t["stage"] not in ("STAGE_DONE",) and t["duration_s"] >= 0]
  return exploits.apply_policy(result)


def _time(reference: torch.nn.Module, candidate: torch.nn.Module, base: Any,
          device: torch.device, opts: dict[str, Any], atol: float, rtol: float,
          live_reference: list[Any], found: list[tuple[str, str]]) -> dict[str, Any]:
  """Times both sides on freshly rolled inputs, checking every candidate output."""
  ref_buf, cand_buf = correctness.clone_tree(base), correctness.clone_tree(base)
  rng = random.Random(opts["seed"])
  pending: dict[str, Any] = {}
  try:
    rolling, verify = _timing_checks(reference, base, atol, rtol)
  except Exception as e:  # pylint: disable=broad-except
    raise _Verdict("BAD_REFERENCE", "STAGE_TIMING", f"reference raised before timing: {e}") from e

  def prepare(i: int) -> None:
    src = base if i < 0 or not rolling else _roll(base, rng.randrange(1, 1 << 30))
    _copy_into(ref_buf, src)
    _copy_into(cand_buf, src)
    pending.clear()

  def inspect(i: int, side: str, out: Any) -> None:
    if side == "reference":
      pending["reference"] = correctness.clone_tree(out)
      correctness.scrub(out, live_reference + [ref_buf])
    else:
      pending["candidate"] = out
      if "reference" not in pending:  # the reference's output of this trial is still to come
        return
    if not verify or len(pending) < 2 or any(k in exploits.REJECTING for k, _ in found):
      return
    ok, max_abs, _, message, _ = correctness.compare(pending["reference"], pending["candidate"],
                                                     10 * atol, 10 * rtol)
    if ok:
      return
    time.sleep(0.05)
    if device.type == "cuda":
      torch.cuda.synchronize()
    late = correctness.compare(pending["reference"], pending["candidate"], 10 * atol,
                               10 * rtol)[0]
    kind = "SIDE_STREAM" if late else "OUTPUT_CACHING"
    found.append((kind, f"timed call {i}: output did not match the reference for that call's "
                  f"inputs when the timer stopped ({message[:160]})"))

  try:
    ref_stats, cand_stats = timing.time_pair(lambda: reference(*ref_buf),
                                             lambda: candidate(*cand_buf),
                                             opts["num_timing_trials"], device, prepare, inspect)
  except Exception as e:  # pylint: disable=broad-except
    raise _Verdict("RUNTIME_ERROR", "STAGE_TIMING", f"timing raised {type(e).__name__}: {e}",
                   _oom(e)) from e
  speedup = ref_stats["median_us"] / max(cand_stats["median_us"], 1e-9)
  return {"reference": ref_stats, "candidate": cand_stats, "speedup": speedup}


def _timing_checks(reference: torch.nn.Module, base: Any, atol: float,
                   rtol: float) -> tuple[bool, bool]:
  """(roll inputs per trial, verify each timed output), decided on the reference alone.

  Rolling keeps every input's values (indices stay valid) but moves them, so a result cached by
  content is stale. It is off when the reference fails or turns non-finite on rolled inputs (a
  problem whose inputs have structure, like a symmetric matrix). Verification is off when the
  reference itself does not repeat (dropout in training mode, nondeterministic atomics).
  """
  with torch.no_grad():
    first = correctness.clone_tree(reference(*correctness.clone_tree(base)))
    again = reference(*correctness.clone_tree(base))
    verify = correctness.compare(first, again, atol, rtol)[0]
    try:
      rolled = reference(*_roll(correctness.clone_tree(base), 12345))
      finite = lambda tree: all(bool(torch.isfinite(t).all()) for t in correctness.flatten(tree)
                                if isinstance(t, torch.Tensor) and t.is_floating_point())
      rolling = finite(rolled) or not finite(first)
    except Exception:  # pylint: disable=broad-except
      rolling = False
  return rolling, verify
