"""GPU verification end to end (device machine only): DICE's 99 infilling candidates, wrong
kernels, launch checks and CUDA errors, through the scheduler and real GPU worker processes.

Set DICE_REPORT_DIR to keep a per-item JSON report (`dice_infilling_report.json`), and
DICE_INFILLING_JSON to read the DICE file from elsewhere than ../shared (the device machine). The DICE
check also re-runs the INCORRECT candidates at DICE's own tolerance (1e-2) and reports how many
then pass, since the data's README notes that tolerance decides several of them.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import os
import pathlib

import pytest

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service.compile import checks

import verifier_harness
import verifier_kernels as kernels
import verifier_wrong_kernels as wrong

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu(cache_dir, toolchain):
  slots = int(os.environ.get("DICE_VERIFIER_SLOTS_PER_GPU", "2"))
  config = verifier_harness.make_config(
      cache_dir, slots_per_gpu=slots, compile_workers=os.cpu_count() or 2, run_timeout_s=300.0,
      timing_trials=50, queue_capacity=1024)
  srv = verifier_harness.ServerThread(config, toolchain, grpc_server=False)
  # Compile every candidate this module uses at once (the pool runs them in parallel).
  candidates = [kernels.cuda_candidate(), wrong.RUNTIME_DECOY, wrong.ILLEGAL_ADDRESS] + [
      c for _, c in wrong.WRONG.values()]
  extensions = [e for c in candidates for e in checks.check_candidate(c).extensions]

  async def build_all():
    return await asyncio.gather(*(srv.scheduler.compiler.build(e, 900) for e in extensions))

  srv.call(build_all())
  yield srv
  srv.stop()


def _request(request_id: str, reference: str, candidate: str, **options) -> pb.VerifyRequest:
  return pb.VerifyRequest(request_id=request_id, reference_source=reference,
                          candidate_source=candidate, options=pb.VerifyOptions(**options))


def _verify_all(gpu, requests: list[pb.VerifyRequest]) -> list[pb.Verdict]:
  with concurrent.futures.ThreadPoolExecutor(min(64, len(requests))) as pool:
    return list(pool.map(gpu.verify, requests))


def test_good_kernel_is_ok_launched_and_timed(gpu):
  verdict = gpu.verify(_request("gpu-good", kernels.REFERENCE, kernels.cuda_candidate()))
  assert verdict.outcome == pb.OK, verdict.message
  assert list(verdict.launched_kernels) == ["scaled_add_kernel"]
  assert verdict.environment.gpu_name
  assert verdict.timing.candidate.num_trials == verdict.timing.candidate_warm.num_trials == 50
  assert 0.05 < verdict.timing.speedup < 50 and 0.05 < verdict.timing.speedup_warm < 50
  # Warm L2 is never slower than cold for the same calls (within noise).
  assert verdict.timing.reference_warm.median_us < 1.2 * verdict.timing.reference.median_us
  assert all(t.passed and t.max_abs_error < 1e-5 for t in verdict.trials)
  assert 0.5 < verdict.custom_kernel_time_fraction <= 1.0
  assert verdict.policy == pb.POLICY_DEFAULT


def test_wrong_kernels_are_incorrect(gpu):
  names = sorted(wrong.WRONG)
  verdicts = _verify_all(gpu, [_request(f"gpu-wrong-{n}", *wrong.WRONG[n], skip_timing=True)
                               for n in names])
  outcomes = {n: (pb.Outcome.Name(v.outcome), v.message[:300]) for n, v in zip(names, verdicts)}
  print("\nwrong kernels:", outcomes)
  assert all(v.outcome == pb.INCORRECT for v in verdicts), outcomes


def test_kernel_never_launched_at_run_time_is_rejected(gpu):
  verdict = gpu.verify(_request("gpu-decoy", kernels.REFERENCE, wrong.RUNTIME_DECOY))
  assert verdict.outcome == pb.REJECTED, verdict.message
  assert pb.NO_CUSTOM_KERNEL_LAUNCHED in [e.kind for e in verdict.exploits]
  assert list(verdict.launched_kernels) == []


def test_illegal_address_is_a_runtime_error_and_the_slot_survives(gpu):
  bad = gpu.verify(_request("gpu-illegal", kernels.REFERENCE, wrong.ILLEGAL_ADDRESS))
  assert bad.outcome == pb.RUNTIME_ERROR, bad.message
  good = gpu.verify(_request("gpu-good-after", kernels.REFERENCE, kernels.cuda_candidate()))
  assert good.outcome == pb.OK, good.message


def _row(item: dict, verdict: pb.Verdict, loose: pb.Verdict | None) -> dict:
  compile_s = next((t.duration_s for t in verdict.stage_timings if t.stage == pb.STAGE_COMPILE), 0)
  return {
      "id": item["id"], "outcome": pb.Outcome.Name(verdict.outcome),
      "stage": pb.Stage.Name(verdict.stage), "message": verdict.message[:500],
      "max_abs_error": max((t.max_abs_error for t in verdict.trials), default=None),
      "max_rel_error": max((t.max_rel_error for t in verdict.trials), default=None),
      "speedup": verdict.timing.speedup if verdict.HasField("timing") else None,
      "speedup_warm": verdict.timing.speedup_warm if verdict.HasField("timing") else None,
      "reference_us": verdict.timing.reference.median_us if verdict.HasField("timing") else None,
      "custom_kernel_time_fraction": verdict.custom_kernel_time_fraction,
      "launched_kernels": list(verdict.launched_kernels),
      "exploits": [pb.Exploit.Name(e.kind) for e in verdict.exploits],
      "compile_s": compile_s, "total_s": verdict.total_s,
      "outcome_at_1e-2": pb.Outcome.Name(loose.outcome) if loose is not None else None,
  }


@pytest.fixture(scope="module")
def dice_items(request):
  path = os.environ.get("DICE_INFILLING_JSON")
  if path is None:
    path = request.getfixturevalue("shared_dir") / "data/dice/kernel_infilling_evaluation.json"
  return json.loads(pathlib.Path(path).read_text())


def test_dice_infilling_candidates(gpu, dice_items):
  items = dice_items
  verdicts = _verify_all(gpu, [_request(f"dice-{i['id']}", i["pytorch_code"], i["cuda_code"])
                               for i in items])
  incorrect = [(i, v) for i, v in zip(items, verdicts) if v.outcome == pb.INCORRECT]
  loose = dict(zip([i["id"] for i, _ in incorrect], _verify_all(gpu, [
      _request(f"dice-{i['id']}-1e-2", i["pytorch_code"], i["cuda_code"], atol=1e-2, rtol=1e-2,
               skip_timing=True) for i, _ in incorrect]))) if incorrect else {}
  rows = [_row(i, v, loose.get(i["id"])) for i, v in zip(items, verdicts)]
  counts = collections.Counter(r["outcome"] for r in rows)
  summary = {"counts": dict(counts), "passing_at_1e-2": sum(
      v.outcome == pb.OK for v in loose.values()), "items": rows,
      "split": gpu.scheduler.compiler.split_stats()}  # DICE_VERIFIER_COMPILE_SPLIT=1
  report_dir = os.environ.get("DICE_REPORT_DIR")
  if report_dir:
    path = pathlib.Path(report_dir) / "dice_infilling_report.json"
    path.write_text(json.dumps(summary, indent=1))
  print("\nDICE infilling outcomes:", dict(counts), "| INCORRECT passing at 1e-2:",
        summary["passing_at_1e-2"], "| split path:", summary["split"] or "off")
  for r in rows:
    if r["outcome"] != "OK":
      print(f"  {r['id']}: {r['outcome']} [{r['stage']}] {r['message'][:200]}")
  # The runtime exploit checks (issue 3) judge DICE's own candidates too: list what they flag, so
  # one run shows whether a known-good candidate is a false positive.
  flagged = [r for r in rows if r["exploits"]]
  print(f"\nDICE candidates with exploit findings: {len(flagged)}")
  for r in flagged:
    print(f"  {r['id']}: {r['outcome']} {r['exploits']} {r['message'][:160]}")
  assert len(rows) == 99
  assert counts["INFRA_ERROR"] == 0 and counts["BAD_REFERENCE"] == 0
  assert sorted(r["id"] for r in rows if r["outcome"] == "REJECTED" and
                r["stage"] == "STAGE_STATIC_CHECK") == [2193, 6936]
  assert all(r["exploits"] for r in rows if r["outcome"] == "REJECTED")
  assert counts["OK"] >= 50


def test_a_problem_with_4_gib_outputs_is_ok_whatever_the_secret_draw(gpu, dice_items):
  """DICE 3497's outputs take 4 GiB a call: kept to the end of timing, the outputs drawn for the
  secret check (judge.timing_bytes) ran out of the candidate process's share (H200 at 2 slots,
  2026-12-04; an H100 even alone, 2026-12-05: RUNTIME_ERROR charged to a known-good kernel). That
  memory is the verifier's: such outputs are now checked after their batch (judge.TimingPlan), so
  each draw (two seeds) must end OK. Before that change every seed ran out at 2 slots first and
  took 85-94 s alone, and this test 312 s."""
  item = next((i for i in dice_items if i["id"] == 3497), None)
  if item is None:
    pytest.skip("DICE item 3497 is not in this DICE file")
  verdicts = _verify_all(gpu, [_request(f"dice-3497-seed{seed}", item["pytorch_code"],
                                        item["cuda_code"], seed=seed) for seed in (1, 2)])
  print("\nDICE 3497 per seed:", [(pb.Outcome.Name(v.outcome), v.message[:200]) for v in verdicts])
  assert all(v.outcome == pb.OK for v in verdicts), [v.message[:300] for v in verdicts]
