"""A real grpc.aio server on loopback, real nvcc compiles, no GPU: the CI path of ARCHITECTURE.md's verifier section."""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import prometheus_client
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dice.verifier.v1 import verifier_pb2 as pb

import verifier_harness
import verifier_kernels as kernels

_COMPILERS = {"nvcc", "cicc", "cudafe++", "cc1plus", "ptxas", "c++", "g++"}


def request(request_id: str, candidate: str = "", reference: str = kernels.REFERENCE,
            **options) -> pb.VerifyRequest:
  return pb.VerifyRequest(request_id=request_id, reference_source=reference,
                          candidate_source=candidate or kernels.cuda_candidate(),
                          options=pb.VerifyOptions(**options))


def test_health_and_reflection(server):
  channel = server.channel()
  health = health_pb2_grpc.HealthStub(channel)
  for service in ("", "dice.verifier.v1.Verifier"):
    reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
  reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
  replies = list(reflection.ServerReflectionInfo(
      iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
  names = {s.name for s in replies[0].list_services_response.service}
  assert {"dice.verifier.v1.Verifier", "grpc.health.v1.Health"} <= names


def test_get_info_describes_the_host(server, toolchain):
  info = server.stub().GetInfo(pb.GetInfoRequest(), timeout=30)
  assert info.environment.nvcc_version == toolchain.nvcc_version
  assert info.environment.torch_version == toolchain.torch_version
  assert info.environment.gpu_arch == "sm_90"
  assert info.queue_capacity == 64 and info.compile_workers == 2
  assert info.max_source_bytes == 1 << 20
  assert list(info.gpus) == []  # no GPU on CI


def test_compiled_candidate_without_gpu_is_no_gpu_and_cached(server):
  stub = server.stub()
  first = stub.Verify(request("good-1"), timeout=900)
  assert first.outcome == pb.NO_GPU, first.message
  assert first.stage == pb.STAGE_LOAD
  assert "no GPU" in first.message
  assert first.compile.compiled
  assert list(first.compile.kernel_names) == ["scaled_add_kernel"]
  assert list(first.compile.exported_functions) == ["scaled_add"]
  assert {t.stage for t in first.stage_timings} == {pb.STAGE_STATIC_CHECK, pb.STAGE_COMPILE}
  # The same candidate under another id: served from the compile cache.
  second = stub.Verify(request("good-2"), timeout=60)
  assert second.outcome == pb.NO_GPU and second.compile.cache_hit
  assert second.compile.cache_key == first.compile.cache_key
  # The same id again: the very same verdict, not a new run.
  again = stub.Verify(request("good-1"), timeout=60)
  assert again.SerializeToString() == first.SerializeToString()


def test_compile_error_returns_the_bounded_log(server):
  verdict = server.stub().Verify(request("broken", kernels.BROKEN_CUDA), timeout=900)
  assert verdict.outcome == pb.COMPILE_ERROR
  assert verdict.stage == pb.STAGE_COMPILE
  assert not verdict.compile.compiled
  assert "s_typo" in verdict.compile.log
  assert "s_typo" in verdict.message and "error" in verdict.message
  assert len(verdict.compile.log.encode()) <= server.config.max_log_bytes + 100


@pytest.mark.parametrize("candidate, reason", [
    ("import torch\n", "does not define ModelNew"),
    (kernels.cuda_candidate().replace("__global__", "__device__"), "no __global__ kernel"),
])
def test_static_rejections_come_back_with_reasons(server, candidate, reason):
  verdict = server.stub().Verify(request(f"reject-{reason}", candidate), timeout=30)
  assert verdict.outcome == pb.REJECTED
  assert reason in verdict.message
  assert not verdict.compile.compiled


def test_reference_without_get_inputs_is_bad_reference(server):
  reference = kernels.REFERENCE.replace("def get_inputs", "def inputs")
  verdict = server.stub().Verify(request("badref", reference=reference), timeout=30)
  assert verdict.outcome == pb.BAD_REFERENCE
  assert "get_inputs" in verdict.message


@pytest.mark.parametrize("req, detail", [
    (pb.VerifyRequest(request_id="x", reference_source=kernels.REFERENCE), "candidate_source"),
    (pb.VerifyRequest(reference_source="a", candidate_source="b"), "request_id is empty"),
    (pb.VerifyRequest(request_id="x" * 200, reference_source="a", candidate_source="b"),
     "longer than 128"),
    (pb.VerifyRequest(request_id="big", reference_source=kernels.REFERENCE,
                      candidate_source="#" * ((1 << 20) + 1)), "limit is 1048576"),
])
def test_invalid_requests_are_invalid_argument(server, req, detail):
  with pytest.raises(grpc.RpcError) as err:
    server.stub().Verify(req, timeout=30)
  assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert detail in err.value.details()


def test_non_utf8_bytes_are_invalid_argument(server):
  good = pb.VerifyRequest(request_id="utf", reference_source="AAAA",
                          candidate_source="x").SerializeToString()
  raw = server.channel().unary_unary("/dice.verifier.v1.Verifier/Verify",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
  with pytest.raises(grpc.RpcError) as err:
    raw(good.replace(b"AAAA", b"A\xff\xfeA"), timeout=30)
  assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert "UTF-8" in err.value.details()


def test_message_beyond_the_transport_limit_is_refused(server):
  huge = pb.VerifyRequest(request_id="huge", reference_source="a",
                          candidate_source="#" * (4 << 20))
  with pytest.raises(grpc.RpcError) as err:
    server.stub().Verify(huge, timeout=30)
  assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def _compiler_children() -> list[psutil.Process]:
  procs = []
  for child in psutil.Process().children(recursive=True):
    try:
      if child.name() in _COMPILERS:
        procs.append(child)
    except psutil.NoSuchProcess:
      pass
  return procs


def test_deadline_mid_compile_kills_the_build_and_disturbs_nothing(server):
  stub = server.stub()
  stub.Verify(request("good-1"), timeout=900)  # warm: the other client below is cached
  slow = kernels.cuda_candidate(kernels.CUDA_SOURCE + "\n// deadline test\n", name="deadline")
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    doomed = pool.submit(stub.Verify, request("deadline", slow), timeout=4)
    time.sleep(1.0)
    other = pool.submit(stub.Verify, request("other-client"), timeout=120)
    with pytest.raises(grpc.RpcError) as err:
      doomed.result()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert other.result().outcome == pb.NO_GPU
  deadline = time.monotonic() + 20
  while _compiler_children() and time.monotonic() < deadline:
    time.sleep(0.2)
  assert _compiler_children() == []
  info = stub.GetInfo(pb.GetInfoRequest(), timeout=30)
  assert info.queue_depth == 0


def test_concurrent_clients(server):
  stub = server.stub()
  cases = [(f"conc-{i}", kernels.cuda_candidate(), pb.NO_GPU) for i in range(4)]
  cases += [("conc-reject", "import torch\n", pb.REJECTED),
            ("conc-broken", kernels.BROKEN_CUDA, pb.COMPILE_ERROR)]
  with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
    futures = {rid: pool.submit(stub.Verify, request(rid, cand), timeout=900)
               for rid, cand, _ in cases}
    for rid, _, outcome in cases:
      verdict = futures[rid].result()
      assert verdict.request_id == rid
      assert verdict.outcome == outcome, verdict.message


def test_same_id_sent_concurrently_runs_once(server):
  stub = server.stub()
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    futures = [pool.submit(stub.Verify, request("same-id"), timeout=900) for _ in range(3)]
    blobs = {f.result().SerializeToString() for f in futures}
  assert len(blobs) == 1  # one run, one verdict (total_s included)


def test_stream_answers_every_request_by_id(server):
  requests = [request("s-good"), request("s-reject", "import torch\n"),
              pb.VerifyRequest(request_id="s-empty", reference_source=kernels.REFERENCE),
              request("s-broken", kernels.BROKEN_CUDA)]
  verdicts = {v.request_id: v for v in server.stub().VerifyStream(iter(requests), timeout=900)}
  assert set(verdicts) == {"s-good", "s-reject", "s-empty", "s-broken"}
  assert verdicts["s-good"].outcome == pb.NO_GPU
  assert verdicts["s-reject"].outcome == pb.REJECTED
  assert verdicts["s-empty"].outcome == pb.REJECTED
  assert verdicts["s-empty"].stage == pb.STAGE_PARSE
  assert "invalid request" in verdicts["s-empty"].message
  assert verdicts["s-broken"].outcome == pb.COMPILE_ERROR


def test_stream_answers_a_request_whose_verify_fails_with_infra_error(server, monkeypatch):
  """A fault of ours in one request's verification (here injected into the scheduler) gives that
  request an INFRA_ERROR verdict on the stream; the others are answered as usual."""
  verify = server.scheduler.verify

  async def faulty(req):
    if req.request_id == "s-fault":
      raise SystemError("injected")
    return await verify(req)
  monkeypatch.setattr(server.scheduler, "verify", faulty)
  requests = [request("s-fault"), request("s-fine", "import torch\n")]
  verdicts = {v.request_id: v for v in server.stub().VerifyStream(iter(requests), timeout=120)}
  assert verdicts["s-fault"].outcome == pb.INFRA_ERROR
  assert verdicts["s-fault"].message == "verifier error: SystemError: injected"
  assert verdicts["s-fine"].outcome == pb.REJECTED


def test_stream_with_undecodable_message_is_invalid_argument(server):
  raw = server.channel().stream_stream("/dice.verifier.v1.Verifier/VerifyStream",
                                       request_serializer=lambda b: b,
                                       response_deserializer=pb.Verdict.FromString)
  bad = pb.VerifyRequest(request_id="q", reference_source="AAAA",
                         candidate_source="b").SerializeToString().replace(b"AAAA", b"\xff\xff")
  with pytest.raises(grpc.RpcError) as err:
    list(raw(iter([bad]), timeout=30))
  assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_full_queue_is_resource_exhausted(cache_dir, toolchain):
  srv = verifier_harness.ServerThread(
      verifier_harness.make_config(cache_dir, queue_capacity=1, cpu_test_mode=True,
                                   run_timeout_s=30.0, run_budget_slowdown=0.0), toolchain)
  try:  # no scaled budget (run/budget.py): the hang holds the one place in the queue for 20 s
    stub = srv.stub()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      busy = pool.submit(stub.Verify, request("busy", kernels.cpp_candidate("hang"),
                                              run_timeout_s=20), timeout=600)
      deadline = time.monotonic() + 600
      while srv.scheduler.queue_depth == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
      with pytest.raises(grpc.RpcError) as err:
        stub.Verify(request("second"), timeout=30)
      assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
      streamed = list(stub.VerifyStream(iter([request("third")]), timeout=30))
      assert [(v.request_id, v.outcome, v.stage) for v in streamed] == [
          ("third", pb.INFRA_ERROR, pb.STAGE_QUEUE)]
      assert busy.result().outcome == pb.TIMEOUT
  finally:
    srv.stop()


def test_token_auth(cache_dir, toolchain):
  srv = verifier_harness.ServerThread(
      verifier_harness.make_config(cache_dir, auth_token="s3cret"), toolchain)
  try:
    stub = srv.stub()
    with pytest.raises(grpc.RpcError) as err:
      stub.GetInfo(pb.GetInfoRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    info = stub.GetInfo(pb.GetInfoRequest(), timeout=30,
                        metadata=[("authorization", "Bearer s3cret")])
    assert info.queue_capacity == 64
    health = health_pb2_grpc.HealthStub(srv.channel())
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
        health_pb2.HealthCheckResponse.SERVING)
  finally:
    srv.stop()


def test_prometheus_metrics_count_verdicts(server):
  server.stub().Verify(request("metrics-reject", "import torch\n"), timeout=30)
  text = prometheus_client.generate_latest(server.scheduler.metrics.registry).decode()
  assert 'dice_verifier_verdicts_total{outcome="REJECTED"}' in text
  assert "dice_verifier_stage_seconds_bucket" in text
  assert "dice_verifier_queue_depth" in text
