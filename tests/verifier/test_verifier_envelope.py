"""The typed values between the verifier's processes (run/envelope.py): the job the pool sends a
worker, the envelope the worker hands a job's two processes, and the two reports that come back.
Each round-trips through JSON, and each refuses, naming the field, a missing field, an unknown
one and one of the wrong type; a real worker process answers a job line it refuses and goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service.run import envelope
from verifier_service.service import config as config_lib

_OPTIONS = config_lib.resolve_options(pb.VerifyOptions(seed=7), config_lib.ServerConfig())
_JOB = envelope.Job(job_id="cpu/0#1", reference_source="ref", candidate_source="cand",
                    options=_OPTIONS, modules={"abc": "/cache/abc/m.so"}, kernel_names=("k",),
                    kernel_namespaces=("dice_0123456789ab_1",))
_ENVELOPE = envelope.Envelope(job=_JOB, device="cpu", share=envelope.Share(
    sandboxed=True, gpu_memory_fraction=0.1, memory_bytes=1 << 30, read_only=("/usr",)))
_JUDGE = envelope.JudgeReport(
    stage="STAGE_DONE", outcome="OK", trials=(envelope.Trial(1, True, 0.0, 0.0, ""),),
    stage_timings=(envelope.StageTiming("STAGE_LOAD", 0.5),), findings=(("INPUT_MUTATION", "x"),),
    reference_ops=("aten::add",), environment={"gpu_name": "cpu"},
    timing={"speedup": 2.0, "reference": {"median_us": 3.0, "num_trials": 10}},
    timing_parts={"timing_lock_wait": 0.01}, memory=envelope.Memory(10, 100))
_CANDIDATE = envelope.CandidateReport(
    finished=True, environment={"gpu_name": "cpu"}, sandbox={"seccomp": "on"},
    findings=(("MONKEY_PATCH", "y"),), forward_ops=("aten::add x2",),
    evidence=envelope.Evidence(kernel_names=("k",), launched=("k",), own_fraction=0.9,
                               library=(("gemm", 1.5),), compute_ops={"aten::add": 2}),
    error=envelope.CandidateFailure("RUNTIME_ERROR", "it raised", out_of_memory=False))
VALUES = [_JOB, _ENVELOPE, _JUDGE, _CANDIDATE]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_each_value_round_trips_through_json(value):
  assert type(value).from_json(json.loads(value.dumps())) == value


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_a_missing_or_unknown_field_is_refused_by_name(value):
  data = json.loads(value.dumps())
  name = sorted(data)[0]
  with pytest.raises(ValueError, match=rf"{type(value).__name__}: missing \['{name}'\], unknown \[\]"):
    type(value).from_json({k: v for k, v in data.items() if k != name})
  with pytest.raises(ValueError, match=rf"{type(value).__name__}: missing \[\], unknown \['extra'\]"):
    type(value).from_json(dict(data, extra=1))
  with pytest.raises(ValueError, match=rf"{type(value).__name__}: expected an object, got list"):
    type(value).from_json([data])


@pytest.mark.parametrize("cls, change, message", [
    (envelope.Job, {"memory_scale": "4"}, r"Job\.memory_scale: expected int, got str"),
    (envelope.Job, {"memory_scale": True}, r"Job\.memory_scale: expected int, got bool"),
    (envelope.Job, {"kernel_names": "k"}, r"Job\.kernel_names: expected a list, got str"),
    (envelope.Job, {"modules": {"abc": 3}}, r"Job\.modules\['abc'\]: expected str, got int"),
    (envelope.Job, {"options": {"seed": 7}}, r"Job\.options: missing \["),
    (envelope.Envelope, {"share": {"sandboxed": 1, "gpu_memory_fraction": 0.1,
                                   "memory_bytes": 0, "read_only": [], "timing_core": True,
                                   "warmup_together": False}},
     r"Envelope\.share\.sandboxed: expected bool, got int"),
    (envelope.JudgeReport, {"trials": [{"seed": 1}]}, r"JudgeReport\.trials\[0\]: missing \["),
    (envelope.JudgeReport, {"findings": [["A", "b", "c"]]},
     r"JudgeReport\.findings\[0\]: expected 2 items, got 3"),
    (envelope.JudgeReport, {"memory": {"problem_bytes": 1.5, "share_bytes": 2}},
     r"JudgeReport\.memory\.problem_bytes: expected int, got float"),
    (envelope.JudgeReport, {"timing": {"speedup": "fast"}},
     r"JudgeReport\.timing\['speedup'\]: 'fast' is none of"),
    (envelope.CandidateReport, {"error": {"outcome": "RUNTIME_ERROR", "message": "m"}},
     r"CandidateReport\.error: missing \['out_of_memory'\]"),
    (envelope.CandidateReport, {"evidence": None, "infra": None},
     r"CandidateReport\.infra: expected str, got NoneType"),
])
def test_a_field_of_the_wrong_type_is_refused_by_its_path(cls, change, message):
  value = next(v for v in VALUES if type(v) is cls)
  data = dict(json.loads(value.dumps()), **change)
  with pytest.raises(ValueError, match=message):
    cls.from_json(data)


def test_an_int_stays_an_int_where_a_number_is_asked_for():
  """A count in the timing stats goes to an int32 proto field: it must not come back as 10.0."""
  timing = envelope.JudgeReport.from_json(json.loads(_JUDGE.dumps())).timing
  assert timing is not None and type(timing["reference"]["num_trials"]) is int


def test_a_worker_answers_a_job_it_refuses_and_goes_on(tmp_path):
  """A real worker process (`python -m verifier_service.worker`, CPU mode, no sandbox): a job
  line with an unknown field, one that is not JSON, and one with a field of the wrong type each
  end at once in a "done" message that names why (with the job's id where the line has one, so
  the pool's wait for it ends); the worker stays up for the next line."""
  good = json.loads(_JOB.dumps())
  lines = [json.dumps(dict(good, job_id="a", priority=1)), "{not json",
           json.dumps(dict(good, job_id="b", memory_scale="2"))]
  proc = subprocess.run(
      [sys.executable, "-m", "verifier_service.worker", "--device", "cpu",
       "--sandbox", json.dumps({"enabled": False, "standby": False})],
      input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300,
      env=dict(os.environ, TMPDIR=str(tmp_path)))
  assert proc.returncode == 0, proc.stderr[-2000:]
  messages = [json.loads(line) for line in proc.stdout.splitlines()]
  assert messages[0]["type"] == "ready"
  done = messages[1:]
  assert [(m["type"], m["job_id"], m["result"]) for m in done] == [
      ("done", "a", None), ("done", None, None), ("done", "b", None)]
  assert "unknown ['priority']" in done[0]["status"]["error"]
  assert "not JSON" in done[1]["status"]["error"]
  assert "Job.memory_scale: expected int, got str" in done[2]["status"]["error"]


def test_a_worker_whose_pool_went_away_exits_with_one_line_and_no_folders(tmp_path):
  """A worker whose pool closed its pipe (its server killed: a benchmark's stage limit) exits on
  its next write with one line, no traceback, and leaves no job folder behind (its standby pair,
  forked ahead, is discarded)."""
  proc = subprocess.Popen(
      [sys.executable, "-m", "verifier_service.worker", "--device", "cpu",
       "--sandbox", json.dumps({"enabled": False})],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=dict(os.environ, TMPDIR=str(tmp_path)))
  assert proc.stdout is not None and proc.stdin is not None
  assert json.loads(proc.stdout.readline())["type"] == "ready"
  deadline = time.monotonic() + 60
  while not list(tmp_path.glob("dice-*")) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert list(tmp_path.glob("dice-*")), "no standby pair was forked"
  proc.stdout.close()
  _, stderr = proc.communicate(_JOB.dumps().encode() + b"\n", timeout=300)
  text = stderr.decode(errors="replace")
  assert proc.returncode == 1, text[-2000:]
  assert "the pool's pipe closed" in text and "Traceback" not in text, text[-2000:]
  assert list(tmp_path.glob("dice-*")) == [], list(tmp_path.iterdir())
