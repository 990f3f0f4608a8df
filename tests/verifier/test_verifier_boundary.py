"""The trust boundary's parts on their own (CPU, no server): the byte protocol, the dispatcher
tripwire, the partial-replacement policy, the merge of both sides' reports, and the package
layout that keeps the judge's code apart from the candidate's process.

End to end, through a real server, the same boundary is tried by hostile candidates in
tests/adversarial/adversarial_cpu_cases.py (operator overrides from Python and C++, a candidate
that breaks verifier code in its own process, the policy switch).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import pathlib
import socket
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service.compile import checks
from verifier_service.run import envelope
from verifier_service.run import ops
from verifier_service.run import policy
from verifier_service.run import wire
from verifier_service.service import config as config_lib
from verifier_service.trusted import judge as judge_lib
from verifier_service.trusted import verdict
from verifier_service.untrusted import probes

ROOT = pathlib.Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


# ----------------------------------------------------------------------------- wire


def _roundtrip(reference, candidate):
  expected = wire.spec(reference)
  leaves, buffers = wire.encode(candidate)
  payload = bytearray(b"".join(bytes(memoryview(b).cast("B")) for b in buffers))
  return wire.decode(expected, json.loads(json.dumps(leaves)), memoryview(payload), CPU)


def test_outputs_cross_as_bytes_and_come_back_exactly():
  tree = (torch.randn(3, 4), [torch.arange(5), torch.randn(2).to(torch.bfloat16)],
          torch.tensor(True), 2.5, float("nan"), "tag")
  leaves, why, found = _roundtrip(tree, tree)
  assert why == "" and found == []
  assert torch.equal(leaves[0], tree[0]) and torch.equal(leaves[1], tree[1][0])
  assert torch.equal(leaves[2], tree[1][1]) and leaves[2].dtype == torch.bfloat16
  assert leaves[3] is not tree[2] and bool(leaves[3]) and leaves[4] == 2.5
  assert math.isnan(leaves[5]) and leaves[6] == "tag"


def test_metadata_that_differs_from_the_reference_is_a_wrong_output_not_a_crash():
  ref = torch.ones(4, 3)
  assert _roundtrip(ref, torch.ones(3, 4))[1] == "output 0 shape (3, 4) != reference (4, 3)"
  assert "dtype torch.float64 != reference torch.float32" in _roundtrip(ref, ref.double())[1]
  assert "has 2 leaves, the reference has 1" in _roundtrip(ref, (ref, ref))[1]
  assert "is float, expected a tensor" in _roundtrip(ref, 3.0)[1]

  class Lazy(torch.Tensor):
    pass

  leaves, why, found = _roundtrip(ref, ref.clone().as_subclass(Lazy))
  assert leaves is None and "subclass" in why and found[0][0] == "TENSOR_SUBCLASS"


def test_values_are_read_with_the_reference_layout_whatever_is_declared():
  expected = wire.spec(torch.zeros(2, 2))
  sent = torch.ones(2, 2)
  leaves, buffers = wire.encode(sent)
  payload = bytearray(b"".join(bytes(memoryview(b).cast("B")) for b in buffers))
  assert len(payload) == wire.payload_bytes(expected) == wire.ALIGN_BYTES
  leaves[0]["nbytes"] = 4  # lies about its size
  with pytest.raises(wire.ProtocolError, match="declared 4 bytes"):
    wire.decode(expected, leaves, memoryview(payload), CPU)
  leaves[0]["nbytes"] = 16
  with pytest.raises(wire.ProtocolError, match="left over"):
    wire.decode(expected, leaves, memoryview(payload + bytes(64)), CPU)
  with pytest.raises(wire.ProtocolError, match="declared 16 bytes"):
    wire.decode(expected, leaves, memoryview(payload[:32]), CPU)
  with pytest.raises(wire.ProtocolError, match="not a list"):
    wire.decode(expected, {"kind": "tensor"}, memoryview(payload), CPU)
  out, _, _ = wire.decode(expected, leaves, memoryview(payload), CPU)
  sent.fill_(7.0)  # the sender's memory changes afterwards: the judge's bytes do not
  assert torch.equal(out[0], torch.ones(2, 2))


def test_channel_refuses_oversized_and_malformed_frames_before_reading_them():
  def pair():
    left, right = socket.socketpair()
    return left, wire.Channel(left), wire.Channel(right)

  _, sender, receiver = pair()
  sender.send({"op": "trial", "n": 1}, [torch.arange(4, dtype=torch.int32).numpy()])
  header, payload = receiver.recv(16)
  assert header == {"op": "trial", "n": 1, "nbytes": 16} and len(payload) == 16
  sender.send({"op": "x"}, [bytes(64)])
  with pytest.raises(wire.ProtocolError, match="payload of 64 bytes"):
    receiver.recv(16)  # refused on the header: the stream is out of step, the run ends
  raw, _, receiver = pair()
  raw.sendall(struct.pack(">I", 1 << 30))
  with pytest.raises(wire.ProtocolError, match="header of"):
    receiver.recv(16)
  raw, _, receiver = pair()
  raw.sendall(struct.pack(">I", 5) + b"nope!")
  with pytest.raises(wire.ProtocolError, match="not JSON"):
    receiver.recv(0)
  raw.close()
  with pytest.raises(wire.ProtocolError, match="closed"):
    receiver.recv(0)


# ----------------------------------------------------------------------------- policy


def test_op_families_match_what_torch_calls_the_same_work():
  assert ops.family("aten::addmm") == ops.family("aten::mm") == "matmul"
  assert ops.family("aten::relu_") == ops.family("aten::clamp_min") == "relu"
  assert ops.family("aten::cudnn_convolution") == "conv"
  assert ops.compute_families(["aten::view", "aten::add", "myops::fused"]) == {"add"}


_REFERENCE_OPS = ["aten::addmm", "aten::relu", "aten::t"]


def _findings(name, **evidence):
  return [k for k, _ in policy.findings(name, 0.5, evidence, _REFERENCE_OPS)]


def test_default_policy_allows_partial_replacement_and_rejects_torch_doing_it_all():
  # A cuBLAS matmul kept, the epilogue in the candidate's kernel: correct under the default.
  assert _findings(policy.DEFAULT, compute_ops={"aten::mm": 5}, launched=["relu_kernel"],
                   own_fraction=0.1, library=[("gemm", 90.0)]) == []
  # Torch ran every kind of op the reference runs (mm is addmm's family): a decoy kernel beside.
  assert _findings(policy.DEFAULT, compute_ops={"aten::mm": 5, "aten::add": 5, "aten::relu": 5},
                   launched=["touch"], own_fraction=0.05) == ["TORCH_FALLBACK"]
  # Compiled kernels that never launched.
  assert _findings(policy.DEFAULT, compute_ops={}, launched=[]) == ["NO_CUSTOM_KERNEL_LAUNCHED"]


def test_strict_policy_is_the_old_rule_with_a_configurable_fraction():
  assert _findings(policy.STRICT, compute_ops={"aten::mm": 5}) == ["TORCH_FALLBACK"]
  library = [("gemm", 60.0)]
  assert _findings(policy.STRICT, compute_ops={}, launched=["k"], own_fraction=0.4,
                   library=library) == ["TORCH_FALLBACK"]
  assert policy.findings(policy.STRICT, 0.3, {"compute_ops": {}, "launched": ["k"],
                                              "own_fraction": 0.4, "library": library},
                         _REFERENCE_OPS) == []


def test_a_kernel_compiled_for_a_batch_mate_is_rejected_under_both_policies():
  other = "void dice_0123456789ab_3::fast_kernel(float const*, float*, int)"
  own = "void dice_0123456789ab_1::my_kernel(float const*, float*, int)"
  assert probes.foreign_kernels([own, other, "void gemm_kernel<float>()", other],
                                ["dice_0123456789ab_1"]) == [other]
  assert probes.foreign_kernels([own], ["dice_0123456789ab_1"]) == []
  assert probes.foreign_kernels([own], []) == [own]  # built alone: no batch code is its own
  for name in (policy.DEFAULT, policy.STRICT):
    assert "FOREIGN_KERNEL" in _findings(name, compute_ops={}, launched=["my_kernel"],
                                         own_fraction=0.5, foreign_kernels=[other])
  merged = _merge(_JUDGE_OK, dict(_CAND_OK, evidence=dict(_CAND_OK["evidence"],
                                                           foreign_kernels=[other])))
  assert merged["outcome"] == "REJECTED" and merged["message"].startswith("FOREIGN_KERNEL")


# ----------------------------------------------------------------------------- merge

_OPTIONS = config_lib.resolve_options(pb.VerifyOptions(), config_lib.ServerConfig())  # POLICY_DEFAULT
_JUDGE_OK = {"outcome": "OK", "stage": "STAGE_DONE", "trials": [], "stage_timings": [],
             "findings": [], "reference_ops": ["aten::add", "aten::mul"],
             "timing": {"speedup": 2.0}}
_CAND_OK = {"finished": True, "error": None, "infra": "", "findings": [],
            "evidence": {"compute_ops": {}, "launched": None, "own_fraction": 1.0},
            "forward_ops": ["aten::empty_like x5"]}


def _judge_report(fields: dict | None) -> envelope.JudgeReport | None:
  """The report the worker reads from the judge's line (the fields a test leaves out default)."""
  if fields is None:
    return None
  defaults = envelope.JudgeReport(stage="STAGE_LOAD", outcome=None).to_json()
  return envelope.JudgeReport.from_json({**defaults, **fields})


