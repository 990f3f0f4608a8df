"""One job inside a forked worker child: load, check correctness, check launches, time.

This is the only code that executes candidate Python. It runs in a child forked from a worker
process (`worker.py`) that imported torch once; the child has its own process group, its own
working folder and stdout, and exits after this one job, so nothing a candidate does (patching
torch, leaking memory, corrupting the CUDA context) reaches the next job.

`torch.utils.cpp_extension.load_inline` is replaced before the candidate is imported: the
candidate's call is normalised exactly as the compile stage normalised it statically
(`InlineExtension.from_call`) and answered with the prebuilt module from the compile cache.

The returned dict uses the proto's field names (snake_case) for the Verdict fields it fills.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
import types
from typing import Any, Callable

import torch

from verifier_service import correctness
from verifier_service import sources
from verifier_service import timing

PLAUSIBLE_SPEEDUP = 100.0

# Functions a candidate could replace to fool the comparison or the timer.
_GUARDED = [
    (torch, "allclose"), (torch, "equal"), (torch, "isnan"), (torch, "isinf"),
    (torch, "manual_seed"), (torch.Tensor, "clone"), (torch.Tensor, "to"),
    (torch.Tensor, "__sub__"), (torch.Tensor, "abs"), (torch.Tensor, "max"),
    (torch.nn.Module, "__call__"), (torch.cuda, "synchronize"), (torch.cuda.Event, "record"),
    (torch.cuda.Event, "elapsed_time"), (time, "perf_counter"),
    (correctness, "compare"), (correctness, "run_trial"), (timing, "time_pair"),
]


class _Verdict(Exception):
  """Ends the job early with a verdict."""

  def __init__(self, outcome: str, stage: str, message: str,
               exploits: list[tuple[str, str]] | None = None):
    super().__init__(message)
    self.outcome, self.stage, self.message = outcome, stage, message
    self.exploits = exploits or []


def _snapshot() -> list[Any]:
  return [getattr(owner, name) for owner, name in _GUARDED]


def _is_torch_wrapper(current: Any, original: Any) -> bool:
  """torch wraps some of its functions itself (torch._dynamo wraps manual_seed on import)."""
  code = getattr(current, "__code__", None)
  torch_dir = os.path.dirname(torch.__file__) + os.sep
  return getattr(current, "__wrapped__", None) is original and code is not None and (
      os.path.realpath(code.co_filename).startswith(os.path.realpath(torch_dir)))


def _check_untouched(before: list[Any], stage: str) -> None:
  for (owner, name), original in zip(_GUARDED, before):
    current = getattr(owner, name)
    if current is not original and not _is_torch_wrapper(current, original):
      where = f"{getattr(owner, '__name__', owner)}.{name}"
      raise _Verdict("REJECTED", stage, f"candidate replaced {where}",
                     [("MONKEY_PATCH", where)])


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


def _launched(model: Callable[[], Any], kernel_names: list[str]) -> tuple[list[str], str]:
  """Names of the candidate's kernels that ran on the GPU during one forward (profiler)."""
  from torch.profiler import ProfilerActivity, profile  # pylint: disable=import-outside-toplevel
  try:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
      with torch.no_grad():
        model()
      torch.cuda.synchronize()
    names = {evt.name for evt in prof.events() if evt.device_type == torch.autograd.DeviceType.CUDA}
  except Exception as e:  # pylint: disable=broad-except
    return [], f"profiler unavailable: {e}"
  found = [k for k in kernel_names if any(re.search(rf"\b{re.escape(k)}\b", n) for n in names)]
  return found, ""


