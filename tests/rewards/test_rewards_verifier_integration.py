"""The reward path against the REAL verifier: `dice-verifier serve` started as a subprocess on
loopback, real static checks and real nvcc compiles (compiled candidates end NO_GPU here and are
run on a GPU host). Completions go through extraction, phase-1 assembly, the client and the shaper.

The compile cache is the verifier's default ($DICE_VERIFIER_CACHE or ~/.cache/dice-verifier), so
a warm machine compiles each tiny kernel once; a cold one first builds the precompiled header.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import problems as P
from dice_jax.data import rl_data
from dice_jax.rewards import candidates
from dice_jax.rewards import defaults as D
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.channels import ClientConfig
from dice_jax.verifier.sync_client import VerifierClient
from verifier_fakes import free_port

STARTUP_S = 120


def _entry_point() -> list[str]:
  """`dice-verifier`'s own module: works for editable installs and for PYTHONPATH-only hosts."""
  return [sys.executable, "-m", "verifier_service.cli"]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
  """(client, address) for a real verifier subprocess; stops it afterwards."""
  port = free_port()
  log = tmp_path_factory.mktemp("verifier") / "serve.log"
  with open(log, "wb") as out:
    process = subprocess.Popen([*_entry_point(), "serve", "--listen", f"127.0.0.1:{port}",
                                "--plain-logs", "--log-level", "INFO"],
                               stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
  address = f"127.0.0.1:{port}"
  client = VerifierClient(ClientConfig(targets=(address,), connect_timeout_s=2.0,
                                       request_timeout_s=840.0, max_attempts=2))
  try:
    deadline = time.monotonic() + STARTUP_S
    while True:
      if process.poll() is not None:
        pytest.fail(f"dice-verifier exited with {process.returncode}:\n{log.read_text()[-3000:]}")
      if isinstance(client.info()[address], pb.ServerInfo):
        break
      if time.monotonic() > deadline:
        pytest.fail(f"dice-verifier did not answer within {STARTUP_S}s:\n{log.read_text()[-3000:]}")
      time.sleep(0.5)
    yield client, address
  finally:
    client.close()
    process.terminate()
    try:
      process.wait(timeout=40)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


@pytest.fixture(scope="module")
def relu():
  return next(p for p in P.load_bundled() if p.id == "tiny_relu")


def _columns(problem, phase, n):
  return rl_data.collate([rl_data.make_item(problem, phase)], repeat=n)


def _has_gpu(client, address) -> bool:
  return len(client.info()[address].gpus) > 0


def test_server_info_picks_the_reward_preset(verifier):
  """Without a GPU the tiny config scores compile-only; with one, the full default preset."""
  client, address = verifier
  info = client.info()[address]
  assert info.environment.nvcc_version and info.environment.torch_version
  expected = "default" if _has_gpu(client, address) else "compile_only"
  connection = connect_lib.connect(address)  # the trainer's preflight
  try:
    assert D.resolve_preset("auto", connection.has_gpu) == expected
  finally:
    connection.close()


def test_static_rejections_and_format_failures(verifier, relu):
  client, _ = verifier
  no_kernel = relu.middle.replace("__global__ void relu_kernel", "void relu_kernel").replace(
      "relu_kernel<<<blocks, threads>>>(", "relu_kernel(")
  phase1 = [f"```python\n{no_kernel}\n```",       # assembled, but its CUDA has no __global__ kernel
            "Sorry, I cannot write this kernel."]   # no code: a local format verdict
  torch_only = "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n" \
               "    def forward(self, x):\n        return torch.relu(x)\n```"
  submit = candidates.submit_completions
  verdicts = submit(client, phase1, **_columns(relu, 1, 2)).result(timeout=300)
  verdicts += submit(client, [torch_only], **_columns(relu, 2, 1)).result(timeout=300)
  outcomes = [pb.Outcome.Name(v.outcome) for v in verdicts]
  assert outcomes == ["REJECTED", "REJECTED", "REJECTED"], [v.message for v in verdicts]
  assert verdicts[0].stage == pb.STAGE_STATIC_CHECK and verdicts[0].request_id  # from the server
  assert verdicts[1].message.startswith("format: ") and not verdicts[1].request_id  # local
  assert verdicts[2].stage in (pb.STAGE_PARSE, pb.STAGE_STATIC_CHECK) and verdicts[2].request_id
  # The verifier reports a CUDA string without kernels as NO_CUSTOM_KERNEL_LAUNCHED: a hack, zeroed.
  assert [pb.Exploit.Name(e.kind) for e in verdicts[0].exploits] == ["NO_CUSTOM_KERNEL_LAUNCHED"]
  result = D.preset("compile_only")([""] * 3, phase1 + [torch_only], verdicts, phase=[1, 1, 2])
  assert result.hacked.tolist() == [True, False, False]
  # REJECTED candidates earn nothing, not even format credit (no reward for a PyTorch-only ModelNew).
  np.testing.assert_allclose(result.total, [0.0, 0.0, 0.0])
  assert result.components["format"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_compiled_candidate_and_broken_cuda(verifier, relu):
  """NO_GPU here (OK on a GPU host) for the known-good middle; COMPILE_ERROR for broken CUDA."""
  client, address = verifier
  gpu = _has_gpu(client, address)
  # Without `#include <torch/extension.h>` (load_inline includes torch/types.h itself), a failed
  # build is final at once; with it the verifier re-checks the error with the heavy header.
  broken = relu.middle.replace("out[i] = v > 0.0f ? v : 0.0f;", "out[i] = v > 0.0f ? v : undeclared;")
  broken = broken.replace("#include <torch/extension.h>\n", "")
  completions = [f"Here it is:\n```python\n{relu.middle}\n```", f"```python\n{broken}\n```"]
  submit = candidates.submit_completions
  start = time.monotonic()
  verdicts = submit(client, completions, **_columns(relu, 1, 2)).result(timeout=860)
  elapsed = time.monotonic() - start
  good, bad = verdicts
  assert good.outcome == (pb.OK if gpu else pb.NO_GPU), good.message
  assert good.compile.compiled and list(good.compile.kernel_names) == ["relu_kernel"]
  assert bad.outcome == pb.COMPILE_ERROR and bad.stage == pb.STAGE_COMPILE, bad.message
  assert "undeclared" in bad.compile.log
  result = D.preset("compile_only")([""] * 2, completions, verdicts, phase=[1, 1])
  np.testing.assert_allclose(result.total, [1.2, 0.2])
  default = D.preset("default")([""] * 2, completions, verdicts, phase=[1, 1])
  assert default.valid.tolist() == [gpu, True]  # NO_GPU is never scored as incorrect
  # A repeat is answered from the client's cache, not recompiled.
  sent = client.stats()["sent"]
  again = submit(client, completions[:1], **_columns(relu, 1, 1)).result(timeout=60)
  assert again[0].outcome == good.outcome and client.stats()["sent"] == sent
  print(f"\nreal verifier: {pb.Outcome.Name(good.outcome)} + COMPILE_ERROR verdicts in {elapsed:.1f}s")


@pytest.mark.gpu
def test_bundled_known_good_candidates_are_ok_on_a_gpu(verifier):
  """Device machine: every bundled tiny problem's known-good candidate is correct (OK)."""
  client, _ = verifier
  problems = P.load_bundled()
  completions = [f"```python\n{p.middle}\n```" for p in problems]
  columns = rl_data.collate([rl_data.make_item(p, 1) for p in problems])
  verdicts = candidates.submit_completions(client, completions, **columns).result(timeout=860)
  for p, v in zip(problems, verdicts):
    assert v.outcome == pb.OK, (p.id, pb.Outcome.Name(v.outcome), v.message)
    assert v.timing.speedup > 0
  result = D.preset("default")([""] * len(problems), completions, verdicts, **columns)
  assert result.valid.all() and (result.total >= 0.8).all()  # 0.1 + 0.2 + 1.0 - 0.5 at worst
