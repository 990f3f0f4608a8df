"""Batched cuda.cu compiles (verifier_service/compile/batch.py): the rules that keep a source
alone, the batch file, and real nvcc batches whose members' modules each compute their own
member's function (the host path, on CPU tensors: no GPU needed)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
import textwrap

import pytest

from verifier_service.compile import batch
from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib

import verifier_kernels as kernels

HEAD = "#include <dice_tier_lite.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n\n"

# scaled_add times FACTOR: on CPU tensors it never launches its kernel, so a module built here can
# be called here, and its answer says which member's code it runs.
SCALED = r'''
#include <torch/extension.h>

__global__ void scaled_add_kernel(const float* a, const float* b, float* out, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (a[i] + b[i]) * s;
}
EXTRA
torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  if (!a.is_cuda()) return a.add(b).mul(s * FACTOR);
  auto out = torch::empty_like(a);
  int n = a.numel();
  scaled_add_kernel<<<(n + 255) / 256, 256>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), (float)s, n);
  return out;
}
'''


def _scaled(factor: str, extra: str = "") -> str:
  return SCALED.replace("FACTOR", factor).replace("EXTRA", extra)


def _member(body: str) -> tuple[batch.Member | None, str]:
  return batch.split_member(HEAD + textwrap.dedent(body))


# ----------------------------------------------------------------------------- no compiler


def test_a_member_keeps_its_lines_and_lists_its_includes_once():
  text = HEAD + "#include <cuda.h>\n// note\n#define TILE 16\n#define CHECK(x) \\\n" \
      "  TORCH_CHECK(x.is_cuda(), #x)\n__global__ void k(float* x) { x[0] = TILE; }\n"
  member, why = batch.split_member(text)
  assert member is not None, why
  assert member.includes == ("#include <dice_tier_lite.h>", "#include <cuda.h>",
                             "#include <cuda_runtime.h>")
  assert member.body.count("\n") == text.count("\n")
  assert "#include" not in member.body and "#define TILE 16" in member.body
  assert member.macros == ("TILE", "CHECK")
  assert member.declared == {"k"}  # TORCH_CHECK on the continuation line is not at scope


@pytest.mark.parametrize("body, reason", [
    ('extern "C" __global__ void k(float* x) {}', "linkage"),
    ("__global__ void k(float* x) { asm volatile(\"trap;\"); }", "asm"),
    ("__attribute__((constructor)) static void grab() {}", "__attribute__"),
    ("[[gnu::constructor]] static void grab() {}", "attribute"),
    ("#pragma GCC optimize(\"O0\")\n__global__ void k() {}", "#pragma"),
    ("__global__ void k() {}\n#include <vector>\n", "#include"),
    ("#line 7 \"other.cu\"\n__global__ void k() {}", "#line"),
    ("template <> struct std::hash<int>;", "specialisation"),
    ("using std::max;\n__global__ void k() {}", "using-declaration"),
    ("} int leaked = 1; struct again {", "did not open"),
    ("__global__ void k(int* x) { x[0] = __COUNTER__; }", "__COUNTER__"),
    # The file macros read otherwise in a batch (its member file, one include level down).
    ("__global__ void k(int* x) { x[0] = __INCLUDE_LEVEL__; }", "__INCLUDE_LEVEL__"),
    ("#if __INCLUDE_LEVEL__ > 0\n__global__ void k() {}\n#endif", "__INCLUDE_LEVEL__"),
    ("static const char* f = __FILE__;\n__global__ void k() {}", "__FILE__"),
    ("#define WHERE __BASE_FILE__\n__global__ void k() {}", "__BASE_FILE__"),
    ("static const char* t = __TIMESTAMP__;", "__TIMESTAMP__"),
    ("static const char* n = __FILE_NAME__;", "__FILE_NAME__"),
    ("#undef TORCH_CHECK\n__global__ void k() {}", "did not define"),
    ("struct V { float x; };\nV operator+(V a, V b) { return a; }", "operator"),
    ("namespace { __device__ float max(float a, float b) { return a; } }", "namespace"),
    ("#define NO_OPT _Pragma(\"GCC optimize(\\\"O0\\\")\")\nNO_OPT void f() {}", "_Pragma"),
])
def test_sources_that_could_mean_something_else_in_a_batch_stay_alone(body, reason):
  member, why = _member(body)
  assert member is None and reason in why, why


def test_names_and_macros_of_the_headers_keep_a_member_alone():
  names, macros = frozenset({"max", "size_t", "cudaMalloc"}), frozenset({"TORCH_CHECK", "TILE"})
  ok, _ = _member("__device__ float sigmoid(float x) { return x; }\n"
                  "__global__ void __launch_bounds__(256) k(float* x) { x[0] = sigmoid(1); }")
  assert batch.refusal(ok, names, macros) is None
  cases = {
      "__device__ float max(float a, float b) { return a; }": "declares max",
      "#define TILE 32\n__global__ void k() {}": "defines a macro the headers define: TILE",
      "TORCH_CHECK(true);": "header macro TORCH_CHECK",
      "#define DECLARE(n) int n;\nDECLARE(hidden)": "its own macro DECLARE",
      "enum Mode { size_t, other };": "declares size_t",
      "__global__ void k() { extern __shared__ float max[]; }": "declares max",
  }
  for body, reason in cases.items():
    member, why = _member(body)
    assert member is not None, why
    assert reason in (batch.refusal(member, names, macros) or ""), body


def test_global_names_leave_out_what_lies_in_namespaces():
  text = textwrap.dedent("""\
      # 1 "x.h"
      namespace at { struct Tensor; int hidden(int inner); namespace d { int deeper; } }
      int visible(int param);
      extern "C" { void cfunc(void); }
      namespace alias = at;
      struct Box { int member; };
      const char* s = "namespace { int in_string; }";
  """)
  names = batch.global_names(text)
  assert {"visible", "param", "cfunc", "Box", "member", "at", "alias"} <= names
  assert not {"hidden", "inner", "deeper", "Tensor", "in_string"} & names
  inline = batch.global_names("inline namespace v1 { int seen; }\nnamespace n { int unseen; }")
  assert "seen" in inline and "unseen" not in inline
  directive = batch.global_names("namespace n { int pulled_in; }\nusing namespace n;")
  assert "pulled_in" in directive


def test_the_batch_file_wraps_each_member_and_checks_it_came_back():
  one, _ = _member("#define A 1\n__global__ void k() {}")
  two, _ = _member("__global__ void k() {}")
  text, files = batch.batch_files("abc", one.includes, [one, two])
  assert text.startswith("#include <dice_tier_lite.h>\n")
  assert 'namespace dice_abc_0 {\n#include "m0/cuda.cu"\n}\n#undef A\n' in text
  assert "static_assert(sizeof(::dice_abc_1::dice_batch_end_abc*)" in text
  assert set(files) == {"m0/cuda.cu", "m1/cuda.cu"}
  assert files["m1/cuda.cu"].endswith("struct dice_batch_end_abc;\n")
  log = ("m1/cuda.cu(3): error: identifier \"x\" is undefined\n"
         "In file included from m0/cuda.cu:1:\nm12/cuda.cu:4:2: error: expected ';'\n")
  assert batch.members_in_errors(log) == {1, 12}


def test_a_batch_never_holds_two_answers_to_one_problem():
  member, _ = _member("__global__ void k() {}")
  pairs = [(dataclasses.replace(member, problem=p), None) for p in "aabacaa"]
  chunks = batch.chunks(pairs, 3)
  assert [[m.problem for m, _ in c] for c in chunks] == [["a", "b", "c"], ["a"], ["a"], ["a"],
                                                          ["a"]]
  anonymous = [(member, None)] * 5
  assert [len(c) for c in batch.chunks(anonymous, 2)] == [2, 2, 1]


_KERNEL = HEAD + "__global__ void k() {}\n"


def _stand_in(tmp_path, compile_fn) -> batch.Batcher:
  """A Batcher whose compiler is `compile_fn`, a stand-in whose objects (missing files) fail the
  batch check, so every member is told to build alone; its preprocessing writes empty files."""
  async def run(argv, cwd):
    (cwd / argv[-1]).write_text("")
    return 0, ""
  return batch.Batcher(compile_fn, run, tmp_path, gather_s=0.05)


def test_members_arriving_while_a_batch_compiles_get_a_batch_of_their_own(tmp_path):
  """The gathering ends when its batch starts compiling: later arrivals are not left waiting
  for the next arrival to start another (here each compile takes 0.3 s)."""
  compiled = []

  async def compile_fn(cmd, text, filename, module_id, files):
    compiled.append(sorted(files or ()))
    await asyncio.sleep(0.3)
    return str(tmp_path / "missing.o"), ""

  async def go():
    batcher = _stand_in(tmp_path, compile_fn)
    first = [asyncio.ensure_future(batcher.compile(["nvcc"], None, _KERNEL, p)) for p in "ab"]
    await asyncio.sleep(0.2)  # the first batch is compiling now
    later = [asyncio.ensure_future(batcher.compile(["nvcc"], None, _KERNEL, p)) for p in "cd"]
    return await asyncio.wait_for(asyncio.gather(*first, *later), 10), batcher.stats

  results, stats = asyncio.run(go())
  assert [value for value, _ in results] == [None] * 4
  assert all("its batch was not used" in why for _, why in results)
  assert compiled.count(["m0/cuda.cu", "m1/cuda.cu"]) == 2 and stats["failed"] == 2


def test_a_batch_too_small_to_pay_is_not_built_when_its_members_split(tmp_path):
  """Two members that the split path would build (`alone_ok`) are told to build alone without a
  batch compile (batch.SMALL_BATCH); two where one has no such way, and three that all have,
  are compiled as a batch (the stand-in's objects then fail the check)."""
  compiled = []

  async def compile_fn(cmd, text, filename, module_id, files):
    if files:  # a batch (not the include block's own object)
      compiled.append(len(files))
    return str(tmp_path / "missing.o"), ""

  async def together(alone_ok):
    batcher = _stand_in(tmp_path, compile_fn)
    return await asyncio.wait_for(asyncio.gather(*(
        batcher.compile(["nvcc"], None, _KERNEL, str(i), ok) for i, ok in enumerate(alone_ok))), 10)

  pair = asyncio.run(together([True, True]))
  assert pair == [(None, batch.SMALL)] * 2 and compiled == []
  for alone_ok in ([True, False], [True, True, True]):
    results = asyncio.run(together(alone_ok))
    assert all(why.startswith("its batch was not used") for _, why in results), results
    assert compiled.pop() == len(alone_ok), compiled
  member, _ = _member("__global__ void k() {}")
  pairs = lambda *ok: [(dataclasses.replace(member, alone_ok=o), None) for o in ok]
  assert [batch.worth_a_batch(pairs(*ok)) for ok in (
      [True], [False], [True, True], [True, False], [True, True, True])] == [
          False, False, False, True, True]


def _declaring_f(tmp_path, reply) -> list[list[str]]:
  """Two rounds of two members that each declare a device function f, where the include block
  uses f only as a parameter's name (its preprocessed text), and the compiler's two front ends
  answer the name check with `reply(device_view, names, end_line)`: each round's reasons."""
  async def run(argv, cwd):
    if "-E" in argv:
      (cwd / argv[-1]).write_text("float g(float f);\n")
      return 0, ""
    text = (cwd / "cuda.cu").read_text()
    names = re.findall(r"using ::(\w+);", text)
    end = text.rstrip().splitlines()[-1].rstrip(";")
    return reply("-cubin" in argv, names, end)

  async def compile_fn(cmd, text, filename, module_id, files):
    return str(tmp_path / "missing.o"), ""

  def source(i: int) -> str:
    return HEAD + f"__device__ float f(float x) {{ return x * {i}; }}\n__global__ void k{i}() {{}}\n"

  async def go():
    batcher = batch.Batcher(compile_fn, run, tmp_path, gather_s=0.05)
    rounds = []
    for first in (0, 2):
      results = await asyncio.wait_for(asyncio.gather(*(
          batcher.compile(["nvcc"], None, source(i), str(i)) for i in (first, first + 1))), 20)
      rounds.append([why for _, why in results])
      await batcher.names_checked()
    return rounds
  return asyncio.run(go())


def _front_end(rc: int, missing: list[str], end: str) -> tuple[int, str]:
  lines = [f'cuda.cu(4): error: the global scope has no "{n}"' for n in missing]
  return rc, "\n".join(lines + [f"cuda.cu(5): error: this declaration has no storage class\n  {end};"])


def test_a_name_the_headers_only_use_as_a_parameter_stops_keeping_members_alone(tmp_path):
  """`global_names` over-approximates (a parameter's name counts): the first members that
  declare such a name are refused, and the compiler is asked in the background whether the
  headers declare it at global scope (`using ::f;`, host and device front ends). Where both say
  they do not, later members declaring f go to a batch (whose stand-in objects fail its check)."""
  rounds = _declaring_f(tmp_path, lambda device, names, end: _front_end(2, names, end))
  assert all("declares f, a name the headers use" in why for why in rounds[0]), rounds
  assert all(why.startswith("its batch was not used") for why in rounds[1]), rounds


@pytest.mark.parametrize("reply", [
    pytest.param(lambda device, names, end: _front_end(2, [] if device else names, end),
                 id="the device view declares it"),
    pytest.param(lambda device, names, end: _front_end(2, names, "cut short"), id="no last line"),
    pytest.param(lambda device, names, end: _front_end(0, names, end), id="compiled"),
    pytest.param(lambda device, names, end: (2, "nvcc fatal : out of memory"), id="failed"),
])
def test_a_name_not_shown_undeclared_by_both_front_ends_keeps_members_alone(tmp_path, reply):
  rounds = _declaring_f(tmp_path, reply)
  assert all("declares f, a name the headers use" in why for why in rounds[0] + rounds[1]), rounds


def test_the_include_blocks_own_object_compiles_alongside_the_first_batch(tmp_path):
  """The object every batch of a group is checked against (the include block alone) starts
  compiling when the group's first batch is planned, not once that batch has compiled: the two
  compiles overlap, so the members wait for one compile, not two in a row."""
  spans: dict[str, list[float]] = {}

  async def compile_fn(cmd, text, filename, module_id, files):
    kind = "batch" if files else "include block"
    start = asyncio.get_running_loop().time()
    await asyncio.sleep(0.5)
    spans[kind] = [start, asyncio.get_running_loop().time()]
    return str(tmp_path / "missing.o"), ""

  async def go():
    batcher = _stand_in(tmp_path, compile_fn)
    return await asyncio.wait_for(asyncio.gather(
        *(batcher.compile(["nvcc"], None, _KERNEL, p) for p in "ab")), 10)

  results = asyncio.run(go())
  assert all("its batch was not used" in why for _, why in results)
  (batch_start, batch_end), (block_start, _) = spans["batch"], spans["include block"]
  assert block_start < batch_end and abs(block_start - batch_start) < 0.25, spans


def test_a_block_that_only_adds_includes_changing_nothing_shares_the_groups_batches(tmp_path):
  """A member whose include block leaves the same preprocessed tokens and macros as a group's
  joins that group (here the longer block's member came first); one whose includes add
  something does not. The preprocessor is a stand-in: <cmath> adds nothing after the common
  block, <cooperative_groups.h> adds a declaration."""
  blocks = []

  async def run(argv, cwd):
    text = (cwd / "cuda.cu").read_text()
    blocks.append(text)
    out = "int shared_decl;\n" + ("int cg_decl;\n" if "cooperative_groups" in text else "")
    (cwd / argv[-1]).write_text(out)
    return 0, ""

  async def compile_fn(cmd, text, filename, module_id, files):
    return str(tmp_path / "missing.o"), ""

  def kernel(extra: str, name: str) -> str:
    return HEAD + extra + f"__global__ void {name}() {{}}\n"

  async def go():
    batcher = batch.Batcher(compile_fn, run, tmp_path, gather_s=0.05)
    await batcher.compile(["nvcc"], None, kernel("#include <cmath>\n", "k0"), "a")
    await batcher.compile(["nvcc"], None, kernel("", "k1"), "b")
    await batcher.compile(["nvcc"], None, kernel("#include <cooperative_groups.h>\n", "k2"), "c")
    return batcher

  batcher = asyncio.run(go())
  assert batcher.stats["extended"] == 1, batcher.stats
  assert sorted(len(key[2]) for key in batcher._groups) == [4, 4], list(batcher._groups)
  assert len(blocks) == 3 * 3  # three blocks, each preprocessed once (host, device, macros)


# ----------------------------------------------------------------------------- real nvcc


def _extension(name: str, source: str):
  (ext,) = checks.check_candidate(kernels.cuda_candidate(source, name)).extensions
  return ext


def _build_all(toolchain, cache_dir, exts) -> tuple[list[compile_lib.BuildResult], dict]:
  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      results = await asyncio.gather(*(compiler.build(ext, 900) for ext in exts))
      return results, compiler.batch_stats()
    finally:
      await compiler.close()
  return asyncio.run(go())


_CALL = textwrap.dedent("""
    import importlib.util, json, sys, torch
    out = []
    for path in sys.argv[1:]:
      name = path.rsplit("/", 1)[-1][:-3]
      spec = importlib.util.spec_from_file_location(name, path)
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      a, b = torch.ones(3), torch.ones(3)
      out.append(module.scaled_add(a, b, 0.5).tolist())
    print(json.dumps(out))
""")


def _call_all(paths: list[str]) -> list[list[float]]:
  proc = subprocess.run([sys.executable, "-c", _CALL, *paths], capture_output=True, text=True,
                        timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout)


@pytest.mark.slow
def test_concurrent_builds_share_one_translation_unit_and_keep_their_own_code(toolchain,
                                                                               cache_dir):
  exts = [_extension(f"batched_{i}", _scaled(f"{i}.0")) for i in (1, 2, 3)]
  exts.append(_extension("batched_broken", _scaled("s_typo")))
  results, stats = _build_all(toolchain, cache_dir, exts)
  good, broken = results[:3], results[3]
  assert [r.ok for r in good] == [True] * 3, [r.log[-500:] for r in good]
  assert [r.batch_size for r in good] == [3, 3, 3], [r.batch_note for r in good]
  assert stats["batches"] == 1 and stats["batched"] == 3
  # The broken member was dropped from the batch and built alone: its own log, as written.
  assert not broken.ok and "s_typo" in broken.log
  assert "m3/" not in broken.log and "dice_" not in broken.log
  # Each module runs its own member's scaled_add (x FACTOR), not another member's.
  assert _call_all([r.so_path for r in good]) == [[i * 1.0] * 3 for i in (1, 2, 3)]
  symbols = subprocess.run(["nm", "-C", good[0].so_path], capture_output=True, text=True,
                           check=True).stdout
  assert symbols.count("::scaled_add(at::Tensor, at::Tensor, double)") == 3


@pytest.mark.slow
def test_a_source_whose_extra_include_changes_nothing_shares_the_batch(toolchain, cache_dir):
  """<cmath> after torch's headers (which include it) leaves the same tokens and macros: once
  the two blocks have been compared (the first burst, whose members do not wait for that), two
  such sources share one batch, and each module still runs its own member's code."""
  def pair(first: str, second: str) -> list:
    cmath = _scaled(first).replace("#include <torch/extension.h>\n",
                                   "#include <torch/extension.h>\n#include <cmath>\n")
    return [_extension(f"block_cmath_{first[0]}", cmath),
            _extension(f"block_plain_{second[0]}", _scaled(second))]

  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      for exts in (pair("3.0", "4.0"), pair("2.0", "1.0")):
        results = await asyncio.gather(*(compiler.build(ext, 900) for ext in exts))
      return results, compiler.batch_stats()
    finally:
      await compiler.close()
  results, stats = asyncio.run(go())
  assert [r.ok for r in results] == [True, True], [r.log[-500:] for r in results]
  assert [r.batch_size for r in results] == [2, 2], [r.batch_note for r in results]
  assert stats["extended"] >= 1 and stats["batches"] == 1, stats
  assert _call_all([r.so_path for r in results]) == [[2.0] * 3, [1.0] * 3]


@pytest.mark.slow
def test_a_function_named_like_a_header_parameter_batches_once_the_compiler_says_so(toolchain,
                                                                                    cache_dir):
  """Host functions named f (the synthetic problems'): the CUDA headers use f only as a
  parameter's and a struct member's name. The first sources that declare f build alone while
  nvcc's front ends are asked; later ones share a batch, each module computing its own answer.
  An overload of fmaf, which the CUDA headers declare at global scope, stays alone."""
  def ext(name: str, factor: float):
    helper = f"static double f(double s) {{ return s * {factor}; }}\n"
    return _extension(name, _scaled("1.0", helper).replace("mul(s * 1.0)", "mul(f(s))"))
  fmaf = _scaled("5.0", "__device__ float fmaf(float a, float b, float c, float d) { return a; }\n")

  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      rounds = []
      for first in (1, 3):
        exts = [ext(f"named_f_{first}", first), ext(f"named_f_{first + 1}", first + 1),
                _extension(f"named_fmaf_{first}", fmaf)]
        rounds.append(await asyncio.gather(*(compiler.build(e, 900) for e in exts)))
        await compiler._batcher.names_checked()  # pylint: disable=protected-access
      return rounds, compiler.batch_stats()
    finally:
      await compiler.close()
  (first, second), stats = asyncio.run(go())
  assert all(r.ok for r in first + second), [r.log[-500:] for r in first + second]
  notes = [r.batch_note for r in first + second]
  assert all("declares f," in note for note in notes[:2]), notes
  assert "declares fmaf," in notes[2] and "declares fmaf," in notes[5], notes
  assert [r.batch_size for r in second] == [2, 2, 0], notes
  assert stats["names_not_declared"] == 1, stats
  assert _call_all([r.so_path for r in second]) == [[3.0] * 3, [4.0] * 3, [5.0] * 3]


@pytest.mark.slow
def test_a_member_that_runs_code_at_load_time_sends_the_batch_back(toolchain, cache_dir):
  init = "static int seven() { return 7; }\nstatic int g_seven = seven();\n"
  exts = [_extension("load_time_0", _scaled("g_seven", init)),
          _extension("load_time_1", _scaled("4.0"))]
  results, stats = _build_all(toolchain, cache_dir, exts)
  assert [r.ok for r in results] == [True, True], [r.log[-500:] for r in results]
  assert [r.batch_size for r in results] == [0, 0]
  assert all("load time" in r.batch_note for r in results), [r.batch_note for r in results]
  assert stats["failed"] == 1
  assert _call_all([r.so_path for r in results]) == [[7.0] * 3, [4.0] * 3]


def test_a_member_that_leaves_its_namespace_fails_the_batch(toolchain, tmp_path):
  """The compiled guard behind the token rules: a member whose braces take it out of its
  namespace (here written past the rules) makes the batch fail, and everyone builds alone."""
  escape = batch.Member(includes=(), body="} int leaked = 1; namespace again {\n",
                        macros=(), declared=frozenset(), scope_names=frozenset())
  fine = batch.Member(includes=(), body="int kept = 1;\n", macros=(), declared=frozenset(),
                      scope_names=frozenset())

  async def go():
    compiler = compile_lib.Compiler(toolchain, tmp_path, compile_lib.CompilerOptions(max_jobs=2))
    try:
      ext = _extension("escape_probe", _scaled("1.0"))
      flags = compiler.flags(ext)
      cmd = list(flags.nvcc) + list(flags.cuda_cflags) + [
          "-c", "{src}", "-o", "{out}"] + list(flags.cuda_post_cflags)
      batcher = compiler._batcher  # pylint: disable=protected-access
      group = batch._Group(cmd, None, ("#include <cuda_runtime.h>",))  # pylint: disable=protected-access
      loop = asyncio.get_running_loop()
      futures = [loop.create_future(), loop.create_future()]
      await batcher._run_batch(group, [(escape, futures[0]), (fine, futures[1])])  # pylint: disable=protected-access
      return [f.result() for f in futures], batcher.stats
    finally:
      await compiler.close()

  outcomes, stats = asyncio.run(go())
  assert [value for value, _ in outcomes] == [None, None]
  assert stats["failed"] == 1 and "did not compile" in outcomes[0][1]
