"""Stage 1: static rejections carry one clear reason; unusable references are not the candidate's
fault."""

from __future__ import annotations

import ast
import gc
import sys
import threading

import pytest

from verifier_service.compile import checks

import verifier_kernels as kernels

_GOOD = kernels.cuda_candidate()


@pytest.mark.parametrize("candidate, outcome, stage, reason", [
    ("def broken(:\n", "REJECTED", "STAGE_PARSE", "not valid Python: line 1"),
    ("import torch\nclass Other: pass\n", "REJECTED", "STAGE_STATIC_CHECK",
     "does not define ModelNew"),
    (_GOOD.replace("class ModelNew(nn.Module)", "class ModelNew(Model)"), "REJECTED",
     "STAGE_STATIC_CHECK", "subclasses the reference Model"),
    ("import torch.nn as nn\nclass ModelNew(nn.Module):\n  def forward(self, x): return x\n",
     "REJECTED", "STAGE_STATIC_CHECK", "never calls load_inline"),
    (_GOOD.replace('cuda_sources=source,', ''), "REJECTED", "STAGE_STATIC_CHECK",
     "no cuda_sources"),
    (_GOOD.replace("__global__", "__device__"), "REJECTED", "STAGE_STATIC_CHECK",
     "define no __global__ kernel"),
    (_GOOD.replace("scaled_add_kernel<<<(n + 255) / 256, 256>>>(",
                   "if (false) (void)sizeof(int); (void)("), "REJECTED", "STAGE_STATIC_CHECK",
     "scaled_add_kernel are never launched"),
    (_GOOD.replace('source = """', 'source = open("k.cu").read() + """'), "REJECTED",
     "STAGE_STATIC_CHECK", "cannot be resolved without running the candidate"),
])
def test_candidate_rejections(candidate, outcome, stage, reason):
  report = checks.check_sources(kernels.REFERENCE, candidate)
  assert (report.outcome, report.stage) == (outcome, stage)
  assert reason in report.message


def test_decoy_kernel_is_reported_as_exploit():
  decoy = _GOOD.replace("scaled_add_kernel<<<(n + 255) / 256, 256>>>(",
                        "(void)(")
  report = checks.check_sources(kernels.REFERENCE, decoy)
  assert [k for k, _ in report.exploits] == ["NO_CUSTOM_KERNEL_LAUNCHED"]


@pytest.mark.parametrize("reference, stage, reason", [
    ("class Model(:\n", "STAGE_PARSE", "reference is not valid Python"),
    (kernels.REFERENCE.replace("def get_inputs", "def make_inputs"), "STAGE_STATIC_CHECK",
     "does not define get_inputs"),
    (kernels.REFERENCE.replace("class Model", "class Net").replace("def get_init_inputs",
                                                                    "def init"),
     "STAGE_STATIC_CHECK", "does not define Model, get_init_inputs"),
])
def test_bad_reference_is_not_the_candidates_fault(reference, stage, reason):
  report = checks.check_sources(reference, _GOOD)
  assert (report.outcome, report.stage) == ("BAD_REFERENCE", stage)
  assert reason in report.message


def test_cpu_only_candidates_pass_only_in_cpu_test_mode():
  cpp = kernels.cpp_candidate("scaled_add")
  assert checks.check_sources(kernels.REFERENCE, cpp).outcome == "REJECTED"
  report = checks.check_sources(kernels.REFERENCE, cpp, allow_cpu_only=True)
  assert report.outcome is None
  assert report.exported_functions == list(kernels.CPP_FUNCTIONS)


_ZEROS = "lambda a, b, alpha=1: torch.zeros_like(a)"


