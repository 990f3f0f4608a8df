"""The hostile suite's CPU analogues through a real server, real workers and the real sandbox.

One server in CPU test mode (C++-only candidates run on CPU worker children), with a secret in
its environment, a small file-size limit and the job children sandboxed as in production. Every
case of adversarial_cpu_cases.py runs concurrently on two slots; the table of results is printed
(`-s`), and each case is its own test. A verdict that names ESCAPED means a hostile call got
through the sandbox: always a failure; so is the outside file's text in a verdict's message or
compile log (the compile-stage cases try to read it at compile time).
"""

from __future__ import annotations

import concurrent.futures
import os
import tempfile

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dice.verifier.v1 import verifier_pb2 as pb

import adversarial_cpu_cases
import verifier_harness
import verifier_kernels as kernels

CASES = {c.name: c for c in adversarial_cpu_cases.cases()}
OUTSIDE_TEXT = "readable by anyone, outside every sandbox"


@pytest.fixture(scope="module", params=[1, 16], ids=["judge_per_job", "kept_judges"])
def hostile(cache_dir, toolchain, request):
  """A sandboxed CPU-mode server and the verdict of every case, run together: once with a judge
  per job, once with judges kept for up to 16 jobs (worker/process.py), where a case that could
  leave anything in its judge would change a later case's verdict."""
  secret_dir = tempfile.mkdtemp(prefix="dice-adv-outside-")
  os.chmod(secret_dir, 0o755)
  outside = os.path.join(secret_dir, "secret.txt")
  with open(outside, "w") as f:
    f.write(OUTSIDE_TEXT + "\n")
  os.chmod(outside, 0o644)
  os.environ["DICE_ADVERSARIAL_SECRET"] = "hunter2"
  try:
    srv = verifier_harness.ServerThread(verifier_harness.make_config(
        cache_dir, cpu_test_mode=True, slots_per_gpu=2, sandbox_file_bytes=8 << 20,
        run_timeout_s=30.0, sandbox_strict=True, judge_jobs=request.param), toolchain)
  finally:
    del os.environ["DICE_ADVERSARIAL_SECRET"]
  fill = {"{PORT}": str(srv.port), "{OUTSIDE}": outside, "{CACHE}": str(cache_dir)}
  judge_jobs = request.param

  def run(case):
    source = case.source
    for key, value in fill.items():
      source = source.replace(key, value)
    options = pb.VerifyOptions(num_timing_trials=5,
                               run_timeout_s=8 if case.name == "host_loop" else 0,
                               policy=pb.Policy.Value(case.policy) if case.policy else 0)
    # The ids differ per server: the verdict store (in the shared cache folder) answers a resent id.
    return srv.stub().Verify(pb.VerifyRequest(
        request_id=f"adv-{case.name}-{judge_jobs}", reference_source=kernels.REFERENCE,
        candidate_source=source, options=options), timeout=900)

  # Compile the shared family once before the concurrent burst.
  run(CASES["honest"])
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    verdicts = dict(zip(CASES, pool.map(run, CASES.values())))
  print(f"\n{'case':30} {'outcome':14} {'exploits':40} message")
  for name, v in verdicts.items():
    kinds = ",".join(sorted({pb.Exploit.Name(e.kind) for e in v.exploits}))
    print(f"{name:30} {pb.Outcome.Name(v.outcome):14} {kinds:40} {v.message[:110]}")
  yield srv, verdicts, judge_jobs
  srv.stop()
  assert not os.path.exists(os.path.join(str(cache_dir), "builds", "poisoned.json"))


@pytest.mark.parametrize("name", list(CASES))
def test_case_gets_its_verdict(hostile, name):
  _, verdicts, _ = hostile
  case, verdict = CASES[name], verdicts[name]
  outcome = pb.Outcome.Name(verdict.outcome)
  kinds = {pb.Exploit.Name(e.kind) for e in verdict.exploits}
  assert "ESCAPED" not in verdict.message, verdict.message
  assert "ESCAPED" not in verdict.compile.log, verdict.compile.log
  assert OUTSIDE_TEXT not in verdict.message + verdict.compile.log, verdict.compile.log
  assert outcome in case.expect, (outcome, verdict.message, kinds)
  assert case.exploits <= kinds, (kinds, verdict.message)
  assert case.message in verdict.message, verdict.message
  if case.max_reference_us:
    assert 0 < verdict.timing.reference.median_us < case.max_reference_us, verdict.timing
  if case.policy:
    assert pb.Policy.Name(verdict.policy) == case.policy
  if case.honest:
    assert not kinds, (kinds, verdict.message)


def test_the_server_survived_the_suite(hostile):
  srv, _, judge_jobs = hostile
  if judge_jobs > 1:  # kept judges did serve hostile cases' jobs (the metric counts each verdict)
    judged = {k: srv.scheduler.metrics.registry.get_sample_value(
        "dice_verifier_judged_jobs_total", {"judge": k}) for k in ("new", "kept")}
    assert (judged["kept"] or 0) >= 5, judged
  health = health_pb2_grpc.HealthStub(srv.channel())
  assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
      health_pb2.HealthCheckResponse.SERVING)
  verdict = srv.stub().Verify(pb.VerifyRequest(
      request_id=f"adv-after-{judge_jobs}", reference_source=kernels.REFERENCE,
      candidate_source=kernels.cpp_candidate("scaled_add")), timeout=300)
  assert verdict.outcome == pb.OK, verdict.message
  assert all(s.info["sandbox"].get("seccomp", "").startswith("on")
             for s in srv.scheduler.pool.slots)
