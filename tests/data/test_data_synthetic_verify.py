"""The synthetic known-good answers through the REAL verifier (static checks, nvcc, and on a GPU host
the correctness trials): no answer may teach the model a kernel that does not build or is wrong.

Every test here is slow or gpu: the first compile of a session builds the verifier's precompiled
header and light-header environments (over a minute on a 2-core machine).

- `test_sample_of_answer_files_compiles` (slow): one known-good file per scaffold kind (element-wise,
  activation, bias + activation, reduction to a value, reduction of rows), each exactly as a
  policy writing the right answer would be graded. Here: compiled, NO_GPU; on a GPU host: OK.
- `test_every_answer_compiles` (slow): every distinct answer's CUDA, many answers per translation
  unit (each in its own namespace, with a C++ wrapper per host function): one nvcc run per batch
  instead of one per answer, since parsing torch's headers is most of a compile. A batch holding
  one broken answer must fail, so batching cannot hide an error.
- `test_answers_are_correct_on_a_gpu` (gpu): one verdict per known-good file, correctness only, all
  OK: every held-out and unseen-op problem (what evaluation scores against) and every training
  problem that is not a length-3 or length-4 chain, plus every tenth of those (by id hash): about
  400 verdicts, a few minutes on one H200 box, where all ~1,560 would take over ten.

The server runs in-process (tests/verifier/verifier_harness.py) with the verifier's default compile
cache ($DICE_VERIFIER_CACHE, else ~/.cache/dice-verifier), as tests/rewards' integration test does:
the cache is content-addressed, so a warm machine rebuilds nothing, and on the GPU host the same
cache then serves benchmarks/rl_learning.py (every known-good answer already built).
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
import sys

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import problems as P
from verifier_service.compile import toolchain as toolchain_lib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "verifier"))
import verifier_harness  # noqa: E402  pylint: disable=wrong-import-position

ALL = "synthetic:all?split=all"
_BATCH = 200  # answers per translation unit: ~8 nvcc runs for the ~1,560 answers
_HEAD, _TAIL = 'source = """\n', '\n"""'


def _has_gpu() -> bool:
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return torch.cuda.is_available()


@pytest.fixture(scope="module")
def verifier():
  config = verifier_harness.make_config(toolchain_lib.default_cache_dir(), compile_workers=os.cpu_count() or 2,
                                        queue_capacity=4096, run_timeout_s=300.0, slots_per_gpu=4)
  srv = verifier_harness.ServerThread(config, toolchain_lib.discover(), grpc_server=False)
  yield srv
  srv.stop()


def _verify_all(srv, pairs: list[tuple[str, str, str]], **options) -> list[pb.Verdict]:
  requests = [pb.VerifyRequest(request_id=f"synthetic:{name}", reference_source=ref, candidate_source=cand,
                               options=pb.VerifyOptions(**options)) for name, ref, cand in pairs]
  with concurrent.futures.ThreadPoolExecutor(min(64, len(requests))) as pool:
    return list(pool.map(srv.verify, requests))


def _kind(p: P.Problem) -> str:
  family = p.id.split("_")[1]
  if family == "reduction":
    return "reduction_rows" if "empty_like" in p.middle else "reduction_value"
  return family


@pytest.mark.slow
def test_sample_of_answer_files_compiles(verifier):
  problems = P.load_problems(ALL)
  sample = {}
  for p in problems:  # hash order: the first problem of each scaffold kind
    sample.setdefault(_kind(p), p)
  assert set(sample) == {"elementwise", "activation", "bias", "reduction_value", "reduction_rows"}
  verdicts = _verify_all(verifier, [(p.id, p.reference_source, p.known_good) for p in sample.values()],
                         skip_timing=True)
  expected = pb.OK if _has_gpu() else pb.NO_GPU
  for p, v in zip(sample.values(), verdicts):
    assert v.outcome == expected, (p.id, pb.Outcome.Name(v.outcome), v.message, v.compile.log[-2000:])
    assert v.compile.compiled and list(v.compile.kernel_names) == ["k"], p.id


def batched_candidate(problems: list[P.Problem], *, name: str) -> str:
  """One load_inline candidate holding every answer's CUDA, each in `namespace s<i>`; the C++ side
  wraps each host function `s<i>::f` as `f<i>`, and ModelNew calls the first problem's."""
  sources, declarations, functions = [], [], []
  for i, p in enumerate(problems):
    assert p.middle.startswith(_HEAD) and p.middle.endswith(_TAIL), p.id
    cuda = p.middle[len(_HEAD):-len(_TAIL)]
    params = re.search(r"^torch::Tensor f\(([^)]*)\)", cuda, re.M).group(1)
    args = ", ".join(a.split()[-1] for a in params.split(","))
    sources.append(f"namespace s{i} {{\n{cuda}\n}}  // {p.id}")
    declarations.append(f"namespace s{i} {{ torch::Tensor f({params}); }}\n"
                        f"torch::Tensor f{i}({params}) {{ return s{i}::f({args}); }}")
    functions.append(f"f{i}")
  first = problems[0]
  model_new = first.suffix[first.suffix.index("class ModelNew"):].replace("ext.f(", "ext.f0(")
  return (first.prefix + _HEAD + "\n\n".join(sources) + _TAIL + '\n\ncpp_src = """\n' + "\n".join(declarations)
          + '\n"""\n\n' + f"ext = load_inline(name={name!r}, cpp_sources=cpp_src, cuda_sources=source, "
          f"functions={functions!r})\n\n\n" + model_new)


