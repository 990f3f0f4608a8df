"""`dice-verifier` as a user runs it: real subprocesses, real compiles (cached across tests)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service import cli

import verifier_kernels as kernels


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "verifier_service.cli", *args],
                        capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def files(tmp_path):
  paths = {}
  for name, text in [("ref.py", kernels.REFERENCE), ("good.py", kernels.cuda_candidate()),
                     ("broken.py", kernels.BROKEN_CUDA), ("nomodel.py", "import torch\n")]:
    paths[name] = tmp_path / name
    paths[name].write_text(text)
  return paths


def test_help_explains_every_flag():
  parser = cli.build_parser()
  subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # pylint: disable=protected-access
  for name in ("serve", "check"):
    sub = subparsers.choices[name]
    for action in sub._actions:  # pylint: disable=protected-access
      assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    text = sub.format_help()
    for flag in ("--gpus", "--slots-per-gpu", "--compile-workers", "--cpu-test-mode"):
      assert flag in text
  assert "--listen" in subparsers.choices["serve"].format_help()
  assert "--json" in subparsers.choices["check"].format_help()
  assert "Exit codes" in parser.format_help()


def test_exit_code_policy():
  verdict = lambda outcome: pb.Verdict(outcome=outcome)
  assert cli.exit_code([verdict(pb.OK)]) == 0
  assert cli.exit_code([verdict(pb.OK), verdict(pb.INCORRECT)]) == 1
  assert cli.exit_code([verdict(pb.NO_GPU)]) == 3
  assert cli.exit_code([verdict(pb.NO_GPU), verdict(pb.REJECTED)]) == 1
  assert cli.exit_code([verdict(pb.INCORRECT), verdict(pb.INFRA_ERROR)]) == 4


def test_check_one_candidate_json(files, cache_dir):
  proc = run_cli("check", str(files["ref.py"]), str(files["good.py"]), "--json",
                 "--cache-dir", str(cache_dir))
  assert proc.returncode == cli.EXIT_NO_GPU, proc.stderr[-3000:]
  verdict = json.loads(proc.stdout)
  assert verdict["outcome"] == "NO_GPU"
  assert verdict["compile"]["compiled"] is True
  assert verdict["compile"]["kernel_names"] == ["scaled_add_kernel"]


def test_check_several_candidates_prints_a_summary(files, cache_dir):
  proc = run_cli("check", str(files["ref.py"]), str(files["good.py"]), str(files["broken.py"]),
                 str(files["nomodel.py"]), "--cache-dir", str(cache_dir))
  assert proc.returncode == cli.EXIT_FAILED, proc.stderr[-3000:]
  for text in ("good.py", "NO_GPU", "COMPILE_ERROR", "REJECTED", "does not define ModelNew"):
    assert text in proc.stdout


def test_check_unreadable_inputs_are_usage_errors(files, tmp_path):
  missing = run_cli("check", str(files["ref.py"]), str(tmp_path / "nope.py"))
  assert missing.returncode == cli.EXIT_USAGE
  assert "cannot read" in missing.stderr
  latin = tmp_path / "latin1.py"
  latin.write_bytes(b"# caf\xe9\n")
  binary = run_cli("check", str(files["ref.py"]), str(latin))
  assert binary.returncode == cli.EXIT_USAGE
  assert "not UTF-8" in binary.stderr


def test_serve_refuses_open_listen_without_token():
  proc = run_cli("serve", "--listen", "0.0.0.0:0", timeout=120)
  assert proc.returncode == cli.EXIT_USAGE
  assert "without --auth-token-file" in proc.stderr