def _cand_report(fields: dict | None) -> envelope.CandidateReport | None:
  if fields is None:
    return None
  evidence = fields.get("evidence")
  if evidence is not None:
    fields = dict(fields, evidence={**dataclasses.asdict(envelope.Evidence()), **evidence})
  return envelope.CandidateReport.from_json({**envelope.CandidateReport().to_json(), **fields})


def _merge(judge=None, cand=None, loading=True, status=None, cand_status=None, violations=(),
           refused=""):
  return verdict.merge(_OPTIONS, {"report": _judge_report(judge), "status": status or {"exit_code": 0}},
                       {"report": _cand_report(cand), "status": cand_status or {"exit_code": 0},
                        "loading": loading, "log_tail": "tail", "refused": refused},
                       list(violations))


def test_ok_needs_the_judge_to_finish_and_the_candidate_to_report():
  assert _merge(_JUDGE_OK, _CAND_OK)["outcome"] == "OK"
  assert _merge(_JUDGE_OK, _CAND_OK)["policy"] == "POLICY_DEFAULT"
  crashed = _merge(_JUDGE_OK, None, cand_status={"signal": 11, "signal_name": "SIGSEGV"})
  assert crashed["outcome"] == "RUNTIME_ERROR" and crashed["exploits"][0]["kind"] == "CRASH"
  silent = _merge(_JUDGE_OK, None)
  assert silent["outcome"] == "RUNTIME_ERROR" and "without reporting" in silent["message"]