def run_job(job: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
  """Runs one verification job; never raises for candidate behaviour."""
  result: dict[str, Any] = {"stage_timings": [], "trials": [], "exploits": []}
  device = torch.device(job["device"])
  opts = job["options"]
  stage = "STAGE_LOAD"
  started = time.monotonic()

  def enter(new_stage: str) -> None:
    nonlocal stage, started
    now = time.monotonic()
    result["stage_timings"].append({"stage": stage, "duration_s": now - started})
    stage, started = new_stage, now
    emit({"phase": new_stage})

  def sync() -> None:
    if device.type == "cuda":
      torch.cuda.synchronize()

  emit({"phase": stage})
  try:
    if device.type == "cuda":
      try:
        torch.cuda.init()
        torch.zeros(1, device=device)
      except Exception as e:  # pylint: disable=broad-except
        raise _Verdict("INFRA_ERROR", stage, f"CUDA unavailable in worker: {e}") from e
      props = torch.cuda.get_device_properties(device)
      result["environment"] = {"gpu_name": props.name, "gpu_arch": f"sm_{props.major}{props.minor}"}
    try:
      ref = _exec_module("dice_reference", job["reference_source"], "reference.py")
      init_inputs = ref.get_init_inputs
      get_inputs = ref.get_inputs
      model_cls = ref.Model
    except Exception as e:  # pylint: disable=broad-except
      raise _Verdict("BAD_REFERENCE", stage, f"reference failed to import: {type(e).__name__}: "
                     f"{e}") from e
    # Imported here, in the child: importing it calls torch.cuda.is_available(), which must
    # never happen in the worker process that forks (see worker.py).
    from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel
    guarded = _snapshot()
    if job.get("modules") is not None:  # None: the naive baseline, torch compiles itself
      _patch_load_inline(job["modules"])
    patched = (cpp_extension.load_inline, cpp_extension.load)
    try:
      cand = _exec_module("dice_candidate", job["candidate_source"], "candidate.py")
      new_cls = cand.ModelNew
    except Exception as e:  # pylint: disable=broad-except
      raise _Verdict("RUNTIME_ERROR", stage, f"candidate failed to import: {type(e).__name__}: "
                     f"{e}") from e
    _check_untouched(guarded, stage)
    if (cpp_extension.load_inline, cpp_extension.load) != patched:
      raise _Verdict("REJECTED", stage, "candidate replaced load_inline", [("MONKEY_PATCH",
                                                                             "load_inline")])

    precision = opts["precision"]
    dtype = None if precision == "FP32" else correctness.DTYPES[precision]
    seed = opts["seed"]
    try:
      correctness.set_seed(seed)
      ref_init = correctness.to_device(init_inputs(), device)
      correctness.set_seed(seed)
      reference = model_cls(*ref_init).to(device)
      reference = reference.to(dtype) if dtype else reference
    except Exception as e:  # pylint: disable=broad-except
      raise _Verdict("BAD_REFERENCE", stage, f"building Model failed: {type(e).__name__}: "
                     f"{e}") from e
    try:
      correctness.set_seed(seed)
      cand_init = correctness.to_device(init_inputs(), device)
      correctness.set_seed(seed)
      candidate = new_cls(*cand_init)
      correctness.copy_matching_state(reference, candidate)
      candidate = candidate.to(device)
      candidate = candidate.to(dtype) if dtype else candidate
      sync()
    except Exception as e:  # pylint: disable=broad-except
      raise _Verdict("RUNTIME_ERROR", stage, f"building ModelNew failed: {type(e).__name__}: "
                     f"{e}") from e
    _check_untouched(guarded, stage)

    enter("STAGE_CORRECTNESS")
    atol = opts["atol"] or correctness.DEFAULT_TOLERANCE[precision]
    rtol = opts["rtol"] or correctness.DEFAULT_TOLERANCE[precision]
    failed = None
    for trial_seed in correctness.trial_seeds(seed, opts["num_correctness_trials"]):
      try:
        trial = correctness.run_trial(reference, candidate, get_inputs, trial_seed, device, dtype,
                                      atol, rtol, sync)
      except correctness.ReferenceFailure as e:
        raise _Verdict("BAD_REFERENCE", stage, str(e)) from e
      except correctness.CandidateFailure as e:
        exploits = [("RESOURCE_EXHAUSTION", str(e))] if "out of memory" in str(e) else []
        raise _Verdict("RUNTIME_ERROR", stage, str(e), exploits) from e
      result["trials"].append(trial.to_json())
      result["exploits"] += [{"kind": k, "evidence": v} for k, v in trial.exploits]
      if not trial.passed:
        failed = trial
        break
    _check_untouched(guarded, stage)
    if failed is not None:
      raise _Verdict("INCORRECT", stage, f"trial {len(result['trials'])} (seed {failed.seed}): "
                     f"{failed.message}")

    correctness.set_seed(seed)
    inputs = correctness.to_device(get_inputs(), device, dtype)
    ref_inputs, cand_inputs = correctness.clone_tree(inputs), correctness.clone_tree(inputs)
    run_ref = lambda: reference(*ref_inputs)
    run_cand = lambda: candidate(*cand_inputs)
    if device.type == "cuda" and job["kernel_names"]:
      launched, note = _launched(run_cand, job["kernel_names"])
      result["launched_kernels"] = launched
      if not launched and not note:
        raise _Verdict("REJECTED", stage, "none of the candidate's kernels ran during forward",
                       [("NO_CUSTOM_KERNEL_LAUNCHED",
                         "compiled: " + ", ".join(job["kernel_names"]))])
      if note:
        result["message"] = note

    if not opts["skip_timing"]:
      enter("STAGE_TIMING")
      try:
        ref_stats, cand_stats = timing.time_pair(run_ref, run_cand, opts["num_timing_trials"],
                                                 device)
      except Exception as e:  # pylint: disable=broad-except
        raise _Verdict("RUNTIME_ERROR", stage, f"timing raised {type(e).__name__}: {e}") from e
      _check_untouched(guarded, stage)
      speedup = ref_stats["median_us"] / max(cand_stats["median_us"], 1e-9)
      result["timing"] = {"reference": ref_stats, "candidate": cand_stats, "speedup": speedup}
      if speedup > opts.get("plausible_speedup", PLAUSIBLE_SPEEDUP):
        result["exploits"].append({"kind": "IMPLAUSIBLE_SPEEDUP",
                                   "evidence": f"speedup {speedup:.1f}x"})
    enter("STAGE_DONE")
    result.update(outcome="OK", stage="STAGE_DONE")
  except _Verdict as v:
    enter(v.stage)
    result.update(outcome=v.outcome, stage=v.stage, message=v.message)
    result["exploits"] += [{"kind": k, "evidence": e} for k, e in v.exploits]
  result["stage_timings"] = [t for t in result["stage_timings"]
                             if t["stage"] not in ("STAGE_DONE",) and t["duration_s"] >= 0]
  return result
