"""Faults the verifier must survive (CPU): a worker killed with SIGKILL in the middle of a burst,
and the server itself restarting between a request and its resend.

The candidate-side faults (host loop, segfault, host memory, huge file) are cases of
test_adversarial_cpu.py; the GPU ones (non-terminating kernel, illegal address, GPU OOM) are in
test_adversarial_gpu.py.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

from grpc_health.v1 import health_pb2, health_pb2_grpc

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service.service import verdict_store

import verifier_harness
import verifier_kernels as kernels


def _request(request_id: str, call: str = "scaled_add", candidate: str | None = None):
  return pb.VerifyRequest(request_id=request_id, reference_source=kernels.REFERENCE,
                          candidate_source=candidate or kernels.cpp_candidate(call),
                          options=pb.VerifyOptions(num_timing_trials=3))


def test_worker_killed_mid_burst_loses_and_misscores_nothing(cache_dir, toolchain):
  srv = verifier_harness.ServerThread(verifier_harness.make_config(
      cache_dir, cpu_test_mode=True, slots_per_gpu=2), toolchain)
  try:
    stub = srv.stub()
    assert stub.Verify(_request("warm"), timeout=900).outcome == pb.OK
    slow = kernels.cpp_candidate("scaled_add").replace(
        "super().__init__()", "super().__init__()\n        import time\n        time.sleep(2)")
    burst = [(f"burst-{i}", call, pb.OK if call == "scaled_add" else pb.INCORRECT)
             for i, call in enumerate(["scaled_add", "slightly_off"] * 3)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      futures = {rid: pool.submit(stub.Verify, _request(rid, call), timeout=600)
                 for rid, call, _ in burst}
      victim = pool.submit(stub.Verify, _request("victim", candidate=slow), timeout=600)
      deadline = time.monotonic() + 120
      killed = None
      while killed is None and time.monotonic() < deadline:
        for slot in srv.scheduler.pool.slots:
          if slot.running is not None:  # its job's processes started
            os.kill(slot.info["pid"], signal.SIGKILL)
            killed = slot.name
            break
        time.sleep(0.05)
      assert killed is not None
      results = {rid: f.result() for rid, f in futures.items()}
      results["victim"] = victim.result()
    for rid, _, outcome in burst:
      assert results[rid].outcome == outcome, (rid, results[rid].message)
    assert results["victim"].outcome == pb.OK, results["victim"].message
    assert max(v.attempts for v in results.values()) == 2  # exactly the killed job was retried
    health = health_pb2_grpc.HealthStub(srv.channel())
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
        health_pb2.HealthCheckResponse.SERVING)
  finally:
    srv.stop()


def test_resend_after_server_restart_gets_the_stored_verdict(tmp_path, toolchain):
  config = verifier_harness.make_config(tmp_path)
  reject = pb.VerifyRequest(request_id="restart-1", reference_source=kernels.REFERENCE,
                            candidate_source="import torch\n")
  first_server = verifier_harness.ServerThread(config, toolchain)
  try:
    first = first_server.stub().Verify(reject, timeout=60)
  finally:
    first_server.stop()
  second_server = verifier_harness.ServerThread(config, toolchain)
  try:
    stub = second_server.stub()
    again = stub.Verify(reject, timeout=60)
    assert again.SerializeToString() == first.SerializeToString()  # total_s included: not re-run
    assert second_server.scheduler.verdicts_total == 0
    changed = pb.VerifyRequest(request_id="restart-1", reference_source=kernels.REFERENCE,
                               candidate_source="import torch\nclass Other: pass\n")
    fresh = stub.Verify(changed, timeout=60)
    assert second_server.scheduler.verdicts_total == 1
    assert fresh.outcome == pb.REJECTED and fresh.total_s != first.total_s
  finally:
    second_server.stop()


def test_verdict_store_is_bounded(tmp_path):
  store = verdict_store.VerdictStore(tmp_path / "v.sqlite", capacity=3)
  for i in range(6):
    store.put(f"id-{i}", "d", b"verdict %d" % i)
  assert len(store) == 3
  assert store.get("id-0", "d") is None
  assert store.get("id-5", "d") == b"verdict 5"
  assert store.get("id-5", "other digest") is None
  store.close()