def test_infra_error_only_for_failures_candidate_code_cannot_have_caused():
  assert _merge(None, _CAND_OK)["outcome"] == "INFRA_ERROR"  # the judge never runs it
  assert _merge(_JUDGE_OK, None, loading=False)["outcome"] == "INFRA_ERROR"
  claims = dict(_CAND_OK, infra="CUDA unavailable")
  assert _merge(_JUDGE_OK, claims, loading=False)["outcome"] == "INFRA_ERROR"
  assert _merge(_JUDGE_OK, claims, loading=True)["outcome"] == "RUNTIME_ERROR"
  broke = dict(_CAND_OK, error={"outcome": "INFRA_ERROR", "message": "verifier code raised",
                                "out_of_memory": False})
  assert _merge(_JUDGE_OK, broke)["outcome"] == "RUNTIME_ERROR"


def test_the_candidates_report_cannot_break_or_bend_the_verdict():
  # Of the report's types, but bent: an unknown kind, a huge evidence string, a share above 1.
  bent = dict(_CAND_OK, findings=[["NOT_AN_EXPLOIT", "x"], ["MONKEY_PATCH", "y" * 10_000]],
              evidence={"own_fraction": 7.0, "compute_ops": {}})
  merged = _merge(_JUDGE_OK, bent)
  assert [f["kind"] for f in merged["exploits"]] == ["MONKEY_PATCH"]
  assert len(merged["exploits"][0]["evidence"]) == 500
  assert merged["outcome"] == "REJECTED" and merged["custom_kernel_time_fraction"] == 1.0
  # Not of its types (an unhashable kind once raised TypeError in the merge: the worker died and
  # the job was INFRA_ERROR): refused where the worker reads it, so that process has no report,
  # and the verdict says why.
  for broken in (dict(_CAND_OK, findings=[7]), dict(_CAND_OK, findings=[[["MONKEY_PATCH"], "z"]]),
                 dict(_CAND_OK, evidence={"launched": "all"}),
                 dict(_CAND_OK, evidence={"compute_ops": {"a": "b"}})):
    with pytest.raises(ValueError, match=r"CandidateReport\.(findings|evidence)"):
      _cand_report(broken)
  refused = _merge(_JUDGE_OK, None, refused="CandidateReport.findings[0]: expected a list, got int")
  assert refused["outcome"] == "RUNTIME_ERROR" and "report_refused" in refused["message"]
  stopped = dict(_JUDGE_OK, outcome=None, candidate_ended="it stopped")
  assert _merge(stopped, _CAND_OK)["outcome"] == "RUNTIME_ERROR"
  found = dict(_CAND_OK, findings=[["DISPATCH_OVERRIDE", "aten::add.Tensor: CPU: candidate.py:3"]])
  rejected = _merge(stopped, found)
  assert rejected["outcome"] == "REJECTED" and rejected["message"].startswith("DISPATCH_OVERRIDE")


