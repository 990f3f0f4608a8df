"""The run stage at RL speed on a GPU (device machine only): a kernel that never returns ends within
its scaled budget, the next job's processes hold their CUDA contexts before the job comes, the
verdicts are those of a job forked for itself, and the RL-shaped benchmark's mix is what it claims
on a real GPU (each kind of sample ends as it should)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import psutil
import pytest

from dice.verifier.v1 import verifier_pb2 as pb

import verifier_harness
import verifier_kernels as kernels
import verifier_wrong_kernels as wrong

pytestmark = pytest.mark.gpu
ROOT = pathlib.Path(__file__).resolve().parents[2]
_SPIN = kernels.cuda_candidate().replace(
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;",
    "  while (clock64() >= 0) { }\n  int i = blockIdx.x * blockDim.x + threadIdx.x;")


@pytest.fixture(scope="module")
def gpu(cache_dir, toolchain):
  config = verifier_harness.make_config(cache_dir, slots_per_gpu=2, run_timeout_s=120.0,
                                        compile_workers=os.cpu_count() or 2, timing_trials=50)
  srv = verifier_harness.ServerThread(config, toolchain, grpc_server=False)
  yield srv
  srv.stop()


def _request(request_id: str, candidate: str, **options) -> pb.VerifyRequest:
  return pb.VerifyRequest(request_id=request_id, reference_source=kernels.REFERENCE,
                          candidate_source=candidate, options=pb.VerifyOptions(**options))


def test_a_kernel_that_never_returns_ends_within_its_budget(gpu):
  assert "while (clock64() >= 0)" in _SPIN
  verdict = gpu.verify(_request("gpu-spin", _SPIN))
  assert verdict.outcome == pb.TIMEOUT, verdict.message
  assert "exceeded its budget in STAGE_CORRECTNESS" in verdict.message, verdict.message
  before_run = sum(t.duration_s for t in verdict.stage_timings if t.stage in (
      pb.STAGE_STATIC_CHECK, pb.STAGE_COMPILE, pb.STAGE_QUEUE))
  assert verdict.total_s - before_run < 20, verdict  # the ceiling is 120 s
  after = gpu.verify(_request("gpu-after-spin", kernels.cuda_candidate()))
  assert after.outcome == pb.OK, after.message  # the slot took the next job


def _compute_pids() -> set[int]:
  out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                       capture_output=True, text=True, check=True).stdout
  return {int(line) for line in out.split() if line.strip().isdigit()}


def test_the_next_jobs_processes_hold_cuda_contexts_before_the_job(gpu):
  """Between jobs each worker's waiting pair has made its CUDA contexts (worker/pair.py), so a job
  starts on processes already set up; seen from the driver's list of compute processes. Where
  judges are kept (DICE_VERIFIER_JUDGE_JOBS, worker/process.py) a slot holds a candidate's process,
  a reserve judge and, once it ran a job cleanly, the judge it kept."""
  assert gpu.verify(_request("gpu-ahead", kernels.cuda_candidate())).outcome == pb.OK
  time.sleep(3.0)
  per_slot = [[c.pid for c in psutil.Process(slot.info["pid"]).children()
               if c.status() != psutil.STATUS_ZOMBIE] for slot in gpu.scheduler.pool.slots]
  waiting = [pid for pids in per_slot for pid in pids]
  allowed = {2} if gpu.scheduler.config.judge_jobs == 1 else {2, 3}
  assert {len(pids) for pids in per_slot} <= allowed, per_slot
  pids = _compute_pids()
  if not pids:
    pytest.skip("nvidia-smi lists no compute processes here (a container without PID access)")
  assert set(waiting) <= pids, (waiting, pids)


def _outcomes_on_both(first, second, tag: str) -> dict[str, tuple[str, str]]:
  """Each candidate of the pairs tests (a good one, a runtime decoy, an illegal address, the
  wrong kernels) verified on two servers: name -> (first's outcome, second's)."""
  candidates = {"good": kernels.cuda_candidate(), "decoy": wrong.RUNTIME_DECOY,
                "illegal": wrong.ILLEGAL_ADDRESS, **{n: c for n, (_, c) in wrong.WRONG.items()}}
  references = {n: r for n, (r, _) in wrong.WRONG.items()}
  outcomes = {}
  for name, candidate in candidates.items():
    request = pb.VerifyRequest(request_id=f"{tag}-{name}", candidate_source=candidate,
                               reference_source=references.get(name, kernels.REFERENCE),
                               options=pb.VerifyOptions(num_timing_trials=20))
    outcomes[name] = (pb.Outcome.Name(first.verify(request).outcome),
                      pb.Outcome.Name(second.verify(request).outcome))
  return outcomes


def test_verdicts_with_pairs_set_up_ahead_are_those_of_pairs_forked_per_job(gpu, cache_dir,
                                                                            toolchain):
  old = verifier_harness.ServerThread(verifier_harness.make_config(
      cache_dir, slots_per_gpu=2, standby_processes=False, timing_trials=20), toolchain,
      grpc_server=False)
  try:
    outcomes = _outcomes_on_both(gpu, old, "pair")
  finally:
    old.stop()
  assert all(new == before for new, before in outcomes.values()), outcomes


def test_two_pairs_ahead_and_blocking_sync_give_the_same_verdicts(gpu, cache_dir, toolchain):
  """The experimental switches (standby_pairs=2, cuda_blocking_sync): each worker's two waiting
  pairs hold their CUDA contexts between jobs, and every candidate of the pairs test ends as on
  the default server."""
  switched = verifier_harness.ServerThread(verifier_harness.make_config(
      cache_dir, slots_per_gpu=2, standby_pairs=2, cuda_blocking_sync=True, timing_trials=20),
      toolchain, grpc_server=False)
  try:
    outcomes = _outcomes_on_both(switched, gpu, "switched")
    time.sleep(3.0)
    waiting = [c.pid for slot in switched.scheduler.pool.slots
               for c in psutil.Process(slot.info["pid"]).children()
               if c.status() != psutil.STATUS_ZOMBIE]
    pids = _compute_pids()
  finally:
    switched.stop()
  assert all(new == default for new, default in outcomes.values()), outcomes
  assert len(waiting) == 4 * len(switched.scheduler.pool.slots), waiting
  assert not pids or set(waiting) <= pids, (waiting, pids)  # empty: no PID access to the driver


def test_the_rl_burst_mix_ends_as_each_kind_should(tmp_path):
  """verifier_rl_burst.py at small size on the GPU: every correct sample is OK, every wrong one
  INCORRECT, every non-compiling one COMPILE_ERROR, every trap a RUNTIME_ERROR, every spin a
  TIMEOUT; copies as what they copy."""
  out = tmp_path / "burst.json"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "benchmarks" / "verifier_rl_burst.py"), "--synthetic-share", "1",
       "--problems-per-step", "3", "--samples", "6", "--steps", "2", "--slots-per-gpu", "2",
       "--mix", "correct=2,wrong=1,compile_error=1,crash=1,hang=1,duplicate=1,near_duplicate=1",
       "--json", str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads(out.read_text())
  expected = {"correct": "OK", "wrong": "INCORRECT", "compile_error": "COMPILE_ERROR",
              "crash": "RUNTIME_ERROR", "hang": "TIMEOUT"}
  for step in report["steps"]:
    for kind, outcomes in step["outcomes_by_kind"].items():
      if kind in expected:
        assert set(outcomes) == {expected[kind]}, (kind, outcomes, proc.stdout[-2000:])
