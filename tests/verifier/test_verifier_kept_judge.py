"""A judge process kept for a slot's next jobs (`judge_jobs`, worker/process.py), on CPU.

Real servers in CPU test mode (C++-only candidates through the real compile path, real forked and
sandboxed job processes): which judge ran each job is read from the server's own metric
(`dice_verifier_judged_jobs`, counted with each verdict), and the verdicts are compared
with those of judges that serve one job each (judge_jobs=1). The hostile suite runs
through kept judges too (tests/adversarial/test_adversarial_cpu.py).
"""

from __future__ import annotations

import io
import os
import time

import pytest
import torch

from dice.verifier.v1 import verifier_pb2 as pb
from verifier_service import enums
from verifier_service.run import envelope
from verifier_service.service import config as config_lib
from verifier_service.trusted import judge as judge_lib
from verifier_service.worker import job_process
from verifier_service.worker import process as process_lib
from verifier_service.worker import pair as pair_lib

import verifier_harness
import verifier_kernels as kernels


def _server(cache_dir, toolchain, judge_jobs: int) -> verifier_harness.ServerThread:
  return verifier_harness.ServerThread(verifier_harness.make_config(
      cache_dir, cpu_test_mode=True, slots_per_gpu=1, judge_jobs=judge_jobs), toolchain)


def _judged(srv) -> dict[str, float]:
  registry = srv.scheduler.metrics.registry
  return {k: registry.get_sample_value("dice_verifier_judged_jobs_total", {"judge": k}) or 0.0
          for k in ("new", "kept")}


def _run(srv, call: str, reference: str = kernels.REFERENCE, **options) -> pb.Verdict:
  options.setdefault("num_timing_trials", 5)
  return srv.stub().Verify(pb.VerifyRequest(
      request_id=f"kept-{call}-{time.monotonic_ns()}", reference_source=reference,
      candidate_source=kernels.cpp_candidate(call), options=pb.VerifyOptions(**options)),
      timeout=900)


def _summary(verdict: pb.Verdict) -> tuple:
  """What must not depend on which judge ran the job."""
  return (pb.Outcome.Name(verdict.outcome), pb.Stage.Name(verdict.stage), verdict.message,
          [(t.seed, t.passed, t.max_abs_error, t.message) for t in verdict.trials],
          sorted(pb.Exploit.Name(e.kind) for e in verdict.exploits), verdict.HasField("timing"))


def test_a_kept_judge_serves_its_jobs_with_a_fresh_judges_verdicts(cache_dir, toolchain):
  """judge_jobs=3, one slot: the first judge runs three jobs (right, wrong, wrong-layout), then is
  replaced; every verdict equals the one a judge of one job gives (judge_jobs=1)."""
  calls = ["scaled_add", "slightly_off", "wrong_shape", "scaled_add"]
  verdicts = {}
  for judge_jobs in (3, 1):
    srv = _server(cache_dir, toolchain, judge_jobs=judge_jobs)
    try:
      verdicts[judge_jobs] = [_summary(_run(srv, call)) for call in calls]
      if judge_jobs == 3:
        judged = _judged(srv)
    finally:
      srv.stop()
  kept, fresh = verdicts[3], verdicts[1]
  assert [k[0] for k in kept] == ["OK", "INCORRECT", "INCORRECT", "OK"], kept
  assert kept == fresh
  assert judged == {"new": 2, "kept": 2}, judged


def test_a_crash_a_hang_or_a_refused_call_replaces_the_judge(cache_dir, toolchain):
  """After a job whose candidate crashed, hung (killed at its limit) or made a refused call, the
  next job gets a new judge, and its verdict is as ever; a wrong answer keeps it."""
  srv = _server(cache_dir, toolchain, judge_jobs=16)
  try:
    seen = []
    for call, options in [("scaled_add", {}), ("crash", {}), ("scaled_add", {}),
                          ("signal_everyone", {}), ("scaled_add", {}),
                          ("hang", {"run_timeout_s": 10}), ("scaled_add", {}),
                          ("in_place", {}), ("scaled_add", {})]:
      before = _judged(srv)
      verdict = _run(srv, call, **options)
      after = _judged(srv)
      seen.append((call, pb.Outcome.Name(verdict.outcome),
                   "kept" if after["kept"] > before["kept"] else "new"))
  finally:
    srv.stop()
  outcomes = {call: outcome for call, outcome, _ in seen}
  assert outcomes["crash"] == "RUNTIME_ERROR" and outcomes["hang"] == "TIMEOUT", seen
  assert outcomes["in_place"] == "INCORRECT" and outcomes["scaled_add"] == "OK", seen
  assert outcomes["signal_everyone"] in ("OK", "REJECTED"), seen
  assert [s[0] for s in seen if s[1] != outcomes[s[0]]] == [], seen  # every scaled_add OK
  assert [judge for _, _, judge in seen] == ["new", "kept", "new", "kept", "new", "kept", "new",
                                             "kept", "kept"], seen


_PATCHING_REFERENCE = kernels.REFERENCE.replace(
    "return (a + b) * self.scale",
    "torch.nn.functional.relu = lambda x, inplace=False: x\n        return (a + b) * self.scale")
_FLAG_REFERENCE = kernels.REFERENCE.replace(
    "return (a + b) * self.scale",
    "torch.backends.cudnn.benchmark = True\n        return (a + b) * self.scale")


@pytest.mark.parametrize("reference", [_PATCHING_REFERENCE, _FLAG_REFERENCE],
                         ids=["rebinds_a_function", "sets_a_flag"])
