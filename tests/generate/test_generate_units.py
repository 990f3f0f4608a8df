"""Pieces of `dice generate` that need no verifier: shapes, architectures, ranking, prompts, results."""

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import prompts
from dice_jax.data.problems import ProblemLoadError, load_problems
from dice_jax.generation import arch, prompting, shapes
from dice_jax.generation.generator import GenerationResult, read_reference
from dice_jax.generation.ranking import INJECTED, SAMPLE, Candidate, best_compiled, best_verified, rank
from dice_jax.rewards.candidates import format_verdict

REFERENCE = '''
import torch
import torch.nn as nn

batch, dim = 16, 4 * 64
shape = (3, 5)

class Model(nn.Module):
    def forward(self, x, idx, y, z, s, w):
        return x

def get_inputs():
    y = torch.rand(*shape).half()
    return [torch.randn(batch, dim), torch.randint(0, 10, (batch,)), y,
            torch.randn(batch, dim, dtype=torch.bfloat16) * 2 - 1, 0.5, make_input()]

def get_init_inputs():
    return []
'''


def test_shapes_are_read_statically_with_forward_names():
  specs = shapes.input_specs(REFERENCE)
  assert [s.describe() for s in specs] == [
      "x: float32[16, 256]", "idx: int64[16]", "y: float16[3, 5]", "z: bfloat16[16, 256]",
      "s: float = 0.5", "w: not derivable statically (`make_input()`)"]
  assert shapes.describe_inputs(REFERENCE, "fp16").startswith("x: float16[16, 256]; idx: int64[16]")
  with pytest.raises(ValueError, match="no get_inputs"):
    shapes.input_specs("class Model: pass\n")
  with pytest.raises(ValueError, match="list or tuple literal"):
    shapes.input_specs("def get_inputs():\n    return helper()\n")
  huge = "n = 2 ** 10 ** 9\ndef get_inputs():\n    return [torch.randn(n)]\n"
  assert shapes.input_specs(huge)[0].tensor is None  # refused, not computed


def test_shapes_of_the_dice_data_are_mostly_derivable(shared_dir):
  problems = load_problems(shared_dir / "data/dice/kernel_infilling_evaluation.json")
  specs = [shapes.input_specs(p.reference_source) for p in problems]
  full = sum(all(s.tensor is not None or s.scalar is not None for s in ss) for ss in specs)
  assert full >= 0.95 * len(problems)
  assert shapes.describe_inputs(problems[0].reference_source) == "x: float32[64, 16, 32, 32, 32]"


def test_architectures_known_buildable_and_matching_the_verifier():
  assert arch.parse("sm_90a") == (90, "a")
  assert arch.describe("sm_90") == "sm_90 (Hopper: H100, H200, GH200)"
  for bad in ("sm_99", "ampere", "sm90", "", "sm_9"):
    with pytest.raises(arch.ArchError, match="unknown GPU architecture"):
      arch.parse(bad)
  arch.check_toolchain("sm_90", "13.0.88")
  with pytest.raises(arch.ArchError, match="support ended with CUDA 12.9"):
    arch.check_toolchain("sm_70", "13.0.88")
  with pytest.raises(arch.ArchError, match="needs nvcc 12.8"):
    arch.check_toolchain("sm_100", "12.4.131")
  assert arch.check_arch("sm_90a", ["sm_90"], ["13.0.88"]) == "sm_90a"
  with pytest.raises(arch.ArchError, match="verifier runs on sm_90.*arch='sm_90'"):
    arch.check_arch("sm_80", ["sm_90"])


def verdict(outcome, speedup=None, max_err=None, exploits=()):
  v = pb.Verdict(request_id="r", outcome=outcome, message=pb.Outcome.Name(outcome),
                 stage=pb.STAGE_DONE if outcome == pb.OK else pb.STAGE_LOAD)
  if outcome in (pb.OK, pb.INCORRECT, pb.NO_GPU):
    v.compile.compiled = True
  if speedup is not None:
    v.timing.speedup = speedup
  if max_err is not None:
    v.trials.add(seed=1, passed=outcome == pb.OK, max_abs_error=max_err)
  for kind in exploits:
    v.exploits.add(kind=kind)
  return v


