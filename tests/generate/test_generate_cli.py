"""`dice generate` and KernelGenerator with a tiny random model and a real loopback verifier.

The verifier has no GPU here, so the best a candidate can get is a compile-only NO_GPU verdict,
and nothing may be called verified. The random model writes garbage (format failures); the
injected eval_testlib.LIGHT_RELU is the one candidate that compiles (shared compile cache).
"""

import json
import pathlib
import sys

import pytest

from dice_jax.data.problems import load_problems
from dice_jax.sampler import completion
from dice_jax.sampler.completion import CompletionModel
from dice_jax.sampler.config import DICE_SAMPLING
from dice_jax.generation.generator import KernelGenerator
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.local import free_port
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "eval"))
from eval_testlib import LIGHT_RELU, run_cli, tiny_model_dir, verifier_target  # noqa: E402,F401 (fixtures)

DECODE = ["--max-new-tokens", 16]


def flat(text: str) -> str:
  """Console text with rich's line wrapping undone."""
  return " ".join(text.split())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("generate")
  tiny = load_problems("bundled:tiny")[0]
  (d / "ref.py").write_text(tiny.reference_source)
  (d / "light.py").write_text(LIGHT_RELU)
  (d / "no_inputs.py").write_text(tiny.reference_source.replace("def get_inputs", "def inputs"))
  return d


def test_cli_ranks_samples_with_an_injected_kernel_and_never_says_verified(
    tmp_path, files, tiny_model_dir, verifier_target, capsys):
  out, rep = tmp_path / "ModelNew.py", tmp_path / "result.json"
  rc = run_cli("generate", files / "ref.py", "--model", tiny_model_dir, "--samples", 2, *DECODE,
               "--verifier", verifier_target, "--inject", files / "light.py", "--out", out,
               "--report", rep)
  captured = capsys.readouterr()
  assert rc == 3, captured.err
  printed = flat(captured.out)
  assert "NOTHING IS VERIFIED" in printed and "compiled (unverified)" in printed
  assert "UNVERIFIED (the verifier has no GPU)" in printed
  assert "target sm_90" in flat(captured.err)
  text = out.read_text()
  assert text.startswith("# dice generate: UNVERIFIED") and text.endswith(LIGHT_RELU)
  result = json.loads(rep.read_text())
  assert result["verified"] is False and result["best"] is None
  assert [c["name"] for c in result["candidates"]][0] == "injected 2"
  assert [c["origin"] for c in result["candidates"]].count("sample") == 2
  assert result["candidates"][0]["outcome"] == "NO_GPU"
  prompt = result["messages"][-1]["content"]
  assert "sm_90" in prompt and "fp32" in prompt and "x: float32[16, 256]" in prompt


def test_description_only_mode_compiles_but_never_verifies(tmp_path, files, tiny_model_dir,
                                                           verifier_target, capsys):
  out = tmp_path / "ModelNew.py"
  rc = run_cli("generate", "--description", "elementwise ReLU of a float32 [16, 256] tensor",
               "--model", tiny_model_dir, "--samples", 0, "--inject", files / "light.py",
               "--verifier", verifier_target, "--out", out)
  printed = flat(capsys.readouterr().out)
  assert rc == 3
  assert "Description-only" in printed and "none is verified" in printed
  assert "no reference to compare it with" in out.read_text()


@pytest.mark.parametrize("argv,code,message", [
    (["--arch", "sm_99"], 2, "unknown GPU architecture 'sm_99'"),
    (["--arch", "sm_80"], 2, "verifier runs on sm_90"),
])
def test_architecture_errors(files, tiny_model_dir, verifier_target, capsys, argv, code, message):
  rc = run_cli("generate", files / "ref.py", "--model", tiny_model_dir, "--verifier", verifier_target,
               *argv)
  assert rc == code
  assert message in flat(capsys.readouterr().err)


def test_bad_reference_and_unreachable_verifier(files, tiny_model_dir, capsys):
  rc = run_cli("generate", files / "no_inputs.py", "--model", tiny_model_dir, "--verifier", "127.0.0.1:1")
  assert rc == 2 and "must define Model, get_inputs, get_init_inputs" in flat(capsys.readouterr().err)
  rc = run_cli("generate", files / "ref.py", "--model", tiny_model_dir, "--connect-timeout", 0.5,
               "--verifier", f"127.0.0.1:{free_port()}")
  assert rc == 4 and "cannot reach the verifier" in flat(capsys.readouterr().err)
  rc = run_cli("generate", files / "ref.py", "--description", "x", "--model", tiny_model_dir)
  assert rc == 2


def test_library_samples_in_one_batched_call_and_verifies_repeats_once(files, tiny_model_dir,
                                                                       verifier_target, monkeypatch):
  calls = []
  real_sample = completion.sample

  def spy(model, prompt_ids, *args, **kwargs):
    calls.append(prompt_ids.shape[0])
    return real_sample(model, prompt_ids, *args, **kwargs)

  monkeypatch.setattr(completion, "sample", spy)
  connection = connect_lib.connect(verifier_target)
  try:
    model = CompletionModel(tiny_model_dir)
    with KernelGenerator(model, verifier=connection, precision="fp32",
                         decode=DICE_SAMPLING.replace(gen_length=16)) as gen:
      assert gen.arch == "sm_90"  # taken from the verifier
      before = connection.client.stats().get("sent", 0)
      result = gen.generate(files / "ref.py", num_samples=2, extra_candidates=[LIGHT_RELU, LIGHT_RELU])
      sent = connection.client.stats().get("sent", 0) - before
  finally:
    connection.close()
  assert calls == [2]  # both samples in one sampler call
  assert len(result.candidates) == 4 and not result.verified and result.best is None
  injected = [c for c in result.candidates if c.origin == "injected"]
  assert [c.outcome for c in injected] == ["NO_GPU", "NO_GPU"]
  assert injected[0].verdict.request_id == injected[1].verdict.request_id  # one verification
  samples_sent = sum(1 for c in result.candidates if c.origin == "sample" and c.source is not None)
  assert sent <= samples_sent + 1
  assert result.winner()[0] is injected[0] and result.winner()[1] is False


@pytest.mark.gpu
def test_on_a_gpu_the_injected_kernel_is_verified_and_written(tmp_path, files, tiny_model_dir,
                                                              verifier_target, capsys):
  out, rep = tmp_path / "ModelNew.py", tmp_path / "result.json"
  rc = run_cli("generate", files / "ref.py", "--model", tiny_model_dir, "--samples", 2, *DECODE,
               "--verifier", verifier_target, "--inject", files / "light.py", "--out", out,
               "--report", rep)
  captured = capsys.readouterr()
  print(captured.out)
  assert rc == 0, captured.err
  result = json.loads(rep.read_text())
  assert result["verified"] is True
  best = result["candidates"][0]
  assert best["origin"] == "injected" and best["outcome"] == "OK"
  assert out.read_text().endswith(LIGHT_RELU) and "UNVERIFIED" not in out.read_text()
