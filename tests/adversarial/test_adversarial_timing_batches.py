"""A cheat that starts only after the timing stage's first per-batch check and `drop` is caught.

On a problem whose drawn timed outputs do not fit KEPT_BYTES (`judge.plan_timing`: `each_batch`),
the judge reads back and compares a batch's drawn outputs right after that batch and then sends
`{"op": "drop"}`: both processes forget them, and the candidate's process holds only the next
batch's copies. That per-batch check is the only one those calls ever get (the check after timing
finds nothing kept). test_verifier_worker.py's per-batch test cheats on every timed call, so the
FIRST batch's check catches it: a judge that checked only until its first `drop`, skipped the
check of later batches, dropped a batch's kept calls before reading them back, or compared later
batches against the wrong calls would still pass it. This file closes that gap.

The candidates see a batch boundary as any real one could: timed calls reuse the same input
tensors refilled with new (rolled) values, so counting refills counts timed calls, and the plan
(2 calls a batch here) follows from the problem's public sizes. Nothing in the candidate's process
tells it more (a `drop` only empties the child's kept lists; reaching them takes a gc scan or a
frame walk, which the tripwire names MONKEY_PATCH: guards._INTROSPECTION_EVENTS), so "behaves
differently once it has seen a drop" is exactly "cheats from the second batch on". The cheats are
right on every trial, probe and warm-up call and on the first batch (checked before the first
`drop`); from the first call of the second batch on, one returns the previous call's output
("stale": OUTPUT_CACHING), the other a zeroed buffer that a Python thread fills with the right
answer 0.1 s after forward returned ("late": the CPU analogue of a side stream, work no timer
sees: SIDE_STREAM). Their honest twin runs the very same bookkeeping and never cheats, and must be
OK and checked batch by batch: that fails if a check after a `drop` reads calls out of step with
the judge's expected outputs.

The problem: a broadcast sum of two small inputs, scaled and cast to int32, one (4097, 8192)
output a call: 128 MiB + 32 KiB, the smallest kind of output that switches the plan to per-batch
checks (quota 4 x output > KEPT_BYTES), with inputs of 48 KiB. Integer outputs are compared
exactly (torch.equal: 0.03 s an output against 2 s for float32 of that size on a 2-core VM, and a
job compares 8 or more); what the plan decides depends on bytes alone. The C++ kernel's float
arithmetic is the reference's, to the bit, before the cast. One real server in CPU test mode,
sandboxed as in production, one slot, a 3 GiB memory share per job process; a job holds well under
1 GiB of copies (`judge.timing_bytes`: 4 outputs of one batch in the candidate's process).

Checked against broken judges (2026-12-06, in a copy of the checkout): skipping the check after
every batch, or after every batch but the first, leaves both cheats OK; sending `drop` before the
check ends all three RUNTIME_ERROR; keeping checked batches' expected outputs (out of step) REJECTS
the honest twin. Each made this file fail.
"""

from __future__ import annotations

import time

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from verifier_service.trusted import judge as judge_lib

import verifier_harness
import verifier_kernels as kernels

ROWS, COLS = 4097, 8192
OUTPUT_BYTES = ROWS * COLS * 4  # int32
INPUT_BYTES = (ROWS + COLS) * 4
REFERENCE = f'''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return ((a + b) * self.scale).to(torch.int32)


def get_inputs():
    return [1000 * torch.randn({ROWS}, 1), 1000 * torch.randn(1, {COLS})]


def get_init_inputs():
    return [0.5]
'''
# 2 timing trials: 4 timed calls in 2 batches of 2, and a quota of 4 draws every one of them
# whatever the secret draw: calls 0-1 are checked before the first `drop`, calls 2-3 after it.
TIMING_TRIALS = 2
FIRST_CHEAT = 2  # the first timed call of the second batch

# The family candidate (one compile for the file, shared with the other CPU suites) with a forward
# that broadcasts the inputs to the output's shape (glue), runs its kernel and casts (glue).
_STATE = '''        self.scale = scale
        self.seen = None  # the last call's input tensors, and copies of their values
        self.refills = 0  # calls since then on those tensors, refilled: the timed calls
        self.out = None  # the last output computed
'''
_FORWARD = '''    def forward(self, a, b):
        if self.seen is None or self.seen[0] is not a or self.seen[1] is not b:
            self.refills = 0
        elif not (torch.equal(a, self.seen[2]) and torch.equal(b, self.seen[3])):
            self.refills += 1
        self.seen = (a, b, a.clone(), b.clone())
        shape = (a.shape[0], b.shape[1])
        wide_a, wide_b = a.expand(shape).contiguous(), b.expand(shape).contiguous()
        timed = self.refills - 1  # this call's index among the timed calls, if it is one
        if MODE == "stale" and timed >= FIRST_CHEAT:
            return self.out
        if MODE == "late" and timed >= FIRST_CHEAT:
            out = torch.zeros(shape, dtype=torch.int32)

            def write_late():
                time.sleep(0.1)
                out.copy_(ext.scaled_add(wide_a, wide_b, self.scale).to(torch.int32))

            threading.Thread(target=write_late, daemon=True).start()
            return out
        self.out = ext.scaled_add(wide_a, wide_b, self.scale).to(torch.int32)
        return self.out
'''
MODES = ("honest", "stale", "late")


