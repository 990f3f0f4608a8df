"""The committed gRPC stubs must be exactly what the pinned generator makes from the .proto."""

from __future__ import annotations

import importlib.util
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_generator():
  spec = importlib.util.spec_from_file_location("proto_generate", REPO_ROOT / "protos" / "generate.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_committed_stubs_match_proto(tmp_path: pathlib.Path):
  gen = _load_generator()
  fresh = gen.generate(tmp_path)
  assert fresh, "protoc wrote nothing"
  for path in fresh:
    rel = path.relative_to(tmp_path)
    committed = REPO_ROOT / "protos" / rel
    assert committed.exists(), f"{rel} is generated but not committed: run python protos/generate.py"
    assert committed.read_bytes() == path.read_bytes(), (
        f"{rel} drifted from verifier.proto: run python protos/generate.py and commit")


def test_stubs_import_as_one_package():
  from dice.verifier.v1 import verifier_pb2, verifier_pb2_grpc

  assert verifier_pb2.Outcome.Name(verifier_pb2.NO_GPU) == "NO_GPU"
  assert hasattr(verifier_pb2_grpc, "VerifierServicer")
