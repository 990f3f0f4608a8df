"""The program cache's key (service/text_key.py): layout and comments aside, nothing else; checked
against the C preprocessor itself; and a real server answering a reformatted candidate with the
verdict already given, without compiling or running it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import shutil
import subprocess
import time

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import problems as problems_lib

from verifier_service.service import text_key

import verifier_harness
import verifier_kernels as kernels

_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """{cuda}"""

cpp_src = "torch::Tensor f(torch::Tensor x);"
ext = load_inline(name="ext", cpp_sources=cpp_src, cuda_sources=source, functions=["f"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
'''
_CUDA = """
#define S(x) #x
__global__ void k(const float* x, float* o, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = x[i] * 2.0f;
}
torch::Tensor f(torch::Tensor x) {
    auto o = torch::empty_like(x);
    k<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), o.data_ptr<float>(), x.numel());
    return o;
}
"""


def key(cuda: str = _CUDA, python: str = _CANDIDATE, reference: str = "ref",
        options: bytes = b"") -> str | None:
  return text_key.candidate_key(reference, python.replace("{cuda}", cuda), options)


@pytest.mark.parametrize("name, cuda", [
    ("line comments", _CUDA.replace("* 2.0f;", "* 2.0f;  // twice").replace(
        "#define S(x) #x", "#define S(x) #x  // a helper", 1)),
    ("block comment", _CUDA.replace("* 2.0f", "/* twice */ * 2.0f")),
    ("block comment over lines", _CUDA.replace("int i", "/* the\n index */ int i")),
    ("indentation and spaces", _CUDA.replace("    ", "\t").replace(" = ", "   =   ")),
    ("trailing spaces", _CUDA.replace(";\n", ";   \n")),
])
def test_comments_and_layout_do_not_change_the_key(name, cuda):
  base = _CUDA.replace("int i", "/* one\n two */ int i") if "over lines" in name else _CUDA
  assert key(cuda) == key(base), name


@pytest.mark.parametrize("name, cuda", [
    ("a constant", _CUDA.replace("2.0f", "3.0f")),
    ("a string literal's spaces", _CUDA.replace("#define S(x) #x",
                                                 '#define S(x) #x\nconst char* t = "a  b";')),
    ("whitespace between tokens that stringification sees",
     _CUDA.replace("#define S(x) #x", '#define S(x) #x\nconst char* t = S(a+b);')),
    ("a removed line (__LINE__ moves)", _CUDA.replace("\n#define S(x) #x", "#define S(x) #x")),
    ("a spliced line", _CUDA.replace("float* o,", "float* o\\\n  ,")),
    ("a header name", '#include <a  b.h>\n' + _CUDA),
])
def test_every_change_of_program_changes_the_key(name, cuda):
  base = {"a string literal's spaces": _CUDA.replace(
      "#define S(x) #x", '#define S(x) #x\nconst char* t = "a b";'),
          "whitespace between tokens that stringification sees": _CUDA.replace(
              "#define S(x) #x", '#define S(x) #x\nconst char* t = S(a + b);'),
          "a spliced line": _CUDA.replace("float* o,", "float* o\\\n,"),
          "a header name": '#include <a b.h>\n' + _CUDA}.get(name, _CUDA)
  assert key(cuda) != key(base), name


def test_python_layout_counts_for_nothing_and_its_literals_for_everything():
  relaid = _CANDIDATE.replace("class ModelNew", "# the candidate\n\nclass ModelNew").replace(
      "        return", "        # one call\n        return")
  assert key(python=relaid) == key()
  assert key(python=_CANDIDATE.replace('name="ext"', 'name="ext2"')) != key()
  assert key(python=_CANDIDATE.replace("return ext.f(x)", "return ext.f(x) * 1")) != key()
  assert key(reference="other") != key() and key(options=b"\x08\x03") != key()
  assert key(python="def broken(:\n") is None


def test_a_source_read_elsewhere_is_compared_as_written():
  """`source` also reaches Python code other than load_inline: its text may matter there."""
  uses = _CANDIDATE.replace("cpp_src =", "SIZE = len(source)\ncpp_src =")
  assert key(_CUDA.replace("if (i < n)", "if (i < n)  // bounds"), uses) != key(_CUDA, uses)
  concatenated = _CANDIDATE.replace("cuda_sources=source", "cuda_sources=source + '\\n'")
  assert key(_CUDA + "// end", concatenated) != key(_CUDA, concatenated)


@pytest.mark.parametrize("text", [
    "int x = 1'000'000; // separators",            # a digit separator: not a char literal
    'const char* s = R"(a  /* b */ c)";  // raw',  # raw strings kept as they are
    "#define M(a) \\\n  a /* spliced */ + 1\n",    # continued lines copied as written
    "int a; /* open",                              # unterminated
    "x = '??/';",                                  # a trigraph
])
def test_what_cannot_be_read_for_certain_is_kept(text):
  reduced = text_key.normalise_c(text)
  if "R\"" in text:  # a raw string is a literal: its spaces and comment marks stay
    assert reduced == 'const char* s = R"(a  /* b */ c)"; '
  else:
    assert reduced == text


def _tokens(text: str) -> list[str]:
  """The preprocessor's output as tokens: literals whole, everything else split on spaces."""
  out = subprocess.run(["cpp", "-P", "-x", "c++", "-std=c++17", "-"], input=text,
                       capture_output=True, text=True, check=True).stdout
  return re.findall(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|\S+', out)


_TRICKY = r'''
#define S(x) #x
#define CAT(a, b) a##b
#define M(a, b) \
    ((a) +   (b))   /* sum */
const char* t0 = S(  a   +   b  );   // runs of spaces: one in the string
const char* t1 = "keep  these   spaces // and this";
int CAT(x,   y) = __LINE__;   /* a block
   comment over lines */ int after = __LINE__;
char c = '"'; char d = '\'';
const char* r = R"raw(  kept /* as */ is  )raw";
int   z   =   M(1,2);
'''


@pytest.mark.skipif(shutil.which("cpp") is None, reason="needs the C preprocessor (cpp)")
def test_the_preprocessor_sees_the_same_program():
  """Checked, not assumed: the reduced text and the original preprocess to the same tokens, on a
  text made of the hard cases and on the CUDA of every synthetic problem."""
  assert _tokens(text_key.normalise_c(_TRICKY)) == _tokens(_TRICKY)
  for problem in problems_lib.load_problems("synthetic:all?split=all&limit=40"):
    cuda = problem.middle.split('"""')[1]
    relaid = "\n".join("  " + line + "   // note" if line.strip() and not line.rstrip().endswith(
        "\\") else line for line in cuda.split("\n"))
    assert _tokens(text_key.normalise_c(cuda)) == _tokens(cuda), problem.id
    assert text_key.normalise_c(relaid) == text_key.normalise_c(cuda), problem.id


def _request(request_id: str, candidate: str, **options) -> pb.VerifyRequest:
  return pb.VerifyRequest(request_id=request_id, reference_source=kernels.REFERENCE,
                          candidate_source=candidate, options=pb.VerifyOptions(**options))


def _relaid(candidate: str) -> str:
  """The same program: comments added in the CUDA source and in Python, lines re-indented."""
  out = candidate.replace("class ModelNew", "# the candidate\n\nclass ModelNew", 1)
  return out.replace("{\n", "{   /* x */\n").replace("\n  int ", "\n\t int ")


@pytest.fixture(scope="module")
def program_server(cache_dir, toolchain):
  """Compile-only, with the program cache on (the other tests' servers have it off)."""
  srv = verifier_harness.ServerThread(
      verifier_harness.make_config(cache_dir, program_cache_size=100), toolchain)
  yield srv
  srv.stop()


def test_a_server_answers_the_same_program_without_compiling_it_again(program_server):
  """The second layout of a program gets the first's verdict under its own id, without a
  compile; a change of program does not; two layouts sent at once run once."""
  stub = program_server.stub()
  scheduler = program_server.scheduler
  candidate = kernels.cuda_candidate()
  first = stub.Verify(_request("program-1", candidate), timeout=900)
  assert first.outcome == pb.NO_GPU, first.message
  builds = lambda: {k: v for k, v in scheduler.compiler.stats().items() if k in ("hits", "misses")}
  compiles = builds()
  hits = scheduler.program_cache_hits
  relaid = stub.Verify(_request("program-2", _relaid(candidate)), timeout=60)
  assert (relaid.request_id, relaid.outcome) == ("program-2", pb.NO_GPU)
  assert not relaid.stage_timings  # nothing ran for it
  assert relaid.compile.kernel_names == first.compile.kernel_names
  assert scheduler.program_cache_hits == hits + 1 and builds() == compiles
  assert stub.Verify(_request("program-2", _relaid(candidate)), timeout=60) == relaid  # resent
  changed = stub.Verify(_request("program-3", candidate.replace(
      "class ModelNew(nn.Module):", "class ModelNew(nn.Module):\n    '''other'''")), timeout=900)
  assert changed.stage_timings and scheduler.program_cache_hits == hits + 1
  with concurrent.futures.ThreadPoolExecutor(2) as pool:  # other options: nothing cached yet
    both = list(pool.map(lambda rid: stub.Verify(_request(
        rid, _relaid(candidate) if rid.endswith("b") else candidate, num_correctness_trials=3),
        timeout=900), ["together-a", "together-b"]))
  assert sorted(len(v.stage_timings) > 0 for v in both) == [False, True]
  assert {v.outcome for v in both} == {pb.NO_GPU} and scheduler.program_cache_hits == hits + 2


def test_a_fault_in_the_key_costs_the_request_only_the_cache(program_server, monkeypatch):
  """The key only saves work: when computing it fails (CPython 3.11's parser raised SystemError
  under threads in CI), the request is verified as it is, not lost."""
  def broken(*args):
    raise SystemError("AST constructor recursion depth mismatch (injected)")
  monkeypatch.setattr(text_key, "candidate_key", broken)
  hits = program_server.scheduler.program_cache_hits
  verdict = program_server.stub().Verify(_request("key-fault", kernels.cuda_candidate()),
                                         timeout=900)
  assert (verdict.request_id, verdict.outcome) == ("key-fault", pb.NO_GPU), verdict.message
  assert verdict.stage_timings and program_server.scheduler.program_cache_hits == hits


def test_a_joiner_of_a_run_that_ended_in_our_fault_gets_its_own_run(program_server,
                                                                    monkeypatch):
  """INFRA_ERROR is the verifier's fault and never cached: a request that joined another's run
  of the same program, which ended INFRA_ERROR, runs the program itself (as a later request
  would) and gets the program's verdict; neither counts as a program cache hit. Before, the
  joiner got the other request's INFRA_ERROR as its own and was counted as a hit."""
  scheduler = program_server.scheduler
  # A program (and options) no other test of this server verified: none is cached for it.
  candidate = kernels.cuda_candidate().replace(
      "class ModelNew(nn.Module):", "FAULT_CASE = 1\n\n\nclass ModelNew(nn.Module):", 1)
  request = lambda rid, source: _request(rid, source, num_correctness_trials=7)
  stages, failed = scheduler._stages, []  # pylint: disable=protected-access
  deadline = time.monotonic() + 300

  async def fail_first_once_joined(request, options, verdict):
    if not failed:  # the first run fails once the other request has joined it
      failed.append(request.request_id)
      while (sum(scheduler._by_program._waiters.values()) < 2  # pylint: disable=protected-access
             and time.monotonic() < deadline):
        await asyncio.sleep(0.01)
      raise RuntimeError("injected fault in the first run")
    return await stages(request, options, verdict)

  monkeypatch.setattr(scheduler, "_stages", fail_first_once_joined)
  hits = scheduler.program_cache_hits
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    first = pool.submit(program_server.stub().Verify, request("fault-a", candidate), timeout=900)
    while not failed and not first.done():
      assert time.monotonic() < deadline, "the first request never reached its run"
      time.sleep(0.01)
    assert failed, first.result()  # it ran, and was not answered some other way
    second = pool.submit(program_server.stub().Verify, request("fault-b", _relaid(candidate)),
                         timeout=900)
    verdicts = {v.request_id: v for v in (first.result(), second.result())}
  assert verdicts["fault-a"].outcome == pb.INFRA_ERROR
  assert "injected fault" in verdicts["fault-a"].message
  assert verdicts["fault-b"].outcome == pb.NO_GPU, verdicts["fault-b"].message
  assert verdicts["fault-b"].stage_timings  # it ran
  assert scheduler.program_cache_hits == hits


@pytest.fixture(scope="module")
def cpu_program_server(cache_dir, toolchain):
  """Candidates run on CPU worker children (cpu_test_mode), with the program cache on."""
  srv = verifier_harness.ServerThread(verifier_harness.make_config(
      cache_dir, cpu_test_mode=True, slots_per_gpu=2, program_cache_size=100), toolchain)
  yield srv
  srv.stop()


def test_a_run_verdict_answers_only_its_own_program(cpu_program_server):
  """With candidates run by the workers: a relaid twin gets the verdict its program earned,
  without running (OK stays OK; a candidate caught mutating its inputs stays caught, with its
  message and exploit); a candidate whose program differs from a verified one runs, whatever its
  layout, so an honest program's verdict never answers a hostile one."""
  stub = cpu_program_server.stub()
  scheduler = cpu_program_server.scheduler
  honest, hostile = kernels.cpp_candidate("scaled_add"), kernels.cpp_candidate("in_place")
  options = pb.VerifyOptions(num_timing_trials=5).SerializeToString(deterministic=True)
  key = lambda c: text_key.candidate_key(kernels.REFERENCE, c, options)
  assert key(_relaid(honest)) == key(honest) != key(_relaid(hostile)) == key(hostile)
  verify = lambda rid, c: stub.Verify(_request(rid, c, num_timing_trials=5), timeout=900)
  first = verify("run-honest", honest)
  assert first.outcome == pb.OK and first.HasField("timing"), first.message
  hits = scheduler.program_cache_hits
  caught = verify("run-hostile", _relaid(hostile))  # laid out as the honest twin will be
  assert caught.outcome == pb.INCORRECT and "modified its inputs" in caught.message
  assert caught.stage_timings and scheduler.program_cache_hits == hits
  twin = verify("run-hostile-twin", hostile)
  assert (twin.outcome, twin.message) == (caught.outcome, caught.message)
  assert [e.kind for e in twin.exploits] == [e.kind for e in caught.exploits]
  assert pb.INPUT_MUTATION in [e.kind for e in twin.exploits]
  assert not twin.stage_timings and twin.attempts == 0
  ok_twin = verify("run-honest-twin", _relaid(honest))
  assert ok_twin.outcome == pb.OK and not ok_twin.stage_timings
  assert ok_twin.timing.speedup == first.timing.speedup
  assert scheduler.program_cache_hits == hits + 2
