"""The model benchmarks run end to end at toy shapes on CPU (the GPU runs use the same code)."""

import pathlib
import re
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _run(*args: str) -> str:
  proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc.stdout


@pytest.mark.slow
def test_mfu_benchmark_tiny():
  # two_copy is left out to save CI time: the sharded-step test below runs that objective.
  out = _run(str(BENCHMARKS / "model_mfu.py"), "--tiny", "--steps", "1", "--warmup", "1",
             "--variants", "reference,bidirectional")
  for variant in ("reference", "bidirectional"):
    assert re.search(rf"^{variant}\s+\d+\s+[\d.]+", out, re.M), out
  assert "memory: arguments" in out
  first = re.search(r"first-step loss: reference ([\d.]+), bidirectional ([\d.]+)", out)
  assert first and abs(float(first[1]) - float(first[2])) < 1e-3  # same weights and noise: same loss


@pytest.mark.slow
def test_sharded_step_tiny_on_8_devices():
  out = _run(str(BENCHMARKS / "model_sharded_step.py"), "--tiny", "--cpu-devices", "8", "--mesh", "2,2,2",
             "--steps", "2", "--compare-one-device")
  assert "OK: losses" in out and "Adam mu of gate_proj: P(None, 'fsdp', 'tensor')" in out, out
  sharded = re.search(r"^OK: losses ([\d.]+) -> ([\d.]+)", out, re.M)
  one = re.search(r"^one device: losses ([\d.]+) -> ([\d.]+); .*: same loss$", out, re.M)
  assert sharded and one, out
  assert abs(float(sharded[2]) - float(one[2])) < 1e-4  # the script's own check, read back
  assert re.search(r"^step time: 8 devices [\d.]+ ms, one device [\d.]+ ms; scaling", out, re.M), out