def test_a_reference_that_changes_torch_leaves_no_judge_for_the_next_job(cache_dir, toolchain,
                                                                         reference):
  """A reference that rebinds one of torch's functions or sets a torch flag: its job's judge is
  replaced (its log says what changed), and the next job's reference runs in a new one."""
  assert reference != kernels.REFERENCE
  srv = _server(cache_dir, toolchain, judge_jobs=16)
  try:
    assert _run(srv, "scaled_add").outcome == pb.OK
    assert _run(srv, "scaled_add", reference=reference).outcome == pb.OK
    assert _run(srv, "scaled_add").outcome == pb.OK
    judged = _judged(srv)
  finally:
    srv.stop()
  assert judged == {"new": 2, "kept": 1}, judged


def test_judges_are_kept_only_with_standby_processes():
  with pytest.raises(ValueError, match="judge_jobs must be at least 1"):
    config_lib.ServerConfig(judge_jobs=0)
  for standby, keeping in ((True, True), (False, False)):
    spec = config_lib.ServerConfig(judge_jobs=4, standby_processes=standby).sandbox_spec("")
    assert spec["judge_jobs"] == 4
    slot = process_lib._Slot("cpu", spec, io.StringIO())  # pylint: disable=protected-access
    assert slot.keeping is keeping


def test_globals_name_what_changed_and_not_what_torch_adds_lazily(monkeypatch):
  device = torch.device("cpu")
  taken = judge_lib.Globals(device)
  assert taken.changed() == []
  monkeypatch.setattr(torch, "dice_lazy_submodule", object(), raising=False)  # added to a module
  assert taken.changed() == []
  monkeypatch.setattr(torch.nn.functional, "gelu", lambda x: x)
  monkeypatch.setattr(torch.Tensor, "add", lambda *a: None, raising=False)  # shadows TensorBase
  monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
  matmul = torch.backends.cuda.matmul  # a module-like object monkeypatch cannot patch
  tf32, threads = matmul.allow_tf32, torch.get_num_threads()
  matmul.allow_tf32 = not tf32
  torch.set_num_threads(threads + 1)
  try:
    changed = taken.changed()
  finally:
    torch.set_num_threads(threads)
    matmul.allow_tf32 = tf32
  assert "torch.nn.functional.gelu" in changed and "torch.Tensor.add (added)" in changed, changed
  names = [c.split(":")[0] for c in changed]
  assert {"cudnn", "cuda_matmul", "threads"} <= set(names), changed
  assert not any("dice_lazy_submodule" in c for c in changed), changed


NONCE = "0" * 32


def _process(role: str, report, **fields) -> pair_lib.Process:
  process = pair_lib.Process(role, os.getpid(), -1, None, None, NONCE, "")
  process.result = report
  process.jobs = 1
  for key, value in fields.items():
    setattr(process, key, value)
  return process


_KEEP = dict(outcome=enums.INCORRECT, reusable=True, judge={}, candidate={}, cpu_s=10.0)


@pytest.mark.parametrize("change, kept", [
    ({}, True),
    ({"outcome": enums.TIMEOUT}, False),
    ({"outcome": enums.INFRA_ERROR}, False),
    ({"reusable": False}, False),
    ({"judge": {"jobs": 4}}, False),  # served its judge_jobs
    ({"judge": {"killed": True}}, False),
    ({"judge": {"refused": "bad report"}}, False),
    ({"candidate": {"killed": True}}, False),
    ({"candidate": {"result": None}}, False),  # no report of its own
    ({"candidate": {"forged": [{"kind": "MONKEY_PATCH", "evidence": "forged"}]}}, False),
    ({"cpu_s": 31.0}, False),  # 31 + 10 CPU-s is past the 4 x 10 s the judge's limit covers
])
def test_a_judge_is_kept_only_after_a_clean_job(change, kept):
  case = {**_KEEP, **change}
  judge = _process(pair_lib.JUDGE, envelope.JudgeReport(
      stage=enums.STAGE_DONE, outcome=enums.OK, reusable=case["reusable"], cpu_s=case["cpu_s"]),
      **case["judge"])
  candidate = _process(pair_lib.CANDIDATE, envelope.CandidateReport(finished=True),
                       **case["candidate"])
  try:
    pair = pair_lib.Pair(judge, candidate)
    assert pair.judge_reusable(case["outcome"], max_jobs=4, cpu_s=10) is kept
  finally:
    os.close(judge.pidfd)
    os.close(candidate.pidfd)
  assert job_process.judge_cpu_limit(10.5, 4) == 40


def test_a_kept_judges_jobs_report_its_cpu_up_to_each_report(cache_dir, toolchain):
  """A job whose judge is kept reports its candidate's process's CPU (wait4) and the judge's up
  to its report (the judge's own count since its previous report), never the judge's whole
  process, which is reported once, with the job after which it is replaced (judge_jobs=2: every
  second job). A report arrives with the slot's next job, so jobs run until one has come."""
  registry = None
  srv = _server(cache_dir, toolchain, judge_jobs=2)
  parts = ("judge", "candidate", "judge_until_report", "judge_after_report")
  cpu = lambda: {p: (registry.get_sample_value("dice_verifier_job_cpu_seconds_sum", {"part": p})
                     or 0.0, registry.get_sample_value("dice_verifier_job_cpu_seconds_count",
                                                       {"part": p}) or 0.0) for p in parts}
  try:
    registry = srv.scheduler.metrics.registry
    for _ in range(6):
      assert _run(srv, "scaled_add").outcome == pb.OK
      got = cpu()
      if got["judge"][1] >= 1 and got["candidate"][1] >= 3:
        break
  finally:
    srv.stop()
  jobs = got["candidate"][1]
  assert jobs >= 3 and got["judge_until_report"][1] == jobs, got  # every job: the judge's share
  assert 1 <= got["judge"][1] == got["judge_after_report"][1] < jobs, got  # replaced judges only
  assert got["judge_until_report"][0] > 0 and got["judge"][0] > 0, got