@pytest.mark.slow
def test_every_answer_compiles(verifier):
  distinct = {}
  for p in P.load_problems(ALL):
    distinct.setdefault(p.middle, p)
  answers = sorted(distinct.values(), key=lambda p: p.id)
  batches = [answers[i:i + _BATCH] for i in range(0, len(answers), _BATCH)]
  broken = batches[0][:3]
  broken[1] = P.Problem(broken[1].id, broken[1].reference_source, prefix=broken[1].prefix,
                        middle=broken[1].middle.replace("o[i] = ", "o[i] = undeclared_name + ", 1),
                        suffix=broken[1].suffix)
  pairs = [(f"batch{j}", b[0].reference_source, batched_candidate(b, name=f"synthetic_batch{j}"))
           for j, b in enumerate(batches + [broken])]
  verdicts = _verify_all(verifier, pairs, skip_timing=True)
  for batch, v in zip(batches, verdicts):
    ids = f"{batch[0].id} .. {batch[-1].id}"
    assert v.compile.compiled, (ids, pb.Outcome.Name(v.outcome), v.message, v.compile.log[-3000:])
  control = verdicts[-1]
  assert control.outcome == pb.COMPILE_ERROR and "undeclared_name" in control.compile.log, control.message
  assert sum(len(b) for b in batches) == len(distinct)


def _gpu_sample(problems: list[P.Problem]) -> list[P.Problem]:
  import hashlib  # pylint: disable=import-outside-toplevel
  from dice_jax.data import synthetic  # pylint: disable=import-outside-toplevel
  meta = {r["id"]: r for r in synthetic.records(ALL)}

  def wanted(p: P.Problem) -> bool:
    long_chain = p.id.startswith("syn_elementwise_") and p.id.count("-") >= 2
    return (meta[p.id]["split"] in ("heldout", "unseen_op") or not long_chain
            or hashlib.sha256(p.id.encode()).digest()[0] % 10 == 0)
  return [p for p in problems if wanted(p)]


@pytest.mark.gpu
def test_answers_are_correct_on_a_gpu(verifier):
  problems = _gpu_sample(P.load_problems(ALL))
  verdicts = _verify_all(verifier, [(p.id, p.reference_source, p.known_good) for p in problems], skip_timing=True)
  wrong = [(p.id, pb.Outcome.Name(v.outcome), v.message[:300]) for p, v in zip(problems, verdicts)
           if v.outcome != pb.OK]
  assert not wrong, f"{len(wrong)} of {len(problems)} known-good answers are not OK: {wrong[:10]}"