def test_ranking_correct_then_fastest_then_how_far_it_got():
  c = [Candidate(0, SAMPLE, "s0", verdict(pb.COMPILE_ERROR)),
       Candidate(1, SAMPLE, "s1", verdict(pb.OK, 1.5, 1e-5)),
       Candidate(2, SAMPLE, None, format_verdict("format: nothing")),
       Candidate(3, SAMPLE, "s3", verdict(pb.OK, 900.0, 1e-6, [pb.IMPLAUSIBLE_SPEEDUP])),
       Candidate(4, SAMPLE, "s4", verdict(pb.OK, 2.5, 1e-5)),
       Candidate(5, SAMPLE, "s5", verdict(pb.OK, None, 1e-7)),
       Candidate(6, SAMPLE, "s6", verdict(pb.INCORRECT, None, 0.3)),
       Candidate(7, INJECTED, "ref", verdict(pb.OK, 2.5, 1e-6)),
       Candidate(8, SAMPLE, "s8", verdict(pb.NO_GPU)),
       Candidate(9, SAMPLE, "s9", verdict(pb.INFRA_ERROR))]
  order = [x.index for x in rank(c)]
  # 2.5x ties go to the smaller error (the injected one); untimed correct after timed; FLAGGED
  # (implausible speedup) is not correct; then NO_GPU, INCORRECT, COMPILE_ERROR, FORMAT, INFRA.
  assert order == [7, 4, 1, 5, 3, 8, 6, 0, 2, 9]
  ranked = rank(c)
  assert best_verified(ranked).index == 7 and best_verified(ranked).name == "injected 7"
  assert best_verified(rank([c[0], c[3], c[8]])) is None
  assert best_compiled(rank([c[0], c[8], c[2]])).index == 8


def _result(cands, available, mode="reference"):
  ranked = rank(cands)
  return GenerationResult(mode=mode, candidates=ranked, best=best_verified(ranked) if available else None,
                          arch="sm_90", precision="fp32", correctness_available=available,
                          messages=[], notes=[])


def test_results_write_the_verified_winner_or_say_unverified(tmp_path):
  good = Candidate(0, SAMPLE, "print('fast')\n", verdict(pb.OK, 3.0, 1e-6))
  result = _result([good, Candidate(1, SAMPLE, "x", verdict(pb.INCORRECT))], True)
  assert result.verified and result.verdict.timing.speedup == 3.0 and len(result.others) == 1
  assert result.write(tmp_path / "a.py").read_text() == "print('fast')\n"
  none = _result([Candidate(0, SAMPLE, "x", verdict(pb.INCORRECT))], True)
  with pytest.raises(ValueError, match="none was proven correct"):
    none.write(tmp_path / "b.py")
  compiled = _result([Candidate(0, SAMPLE, "k\n", verdict(pb.NO_GPU))], False, mode="description")
  assert not compiled.verified and compiled.winner()[1] is False
  text = compiled.write(tmp_path / "c.py").read_text()
  assert text.startswith("# dice generate: UNVERIFIED") and "no reference" in text and text.endswith("k\n")
  # Description-only on a GPU verifier: a candidate that imported and stopped at the placeholder
  # reference (BAD_REFERENCE) is handed out before one whose import crashed (RUNTIME_ERROR).
  crashed = Candidate(0, SAMPLE, "crash", verdict(pb.RUNTIME_ERROR))
  imported = Candidate(1, SAMPLE, "fine", verdict(pb.BAD_REFERENCE))
  assert _result([crashed, imported], False, mode="description").winner() == (imported, False)


def test_prompts_carry_target_shapes_and_accept_templates():
  tiny = load_problems("bundled:tiny")[0]
  user = prompting.reference_messages(tiny.reference_source, arch="sm_90", precision="fp16")[-1]["content"]
  assert "architecture sm_90" in user and "fp16" in user
  assert "Input shapes and dtypes: x: float16[16, 256]." in user and "class Model" in user
  custom = prompts.PromptTemplate(user="{arch}|{precision}|{shapes}", system=None)
  assert prompting.reference_messages(tiny.reference_source, arch="sm_80", precision="bf16",
                                      template=custom) == [
      {"role": "user", "content": "sm_80|bf16|x: bfloat16[16, 256]"}]
  described = prompting.description_messages("row-wise softmax", arch="sm_90", precision="fp32")
  assert "row-wise softmax" in described[-1]["content"] and "sm_90" in described[-1]["content"]
  with pytest.raises(ValueError, match="description is empty"):
    prompting.description_messages("  ", arch=None, precision=None)


def test_references_are_checked_before_anything_runs(tmp_path):
  tiny = load_problems("bundled:tiny")[0]
  path = tmp_path / "ref.py"
  path.write_text(tiny.reference_source)
  assert read_reference(path) == read_reference(str(path)) == tiny.reference_source
  no_inputs = tiny.reference_source.replace("def get_inputs", "def make_inputs")
  with pytest.raises(ProblemLoadError, match="missing get_inputs"):
    read_reference(no_inputs)
  with pytest.raises(ValueError, match="cannot read the reference"):
    read_reference(tmp_path / "absent.py")