@pytest.mark.parametrize("edit, evidence", [
    (lambda s: s + f"\nlib = torch.library.Library('aten', 'IMPL')\nlib.impl('add.Tensor', {_ZEROS})\n",
     "Library('aten', ...)"),
    (lambda s: s + f"\ntorch.library.impl('aten::add.Tensor', 'CUDA')({_ZEROS})\n", "'aten::add.Tensor'"),
    (lambda s: s + "\ntorch._C._dispatch_library('IMPL', 'aten', 'CUDA', '', 0)\n",
     "private API (_dispatch_library)"),
    (lambda s: s.replace("__global__ void", "TORCH_LIBRARY_IMPL(aten, CUDA, m) {}\n__global__ void"),
     "TORCH_LIBRARY_IMPL(aten, ...)"),
    (lambda s: s.replace("__global__ void", "TORCH_LIBRARY_FRAGMENT(prims, m) {}\n__global__ void"),
     "TORCH_LIBRARY_FRAGMENT(prims, ...)"),
    (lambda s: s.replace("__global__ void", "TORCH_LIBRARY_IMPL(_, CUDA, m) {}\n__global__ void"),
     "TORCH_LIBRARY_IMPL(_, ...)"),  # a backend fallback for every operator
    (lambda s: s.replace("__global__ void", "static auto r = c10::Dispatcher::singleton();\n"
                         "__global__ void"), "Dispatcher::singleton"),
])
def test_registering_kernels_for_torch_ops_is_rejected_statically(edit, evidence):
  report = checks.check_sources(kernels.REFERENCE, edit(_GOOD))
  assert report.outcome == "REJECTED" and report.stage == "STAGE_STATIC_CHECK"
  assert report.exploits and {k for k, _ in report.exploits} == {"DISPATCH_OVERRIDE"}
  assert any(evidence in e for _, e in report.exploits), report.exploits


def test_a_candidates_own_operator_library_is_not_an_override():
  own = _GOOD.replace("__global__ void", 'TORCH_LIBRARY(dice_ops, m) { m.def("f(Tensor x) -> '
                      'Tensor"); }\nTORCH_LIBRARY_IMPL(dice_ops, CUDA, m) {}\n__global__ void')
  assert checks.check_sources(kernels.REFERENCE, own).outcome is None
  python_own = _GOOD + "\nlib = torch.library.Library('dice_ops', 'DEF')\n"
  assert checks.check_sources(kernels.REFERENCE, python_own).outcome is None


def test_python_is_parsed_one_at_a_time_with_the_collector_paused():
  """checks.parse_python (python/cpython#106905): a parse waits for one in progress, no garbage
  collection runs during it, and the collector's state and errors come back unchanged."""
  out = []
  with checks._PARSE_LOCK:  # pylint: disable=protected-access  (a parse is in progress)
    worker = threading.Thread(target=lambda: out.append(checks.parse_python("x = 1")))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and not out
  worker.join(10)
  assert len(out) == 1 and isinstance(out[0], ast.Module)

  # A collection started during a parse when the thread that started it is inside `ast.parse`
  # called by parse_python (or, for the control below, by `unpaused_parse`). Not "while the lock
  # is held": another thread's parse (a server's, left from an earlier test) holds the lock for a
  # moment before it pauses the collector, and a collection this thread starts then is in no parse.
  during = []
  callers = {checks.parse_python.__code__}

  def record(phase: str, info: dict) -> None:
    del info
    if phase == "start":
      frame = sys._getframe(1)  # pylint: disable=protected-access
      while frame is not None and not (frame.f_code is ast.parse.__code__ and frame.f_back
                                       is not None and frame.f_back.f_code in callers):
        frame = frame.f_back
      during.append(frame is not None)

  def unpaused_parse(text: str) -> None:
    with checks._PARSE_LOCK:  # pylint: disable=protected-access
      ast.parse(text)

  callers.add(unpaused_parse.__code__)
  source = "\n".join(f"def f{i}(a, b):\n  return [a * k + b for k in range({i})]"
                     for i in range(400))
  threshold = gc.get_threshold()
  gc.callbacks.append(record)
  gc.set_threshold(1)
  try:
    checks.parse_python(source)
    paused = any(during)
    # The same parse unpaused: collections do start (the test can fail). Up to five tries: none
    # starts in this thread while another thread's collection is in progress (a thread left from
    # an earlier test can be in one when this one takes the interpreter lock).
    unpaused = False
    for _ in range(5):
      seen = len(during)
      unpaused_parse(source)
      unpaused = any(during[seen:])
      if unpaused:
        break
  finally:
    gc.set_threshold(*threshold)
    gc.callbacks.remove(record)
  assert not paused and unpaused, (paused, unpaused, len(during))
  assert gc.isenabled()
  with checks._PARSE_LOCK:  # pylint: disable=protected-access  (no other thread's parse ends
    gc.disable()  # after this and turns the collector back on)
  try:
    checks.parse_python("y = 2")
    assert not gc.isenabled()
  finally:
    gc.enable()
  with pytest.raises(SyntaxError):
    checks.parse_python("def (")
  assert gc.isenabled()