def test_running_out_of_memory_on_a_large_problem_asks_for_a_run_alone():
  """A candidate process that ran out of device memory (its word) on a problem whose own inputs
  and outputs are a quarter of that process's share or more (the judge's word) is marked for the
  scheduler's retry alone on its GPU; on a small problem, or without the allocator's error, or
  when the judge decided the verdict, it is the candidate's RUNTIME_ERROR and nothing more."""
  ended = dict(_JUDGE_OK, outcome=None, candidate_ended="it stopped",
               memory={"problem_bytes": 4_500_000_000, "share_bytes": 15_700_000_000})
  oom = dict(_CAND_OK, error={"outcome": "RUNTIME_ERROR", "out_of_memory": True,
                              "message": "verifier code raised OutOfMemoryError"})
  short = _merge(ended, oom)
  assert short["outcome"] == "RUNTIME_ERROR" and short[verdict.SHORT_OF_MEMORY] is True
  small = dict(ended, memory={"problem_bytes": 3_000_000_000, "share_bytes": 15_700_000_000})
  with pytest.raises(ValueError, match=r"error.out_of_memory: expected bool, got str"):
    _cand_report(dict(oom, error=dict(oom["error"], out_of_memory="yes")))  # refused when read
  no_share = dict(ended, memory={"problem_bytes": 4_500_000_000, "share_bytes": 0})
  wrong = dict(ended, outcome="INCORRECT", message="trial 1: wrong")
  for judge, cand in ((small, oom), (no_share, oom), (wrong, oom),
                      (ended, dict(oom, error=dict(oom["error"], out_of_memory=False)))):
    merged = _merge(judge, cand)
    assert verdict.SHORT_OF_MEMORY not in merged, (judge["memory"], cand["error"])
    assert merged["outcome"] in ("RUNTIME_ERROR", "INCORRECT")