def candidate(mode: str) -> str:
  """The family candidate in `mode` (one of MODES; see the module docstring)."""
  head, _, _ = kernels.cpp_candidate("scaled_add").partition("    def forward(self, a, b):\n")
  head = head.replace("import torch\n", "import threading\nimport time\n\nimport torch\n", 1)
  head = head.replace("class ModelNew", f"MODE = {mode!r}\nFIRST_CHEAT = {FIRST_CHEAT}\n\n\n"
                      "class ModelNew", 1).replace("        self.scale = scale\n", _STATE, 1)
  return head + _FORWARD


def test_the_problem_is_timed_in_batches_of_two_each_checked_after_its_batch():
  """The premise, from the judge's own plan: were KEPT_BYTES or the quota to change so that this
  problem's drawn outputs were kept to the end, the tests below would no longer test a `drop`."""
  plan = judge_lib.plan_timing(INPUT_BYTES, OUTPUT_BYTES, verify=True)
  assert (plan.batch, plan.quota, plan.each_batch) == (2, 2 * TIMING_TRIALS, True), plan
  assert plan.peak_bytes == judge_lib.timing_bytes(INPUT_BYTES, OUTPUT_BYTES, 2, 0) < 1 << 30
  assert FIRST_CHEAT == plan.batch == TIMING_TRIALS  # 2 batches: the cheat starts the second


@pytest.fixture(scope="module")
def verdicts(cache_dir, toolchain):
  """Every mode's verdict, and how many jobs checked timed outputs batch by batch while it ran
  (the count of the judge's `timing_verify_batch` part, which only the per-batch check records).
  One slot, one job at a time: each job's count is its own."""
  srv = verifier_harness.ServerThread(verifier_harness.make_config(
      cache_dir, cpu_test_mode=True, slots_per_gpu=1, sandbox_strict=True,
      sandbox_memory_bytes=3 << 30, run_timeout_s=300.0), toolchain)
  registry = srv.scheduler.metrics.registry
  checked = lambda: registry.get_sample_value(
      "dice_verifier_worker_seconds_count", {"part": "timing_verify_batch"}) or 0
  results = {}
  try:
    for mode in MODES:
      before = checked()
      verdict = srv.stub().Verify(pb.VerifyRequest(
          request_id=f"batches-{mode}-{time.monotonic_ns()}", reference_source=REFERENCE,
          candidate_source=candidate(mode), options=pb.VerifyOptions(
              num_correctness_trials=1, num_timing_trials=TIMING_TRIALS, run_timeout_s=300)),
          timeout=900)
      results[mode] = (verdict, checked() - before)
      print(f"\n{mode:8} {pb.Outcome.Name(verdict.outcome):10} per-batch checks "
            f"{results[mode][1]:g}  {verdict.message[:100]}")
  finally:
    srv.stop()
  return results


@pytest.mark.slow
def test_the_honest_twin_is_ok_and_was_checked_batch_by_batch(verdicts):
  """The same bookkeeping without the cheat: OK, timed, every drawn call compared after its batch
  (the second batch's after the first `drop`) and found right. Fails if a check after a `drop`
  compares calls out of step with the judge's expected outputs, or if the per-batch mode itself
  stopped running (then the cheats' verdicts below would not be about a `drop` at all)."""
  verdict, checked = verdicts["honest"]
  assert verdict.outcome == pb.OK, (verdict.message, list(verdict.exploits))
  assert not verdict.exploits
  assert verdict.timing.candidate.num_trials == TIMING_TRIALS and verdict.timing.speedup > 0
  assert checked == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode,kind", [("stale", pb.OUTPUT_CACHING), ("late", pb.SIDE_STREAM)],
                         ids=["stale", "late"])
def test_a_cheat_that_starts_after_the_first_drop_is_caught(verdicts, mode, kind):
  """Right through the first batch's check and `drop`, wrong from the second batch on: REJECTED by
  the check after the second batch. Its evidence names timed call 2 or 3, outputs no other check
  reads: every trial and probe was right, and nothing is kept for the check after timing. The
  kind tells the two apart (SIDE_STREAM: right when read again later, `check_timed_outputs`). Fails
  if the judge skips the check of any batch but the first, or drops a batch's kept calls unread."""
  verdict, checked = verdicts[mode]
  assert verdict.outcome == pb.REJECTED, (pb.Outcome.Name(verdict.outcome), verdict.message)
  assert checked == 1
  assert [e.kind for e in verdict.exploits] == [kind], list(verdict.exploits)
  evidence = verdict.exploits[0].evidence
  assert "did not match the reference" in evidence, evidence
  assert any(f"timed call {n}:" in evidence for n in range(FIRST_CHEAT, 2 * TIMING_TRIALS)), (
      evidence)