def test_timed_outputs_the_candidates_process_keeps_count_as_the_verifiers_memory():
  """The timing stage has the candidate's process keep outputs (each batch's, and the calls drawn
  for the secret check): that memory is the verifier's. A process that runs out of memory while
  holding it is marked for the run alone, as DICE 3497 (4 GiB outputs) needed on the H200, where
  the problem's own tensors were 14% of a 31.5 GiB share and the kept outputs the rest."""
  job = envelope.Job(job_id="cpu/0#1", reference_source="ref", candidate_source="cand",
                     options=_OPTIONS, modules={}, kernel_names=(), kernel_namespaces=())
  judge = judge_lib.Judge(envelope.Envelope(job=job, device="cpu", share=envelope.Share(
      sandboxed=True, memory_bytes=40_000)), None, lambda _: None)
  judge.spec, judge.input_bytes = wire.spec(torch.zeros(1000)), 1000
  out = wire.payload_bytes(judge.spec)
  assert out >= 4000 and judge.memory() == envelope.Memory(1000 + out, 40_000)
  ended = dict(_JUDGE_OK, outcome=None, candidate_ended="it stopped")
  oom = dict(_CAND_OK, error={"outcome": "RUNTIME_ERROR", "out_of_memory": True,
                              "message": "timing raised OutOfMemoryError"})
  memory = lambda: {"memory": dataclasses.asdict(judge.memory())}
  assert verdict.SHORT_OF_MEMORY not in _merge(dict(ended, **memory()), oom)
  judge.holding(2)  # a batch of two calls, nothing kept yet
  assert judge.memory().problem_bytes == 2 * 1000 + 2 * 2 * out
  judge.kept_calls = [1, 6]
  judge.holding(2)
  assert judge.memory().problem_bytes == 2 * 1000 + 2 * 4 * out
  judge.holding(1)  # the peak stays
  assert judge.memory().problem_bytes == 2 * 1000 + 2 * 4 * out
  assert _merge(dict(ended, **memory()), oom)[verdict.SHORT_OF_MEMORY] is True



def test_the_timing_plan_checks_large_outputs_per_batch_and_refuses_what_the_share_cannot_hold():
  """DICE 3497 (4 GiB outputs) on an H100 alone: 2 x (2 + 4) x 4 GiB of timed copies kept to the
  end ran out of a 35.6 GiB share, charged to a known-good kernel. Drawn outputs over KEPT_BYTES
  are now checked after their batch (the process holds one batch's copies), and a plan that still
  cannot fit ends INFRA_ERROR before timing, marked for the run alone - never the candidate's."""
  job = envelope.Job(job_id="cuda/0#1", reference_source="ref", candidate_source="cand",
                     options=_OPTIONS, modules={}, kernel_names=(), kernel_namespaces=())

  def plan(outputs: torch.Tensor, input_bytes: int, share: int) -> judge_lib.TimingPlan:
    judge = judge_lib.Judge(envelope.Envelope(job=job, device="cpu", share=envelope.Share(
        sandboxed=True, memory_bytes=share)), None, lambda _: None)
    judge.spec, judge.input_bytes = wire.spec(outputs), input_bytes
    return judge.timing_plan(verify=True)

  small = plan(torch.zeros(1000), 1000, 40_000_000)
  out = wire.payload_bytes(wire.spec(torch.zeros(1000)))
  assert (small.batch, small.quota, small.each_batch) == (
      judge_lib.BATCH_CALLS, judge_lib.VERIFIED_CALLS, False)
  assert small.peak_bytes == judge_lib.timing_bytes(1000, out, small.batch, small.quota)
  gib = 1 << 30
  dice_3497 = torch.empty(gib, device="meta")  # 4 GiB of float32, never allocated
  h100_alone = int(0.45 * 79.18 * gib)
  large = plan(dice_3497, gib // 2, h100_alone)
  assert (large.batch, large.quota, large.each_batch) == (2, judge_lib.MIN_VERIFIED_CALLS, True)
  assert large.peak_bytes == gib + 2 * 2 * 4 * gib < h100_alone  # one batch's copies, no more
  assert judge_lib.timing_bytes(gib // 2, 4 * gib, 2, 4) > h100_alone  # what ran out before
  # The first kept output past KEPT_BYTES switches to checks per batch; below it, kept to the end.
  edge = judge_lib.KEPT_BYTES // judge_lib.MIN_VERIFIED_CALLS
  assert not plan(torch.empty(edge, dtype=torch.uint8, device="meta"), 0, 0).each_batch
  assert plan(torch.empty(edge + 4096, dtype=torch.uint8, device="meta"), 0, 0).each_batch
  # A slot's share on 4 slots of the H100 cannot hold even one batch's copies: INFRA_ERROR, with
  # the bytes reported, so the verdict asks for the run alone (and the candidate is not blamed).
  slot = int(0.1125 * 79.18 * gib)
  judge = judge_lib.Judge(envelope.Envelope(job=job, device="cpu", share=envelope.Share(
      sandboxed=True, memory_bytes=slot)), None, lambda _: None)
  judge.spec, judge.input_bytes = wire.spec(dice_3497), gib // 2
  with pytest.raises(judge_lib.Ended, match=r"need 17\.00 GiB .* share \(8\.91 GiB\)") as ended:
    judge.timing_plan(verify=True)
  assert ended.value.outcome == "INFRA_ERROR" and not ended.value.candidate
  assert judge.memory() == envelope.Memory(large.peak_bytes, slot)
  infra = dict(_JUDGE_OK, outcome="INFRA_ERROR", message=ended.value.message,
               memory=dataclasses.asdict(judge.memory()))
  merged = _merge(infra, _CAND_OK)
  assert merged["outcome"] == "INFRA_ERROR" and merged[verdict.SHORT_OF_MEMORY] is True
  # Any other INFRA_ERROR (the problem fits its share) is retried as before, not marked large.
  fits = dict(infra, memory={"problem_bytes": slot - 1, "share_bytes": slot})
  assert verdict.SHORT_OF_MEMORY not in _merge(fits, _CAND_OK)

def test_judge_outcomes_and_policy_findings_reach_the_verdict():
  incorrect = dict(_JUDGE_OK, outcome="INCORRECT", message="trial 1: wrong")
  assert _merge(incorrect, _CAND_OK)["outcome"] == "INCORRECT"
  assert _merge(dict(_JUDGE_OK, outcome="BAD_REFERENCE"), None)["outcome"] == "BAD_REFERENCE"
  torch_did_it = dict(_CAND_OK, evidence={"compute_ops": {"aten::add": 5, "aten::mul": 5}})
  merged = _merge(_JUDGE_OK, torch_did_it)
  assert merged["outcome"] == "REJECTED" and merged["exploits"][0]["kind"] == "TORCH_FALLBACK"
  fast = _merge(dict(_JUDGE_OK, timing={"speedup": 500.0}), _CAND_OK)
  assert fast["outcome"] == "OK" and fast["exploits"][0]["kind"] == "IMPLAUSIBLE_SPEEDUP"


# ----------------------------------------------------------------------------- dispatcher

_DISPATCH_PROBE = textwrap.dedent("""
    import json, torch
    from verifier_service.untrusted import dispatch
    before = dispatch.Registrations.take()
    import torch._refs  # torch registering more of its own kernels lazily is not tampering
    own = torch.library.Library("dice_own_ops", "DEF")
    own.define("twice(Tensor x) -> Tensor")
    own.impl("twice", lambda x: x * 2, "CPU")
    quiet = before.changes()
    source = "import torch\\nlib = torch.library.Library('aten', 'IMPL')\\n" + \\
             "lib.impl('add.Tensor', lambda a, b, alpha=1: a, 'CPU')\\n"
    scope = {}
    exec(compile(source, "candidate.py", "exec"), scope)
    print(json.dumps({"quiet": quiet, "loud": before.changes()}))
""")


def test_dispatcher_tripwire_names_registrations_for_torch_ops_only():
  proc = subprocess.run([sys.executable, "-c", _DISPATCH_PROBE], capture_output=True, text=True,
                        check=True, cwd=ROOT, timeout=300)
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["quiet"] == []
  (kind, evidence), = result["loud"]
  assert kind == "DISPATCH_OVERRIDE" and evidence.startswith("aten::add.Tensor: CPU: registered "
                                                             "at candidate.py:2")


# ----------------------------------------------------------------------------- layout


def _imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(checks.parse_python(path.read_text(), str(path))):
    if isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
    elif isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
  return names


def test_the_trusted_side_never_imports_the_candidates_side():
  package = ROOT / "verifier_service"
  # worker/ forks and starts both sides, so it imports both, from above them; run/ is shared by
  # both sides.
  shared = list((package / "run").glob("*.py"))
  assert len(shared) >= 6, shared
  for path in [*(package / "trusted").glob("*.py"), *shared]:
    leaked = {n for n in _imports(path) if "untrusted" in n}
    assert not leaked, (path.name, leaked)
  for path in (package / "untrusted").glob("*.py"):
    assert not {n for n in _imports(path) if "trusted" in n.split(".")}, path.name
