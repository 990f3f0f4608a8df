"""The verifier's own load_inline build path: same sources as torch, real nvcc, header tiers and
their fallbacks (cuda.cu and main.cpp), split nvcc, precompiled headers, the cache and its keys."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch.utils.cpp_extension

from verifier_service.compile import buildspec
from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import header_tiers
from verifier_service.compile import host_pch
from verifier_service.compile import nvcc_split
from verifier_service.compile import pch as pch_lib
from verifier_service.compile import procs as compile_procs
from verifier_service.compile import sources
from verifier_service.compile import tier_environment

import verifier_kernels as kernels

LITE, TYPES, ORIGINAL = header_tiers.LITE, header_tiers.TYPES, header_tiers.ORIGINAL

# Host functions that allocate with every torch:: factory the lite tier wraps; run on CPU tensors
# (no GPU needed), their results must not depend on the tier the module was built at.
FACTORY_SOURCE = r'''
#include <torch/extension.h>

__global__ void fill_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 1.0f;
}

torch::Tensor fill_ones(torch::Tensor x) {
  fill_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel());
  return x;
}

std::vector<torch::Tensor> factories(torch::Tensor like) {
  TORCH_CHECK(like.dim() == 2, "like must be 2-D");
  std::vector<torch::Tensor> out;
  out.push_back(torch::empty({2, 3}, like.options()).fill_(1.5));
  out.push_back(torch::zeros({4}, torch::kFloat64));
  out.push_back(torch::ones({2, 2}, like.options().dtype(torch::kInt32)));
  out.push_back(torch::full({3}, 7.0, like.options()));
  out.push_back(torch::arange(5, like.options()));
  out.push_back(torch::zeros_like(like));
  out.push_back(torch::ones_like(like));
  out.push_back(torch::full_like(like, 3.0));
  out.push_back(torch::empty_like(like).zero_());
  out.push_back(torch::empty_strided({2, 3}, {1, 2}, like.options()).zero_());
  AT_DISPATCH_FLOATING_TYPES(like.scalar_type(), "scale", [&] {
    out.push_back(like.mul(static_cast<scalar_t>(2)));
  });
  return out;
}
'''
# The same plus an op the lite headers do not declare: lite fails, torch/types.h builds it.
MATMUL_SOURCE = FACTORY_SOURCE + r'''
torch::Tensor product(torch::Tensor a, torch::Tensor b) { return torch::matmul(a, b); }
'''
# A misspelt torch name: fails at every tier; the verdict must carry the original's log.
TORCH_TYPO_SOURCE = FACTORY_SOURCE + r'''
torch::Tensor bad(torch::Tensor a) { return torch::nn::functional::no_such_thing(a); }
'''

_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""{source}"""
cpp_src = """{cpp_src}"""
ext = load_inline(name="{name}", cpp_sources=cpp_src, cuda_sources=source,
                  functions={functions}, verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.fill_ones(x)
'''

_FACTORY_DECLS = ("torch::Tensor fill_ones(torch::Tensor x);\n"
                  "std::vector<torch::Tensor> factories(torch::Tensor like);\n")

_DESCRIBE = textwrap.dedent("""
    import importlib.util, json, sys, torch
    spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)  # the same inputs in every process
    rows = []
    for like in (torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64).requires_grad_()):
      for t in module.factories(like):
        rows.append({"dtype": str(t.dtype), "shape": list(t.shape), "stride": list(t.stride()),
                     "requires_grad": t.requires_grad, "is_leaf": t.is_leaf,
                     "grad_fn": type(t.grad_fn).__name__, "version": t._version,
                     "values": t.detach().tolist()})
    print(json.dumps(rows))
""")


def _candidate(source: str, name: str, extra_decls: str = "",
               functions: tuple[str, ...] = ("fill_ones", "factories")) -> str:
  return (_CANDIDATE.replace("{source}", source).replace("{name}", name)
          .replace("{cpp_src}", _FACTORY_DECLS + extra_decls)
          .replace("{functions}", repr(list(functions))))


def _extension(candidate: str, allow_cpu_only: bool = False):
  (ext,) = checks.check_candidate(candidate, allow_cpu_only=allow_cpu_only).extensions
  return ext


def _build(toolchain, cache_dir, ext, timeout_s: float = 900, **options):
  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir,
                                    compile_lib.CompilerOptions(max_jobs=2, **options))
    try:
      return await compiler.build(ext, timeout_s)
    finally:
      await compiler.close()
  return asyncio.run(go())


def _environment(toolchain, cache_dir) -> header_tiers.Environment:
  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      return await compiler.header_environment(_extension(kernels.cuda_candidate()))
    finally:
      await compiler.close()
  return asyncio.run(go())


def _describe(so_path: str, name: str) -> list[dict]:
  proc = subprocess.run([sys.executable, "-c", _DESCRIBE, so_path, name], capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout)


def _fake_env(**overrides) -> header_tiers.Environment:
  fields = dict(key="k", level="extension", blocks={LITE: "", TYPES: ""}, unavailable={},
                macro_diff={LITE: frozenset({"TORCH_LIBRARY", "PYBIND11_MODULE"}),
                            TYPES: frozenset({"PYBIND11_MODULE"})},
                op_names=frozenset({"relu", "relu_out", "matmul"}),
                full_tokens=frozenset({"matmul", "relu"}))
  fields.update(overrides)
  return header_tiers.Environment(**fields)


# ----------------------------------------------------------------------------- no compiler


def test_sources_are_byte_identical_to_torch_load_inline(tmp_path, monkeypatch):
  written = {}

  def capture(name, sources, *args, **kwargs):
    del args, kwargs
    written.update({s.rsplit("/", 1)[-1]: open(s).read() for s in sources})
    written["name"] = name

  monkeypatch.setattr(torch.utils.cpp_extension, "_jit_compile", capture)
  ext = _extension(kernels.cuda_candidate())
  torch.utils.cpp_extension.load_inline(
      name=ext.name, cpp_sources=list(ext.cpp_sources), cuda_sources=list(ext.cuda_sources),
      functions=[f for f, _ in ext.functions], build_directory=str(tmp_path))
  main_cpp, cuda_cu = buildspec.render_sources(ext)
  assert written["main.cpp"] == main_cpp
  assert written["cuda.cu"] == cuda_cu
  assert written["name"] == ext.name


def test_rewrite_replaces_torch_includes_and_keeps_line_numbers():
  text = ('#include <torch/types.h>\n#include <cuda.h>\n  # include "torch/extension.h"\n'
          'int x;\n#include <ATen/ATen.h>\n')
  assert header_tiers.rewrite(text, LITE) == (
      '#include <dice_tier_lite.h>\n#include <cuda.h>\n#include <dice_tier_lite.h>\n'
      'int x;\n#include <dice_tier_lite.h>\n')
  assert header_tiers.original_level(text) == "extension"
  assert header_tiers.original_level("#include <torch/types.h>\n#include <ATen/ATen.h>") == "types"
  assert header_tiers.original_level("#include <torch/extension.h>\n") is None  # no implicit


@pytest.mark.parametrize("snippet, tier, reason", [
    ("torch::Tensor f(torch::Tensor x) { return x; }", LITE, None),
    ("auto o = torch::TensorOptions().requires_grad(true);", LITE, "requires_grad"),
    ("using namespace torch;", TYPES, "using-directive"),
    ("namespace at { int mine; }", TYPES, "reopens"),
    ("torch::Tensor relu(torch::Tensor x) { return x; }", LITE, "ATen ops"),
    ("torch::Tensor relu(torch::Tensor x) { return x; }", TYPES, None),
    ("float3 operator+(float3 a, float3 b);", LITE, "operator"),
    ("using at::relu;", LITE, "using-declaration"),
    ("TORCH_LIBRARY(ops, m) {}", LITE, "macros"),
    ("TORCH_LIBRARY(ops, m) {}", TYPES, None),
    ("PYBIND11_MODULE(x, m) {}", TYPES, "macros"),
    ("py::object o;", TYPES, "Python bindings"),
    ("// using namespace torch; requires_grad\nint y = x->relu(1) + s.relu(2);", LITE, None),
    ("return relu(x) * 2;", LITE, None),
])
def test_refusal_rules(snippet, tier, reason):
  text = "#include <torch/types.h>\n#include <torch/extension.h>\n" + snippet
  got = header_tiers.refusal(text, tier, _fake_env())
  if reason is None:
    assert got is None
  else:
    assert got is not None and reason in got


def test_plan_orders_tiers_and_says_why_tiers_were_skipped():
  text = "#include <torch/types.h>\n#include <torch/extension.h>\nint y;\n"
  variants, skipped = header_tiers.plan(text, _fake_env())
  assert [t for t, _ in variants] == [LITE, TYPES, ORIGINAL]
  assert variants[-1][1] == text and not skipped
  variants, skipped = header_tiers.plan(text + "using namespace at;\n", _fake_env())
  assert [t for t, _ in variants] == [ORIGINAL] and set(skipped) == {LITE, TYPES}
  variants, skipped = header_tiers.plan(text, _fake_env(blocks={TYPES: ""},
                                                        unavailable={LITE: "broken"}))
  assert [t for t, _ in variants] == [TYPES, ORIGINAL] and skipped == {LITE: "broken"}
  types_only = "#include <torch/types.h>\nint y;\n"  # environments are per level
  assert [t for t, _ in header_tiers.plan(types_only, _fake_env())[0]] == [ORIGINAL]
  variants, _ = header_tiers.plan(types_only, _fake_env(level="types", blocks={LITE: ""}))
  assert [t for t, _ in variants] == [LITE, ORIGINAL]
  assert header_tiers.plan(text, None)[0] == [(ORIGINAL, text)]


def test_binding_plan_blanks_torch_includes_and_refuses_like_cuda():
  env = _fake_env(level=header_tiers.BINDING, blocks={LITE: ""},
                  macro_diff={LITE: frozenset({"TORCH_MODULE"})})
  main = ("#include <torch/extension.h>\n\ntorch::Tensor f(torch::Tensor x);\n"
          "#include <torch/types.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
          'm.def("f", torch::wrap_pybind_function(f), "f");\n}')
  assert header_tiers.binding_level(main) == header_tiers.BINDING
  variants, skipped = header_tiers.plan(main, env, (LITE,), level=header_tiers.BINDING)
  assert [t for t, _ in variants] == [LITE, ORIGINAL] and not skipped
  lite = variants[0][1]
  assert "#include" not in lite and lite.count("\n") == main.count("\n")  # -include'd instead
  assert variants[1][1] == main
  relu = main.replace("f(torch::Tensor x);", "f(torch::Tensor x);\ntorch::Tensor relu(torch::Tensor);")
  variants, skipped = header_tiers.plan(relu, env, (LITE,), level=header_tiers.BINDING)
  assert [t for t, _ in variants] == [ORIGINAL] and "ATen ops" in skipped[LITE]
  # no_implicit_headers: main.cpp does not start with torch/extension.h, so it is left as written.
  assert header_tiers.binding_level("torch::Tensor f(torch::Tensor x);\n") is None


def test_pybind_customisations_and_identical_headers(tmp_path):
  custom = tier_environment._PYBIND_CUSTOM_RE  # pylint: disable=protected-access
  for text in ("namespace pybind11 { namespace detail {", "template <> struct py::detail::x",
               "PYBIND11_MAKE_OPAQUE(std::vector<int>);", "struct type_caster<at::Tensor> {"):
    assert custom.search(text), text
  for text in ("py::object to_object(int);", "namespace torch::python {", "_conj_copy::call"):
    assert not custom.search(text), text
  a, b, c = tmp_path / "a.h", tmp_path / "b.h", tmp_path / "c.h"
  a.write_text("#pragma once\nstruct _object;\n")
  b.write_text("#pragma once\nstruct _object;\n")  # same bytes: g++ opens only one of them
  c.write_text("#pragma once\nstruct other;\n")
  unmatched = tier_environment._unmatched  # pylint: disable=protected-access
  assert unmatched({str(b), str(c)}, {str(a)}) == [str(c)]


def test_escalation_after_a_lite_failure():
  env = _fake_env()
  typo = 'cuda.cu(9): error: identifier "s_typo" is undefined\n1 error detected'
  assert not header_tiers.heavier_may_help(typo, env)
  missing = 'cuda.cu(9): error #20: identifier "matmul" is undefined\n'
  assert header_tiers.heavier_may_help(missing, env)
  namespace = 'cuda.cu(9): error: namespace "torch" has no member "matmul"\n'
  assert header_tiers.heavier_may_help(namespace, env)
  # A typo among other errors still fails as written: the outcome is final (the log is lite's).
  typo_and_parse = 'cuda.cu(9): error: identifier "sinfvv" is undefined\ncuda.cu(9): error: expected a ";"\n'
  assert not header_tiers.heavier_may_help(typo_and_parse, env)
  assert header_tiers.heavier_may_help(typo_and_parse.replace("sinfvv", "matmul"), env)
  # ... but only in the source's own file: an unknown name in the tier's header is the tier's fault.
  in_tier = '/c/dice_tier_lite.h(12): error: identifier "s_typo" is undefined\ncuda.cu(9): error: expected a ";"\n'
  assert header_tiers.heavier_may_help(in_tier, env)
  assert header_tiers.heavier_may_help(in_tier.split("\n")[0], env)
  missing = "cuda.cu:5:10: fatal error: cublas_v2.h: No such file or directory\n"
  assert not header_tiers.heavier_may_help(missing, env)  # the same include fails at every tier
  assert header_tiers.broken_by_tier("/c/dice_tier_lite.h(12): error: x", LITE)
  assert not header_tiers.broken_by_tier("cuda.cu(12): error: x", LITE)


def test_slots_serve_the_earliest_request_first():
  async def go():
    slots = compile_procs.Slots(1)
    order = []

    async def job(priority, name):
      async with slots.hold(priority):
        order.append(name)
        await asyncio.sleep(0.01)

    async with slots.hold(0):  # occupy the only slot while the others queue up
      tasks = [asyncio.ensure_future(job(p, n)) for p, n in ((3, "c"), (1, "a"), (2, "b"))]
      cancelled = asyncio.ensure_future(job(0, "cancelled"))
      await asyncio.sleep(0.01)
      cancelled.cancel()
    await asyncio.gather(*tasks)
    return order
  assert asyncio.run(go()) == ["a", "b", "c"]


def test_cache_keys_separate_policies_and_tier_environments(toolchain, cache_dir):
  ext = _extension(kernels.cuda_candidate())

  async def keys():
    variants = [dict(), dict(light_headers=False), dict(split_nvcc=False), dict(use_pch=False),
                dict(main_tiers=False)]
    compilers = [
        compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=1, **v))
        for v in variants]
    return [c.build_key(ext) for c in compilers]
  build_keys = asyncio.run(keys())
  assert len(set(build_keys)) == len(build_keys)
  argv = ["nvcc", "-gencode=arch=compute_90,code=sm_90"]
  env_keys = {header_tiers.environment_key(toolchain.fingerprint, argv, "extension"),
              header_tiers.environment_key(toolchain.fingerprint, argv, "types"),
              header_tiers.environment_key(toolchain.fingerprint, argv + ["-DX"], "extension"),
              header_tiers.environment_key("other-toolchain", argv, "extension"),
              header_tiers.environment_key(toolchain.fingerprint, ["c++"], header_tiers.BINDING)}
  assert len(env_keys) == 5


def test_bound_log_keeps_head_and_tail():
  text = "first error\n" + "x" * 10_000 + "\nlast line"
  bounded, truncated = compile_lib.bound_log(text, 1000)
  assert truncated and bounded.startswith("first error") and bounded.endswith("last line")
  assert len(bounded) < 1100
  assert compile_lib.bound_log("short", 1000) == ("short", False)


# ----------------------------------------------------------------------------- real nvcc


def _nvcc_split_and_plain(toolchain, tmp_path, text: str):
  runner = compile_procs.ProcessRunner(4, toolchain.build_env())
  run = lambda argv, cwd: runner.run(argv, cwd, echo=False)

  async def go():
    results = {}
    for mode in ("plain", "split", "host_first"):
      work = tmp_path / mode
      work.mkdir()
      (work / "k.cu").write_text(text)
      argv = [toolchain.nvcc, "-gencode=arch=compute_90,code=sm_90", "-c", str(work / "k.cu"),
              "-o", str(work / "k.o")]
      if mode == "plain":
        results[mode] = await run(argv, work)
      else:
        results[mode] = await nvcc_split.compile_split(argv, text, work, run,
                                                       host_first=mode == "host_first")
    return results
  return asyncio.run(go())


def test_split_nvcc_builds_the_same_object(toolchain, tmp_path):
  text = "namespace { __device__ int hidden; }\n__global__ void k(float* x) { x[0] = hidden; }\n"
  results = _nvcc_split_and_plain(toolchain, tmp_path, text)
  assert results["plain"][0] == 0 and results["split"] is not None and results["split"][0] == 0

  def symbols(mode):
    out = subprocess.run(["nm", str(tmp_path / mode / "k.o")], capture_output=True, text=True,
                         check=True).stdout
    # Only the module id (our own for split) and nvcc's scratch-file names may differ.
    out = re.sub(r"\d+_GLOBAL__N__\w+?(hidden|ignore)", r"_GLOBAL__N__ID\1", out)
    out = re.sub(r"(tmpxft_\w+?_)?k\.cudafe1\.cpp", "k.cudafe1.cpp", out)
    return sorted(line.split()[-1] for line in out.splitlines())
  assert symbols("plain") == symbols("split") == symbols("host_first")
  split, host_first = ((tmp_path / mode / "k.o").read_bytes() for mode in ("split", "host_first"))
  assert split == host_first  # the same module id, the same steps: only their order differs


def test_host_pch_builds_the_same_object(toolchain, tmp_path):
  """nvcc's last step reading the shared prefix of its input from a precompiled header gives
  the object it gives without one, byte for byte (same module id, relative paths)."""
  runner = compile_procs.ProcessRunner(2, toolchain.build_env())
  run = lambda argv, cwd: runner.run(argv, cwd, echo=False)
  headers = pch_lib.PrecompiledHeaders(tmp_path / "pch", tmp_path, toolchain.fingerprint, runner)
  host = host_pch.HostHeaders(headers, min_uses=1)
  body = "#include <vector>\n#include <cmath>\n__global__ void k(float* x) {{ x[0] = {}; }}\n"

  async def compile_one(name: str, text: str, prepare) -> bytes:
    work = tmp_path / name
    work.mkdir()
    (work / "k.cu").write_text(text)
    argv = [toolchain.nvcc, "-gencode=arch=compute_90,code=sm_90", "-c", "k.cu", "-o", "k.o"]
    rc, output = await nvcc_split.compile_split(argv, text, work, run, module_id="_fixed_dice_id",
                                                prepare_final=prepare)
    assert rc == 0, output
    return (work / "k.o").read_bytes()

  async def go():
    await compile_one("first", body.format("sqrtf(2.f)"), host.prepare)  # starts the header
    await headers.settle()
    with_pch = await compile_one("second", body.format("1.f"), host.prepare)
    plain = await compile_one("plain", body.format("1.f"), None)
    return with_pch, plain
  with_pch, plain = asyncio.run(go())
  assert host.used == 1
  assert with_pch == plain


def test_split_nvcc_compiles_the_input_as_written_when_the_prepared_one_fails(toolchain,
                                                                             tmp_path):
  runner = compile_procs.ProcessRunner(2, toolchain.build_env())
  undone = []

  async def broken_prepare(plan, cwd):
    source = cwd / host_pch.split_command(plan.final, plan.env)[2]
    original = source.read_text()
    source.write_text("#error a rewritten host input that does not compile\n")
    return plan.final, lambda: (undone.append(True), source.write_text(original))

  async def go():
    (tmp_path / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1.f; }\n")
    argv = [toolchain.nvcc, "-gencode=arch=compute_90,code=sm_90", "-c", "k.cu", "-o", "k.o"]
    return await nvcc_split.compile_split(argv, "", tmp_path,
                                          lambda a, cwd: runner.run(a, cwd, echo=False),
                                          prepare_final=broken_prepare)
  rc, output = asyncio.run(go())
  assert rc == 0 and undone == [True], output
  assert (tmp_path / "k.o").is_file()


def test_host_pch_finds_the_shared_prefix_and_the_compile_command():
  text = '# 1 "cuda.cu"\n#pragma x\n# 1 "/usr/include/vector" 1 3\nint v;\n# 7 "cuda.cu"\nint k;\n'
  assert text[host_pch.shared_prefix(text):] == '# 7 "cuda.cu"\nint k;\n'
  assert host_pch.shared_prefix('# 1 "cuda.cu"\nint k;\n') == 0
  command = ('gcc -std=c++20 -D__CUDA_ARCH__=900 -c -x c++  -fPIC "-I$HERE/inc" -m64 '
             '"nvcc-steps/cuda.cudafe1.cpp" -o "cuda.cu.o"')
  assert host_pch.split_command(command, {"HERE": "/cuda"}) == (
      "gcc", ["-std=c++20", "-D__CUDA_ARCH__=900", "-fPIC", "-I/cuda/inc", "-m64"],
      "nvcc-steps/cuda.cudafe1.cpp")
  assert host_pch.split_command(command, {}) is None  # an unknown variable: leave it to nvcc
  assert host_pch.split_command("gcc -c k.cpp -o k.o", {}) is None


def test_split_nvcc_reports_errors_like_nvcc(toolchain, tmp_path):
  results = _nvcc_split_and_plain(toolchain, tmp_path, "__global__ void k() { undefined_x; }\n")
  assert results["plain"][0] != 0 and results["split"][0] != 0
  assert 'identifier "undefined_x" is undefined' in results["split"][1]
  assert results["split"][1].count("undefined_x") == results["plain"][1].count("undefined_x")
  rc, output = results["host_first"]
  assert (rc, output.replace("/host_first/", "/split/")) == results["split"]  # its own folder


def test_tier_environment_is_a_checked_subset(toolchain, cache_dir):
  env = _environment(toolchain, cache_dir)
  assert env is not None and set(env.blocks) == {LITE, TYPES}, env.unavailable
  assert env.macro_diff[TYPES] <= env.macro_diff[LITE]
  assert "PYBIND11_MODULE" in env.macro_diff[TYPES] and "AT_DISPATCH_FLOATING_TYPES" not in (
      env.macro_diff[LITE])
  lite = env.blocks[LITE]
  assert "::dice_lite::fresh_variable(at::empty(" in lite
  assert "at::Tensor tensor(Args&&...) = delete;" in lite  # torch::tensor is never at::tensor
  assert "at::Tensor from_blob(Args&&...) = delete;" in lite
  assert (cache_dir / "headers" / env.key / "dice_tier_lite.h").is_file()


def test_binding_environment_is_a_checked_subset(toolchain, cache_dir):
  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      return await compiler.binding_environment(_extension(kernels.cuda_candidate()))
    finally:
      await compiler.close()
  env = asyncio.run(go())
  assert env is not None and env.level == header_tiers.BINDING
  assert set(env.blocks) == {LITE}, env.unavailable
  assert env.blocks[LITE].endswith(tier_environment.BINDING_INCLUDES)
  assert "::dice_lite::fresh_variable(at::empty(" in env.blocks[LITE]
  # The binding's macros are the original's; torch's C++ frontend's are not.
  assert "PYBIND11_MODULE" not in env.macro_diff[LITE]
  assert "TORCH_MODULE" in env.macro_diff[LITE]


def test_dice_candidates_qualify_for_the_lite_tier(toolchain, cache_dir, shared_dir):
  env = _environment(toolchain, cache_dir)
  items = json.loads((shared_dir / "data/dice/kernel_infilling_evaluation.json").read_text())
  tiers = []
  for item in items:
    (ext,) = checks.check_candidate(item["cuda_code"]).extensions
    variants, _ = header_tiers.plan(buildspec.render_sources(ext)[1], env)
    tiers.append(variants[0][0])
  assert tiers.count(LITE) >= 0.95 * len(items), tiers


def test_lite_build_matches_types_build_and_falls_back(toolchain, cache_dir):
  lite = _build(toolchain, cache_dir, _extension(_candidate(FACTORY_SOURCE, "tier_lite")))
  assert lite.ok, lite.log
  assert lite.header_tier == LITE and lite.pch_used
  assert lite.main_tier == LITE and not lite.main_notes
  again = _build(toolchain, cache_dir, _extension(_candidate(FACTORY_SOURCE, "tier_lite")))
  assert again.cache_hit and again.so_path == lite.so_path
  # torch::matmul is not in the lite headers: that build fails and torch/types.h builds it.
  fallback = _build(toolchain, cache_dir, _extension(_candidate(
      MATMUL_SOURCE, "tier_types", "torch::Tensor product(torch::Tensor a, torch::Tensor b);\n",
      ("fill_ones", "factories", "product"))))
  assert fallback.ok, fallback.log
  assert fallback.header_tier == TYPES and fallback.tier_notes == {LITE: "did not compile"}
  assert _describe(lite.so_path, "tier_lite") == _describe(fallback.so_path, "tier_types")


def test_every_tier_failing_reports_the_original_log(toolchain, cache_dir):
  result = _build(toolchain, cache_dir, _extension(_candidate(
      TORCH_TYPO_SOURCE, "tier_typo", "torch::Tensor bad(torch::Tensor a);\n",
      ("fill_ones", "factories", "bad"))))
  assert not result.ok and "no_such_thing" in result.log
  assert "dice_tier" not in result.log and "headers/" not in result.log.split("\n")[0]


def _error_lines(log: str) -> list[str]:
  return [l for l in log.splitlines() if "error" in l and not l.startswith("$ ")]


def test_a_typo_ends_the_build_at_the_lite_tier_with_the_errors_of_the_source_as_written(
    toolchain, cache_dir, tmp_path):
  """A lite failure that no heavier header can remove (a name nothing declares) is final: one
  cuda.cu compile, not the lite one and then torch's whole headers; its errors are those the
  source as written gets (built here with every tier off)."""
  source = kernels.CUDA_SOURCE.replace("(a[i] + b[i]) * s", "(a[i] + b[i]) * s_final_typo")
  ext = _extension(kernels.cuda_candidate(source, name="typo_final"))
  fast = _build(toolchain, cache_dir, ext)
  assert not fast.ok and "s_final_typo" in fast.log
  assert [s["step"] for s in fast.steps].count("gcc+cudafe++") == 1, fast.steps
  written = _build(toolchain, tmp_path, ext, light_headers=False, use_pch=False)
  assert not written.ok
  assert _error_lines(fast.log) == _error_lines(written.log) != []


def test_a_typo_among_other_errors_ends_the_build_at_the_lite_tier_and_fails_as_written_too(
    toolchain, cache_dir, tmp_path):
  """A name nothing declares, then the parse error it causes (`... * s_typo2 s;`, as a policy
  writes `y[i] = sinfvv v;`): final at the lite tier, one cuda.cu compile; the source as written
  (every tier off) fails too, with that error on the same line."""
  source = kernels.CUDA_SOURCE.replace("(a[i] + b[i]) * s", "(a[i] + b[i]) * s_typo2 s")
  ext = _extension(kernels.cuda_candidate(source, name="typo_and_parse"))
  fast = _build(toolchain, cache_dir, ext)
  assert not fast.ok and "s_typo2" in fast.log and 'expected a ";"' in fast.log, fast.log
  assert [s["step"] for s in fast.steps].count("gcc+cudafe++") == 1, fast.steps
  written = _build(toolchain, tmp_path, ext, light_headers=False, use_pch=False)
  assert not written.ok
  typo = [l for l in _error_lines(fast.log) if "s_typo2" in l]
  assert typo and set(typo) <= set(_error_lines(written.log)), (typo, written.log[-2000:])


def test_the_retry_after_a_lite_failure_starts_no_device_front_end_when_its_host_chain_fails(
    toolchain, cache_dir):
  """A parse error may be one heavier headers remove, so the build tries again with them, and
  fails there too. Those retries run nvcc's device chain only after a successful host chain, as
  nvcc does: the lite attempt's chains run concurrently (one device chain at most, finished or
  cancelled: a cancelled process counts, it ran), the retries' host chains fail alone."""
  source = kernels.CUDA_SOURCE.replace("(a[i] + b[i]) * s", "(a[i] + b[i]) * s +")
  result = _build(toolchain, cache_dir, _extension(kernels.cuda_candidate(source, name="retry_host_first")))
  assert not result.ok and "expected an expression" in result.log, result.log
  names = [s["step"] for s in result.steps]
  assert names.count("gcc+cudafe++") >= 2, result.steps  # the lite attempt and the retries
  assert sum("cicc" in name for name in names) <= 1, result.steps


def test_cpp_extension_runs_and_computes(toolchain, cache_dir):
  result = _build(toolchain, cache_dir,
                  _extension(kernels.cpp_candidate("scaled_add"), allow_cpu_only=True))
  assert result.ok, result.log
  assert result.header_tier == ""
  probe = textwrap.dedent(f"""
      import importlib.util, torch
      spec = importlib.util.spec_from_file_location("cpu_family", {result.so_path!r})
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      a, b = torch.randn(4, 5), torch.randn(4, 5)
      assert torch.allclose(module.scaled_add(a, b, 0.5), (a + b) * 0.5)
      print("ok")
  """)
  proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                        timeout=300, check=False)
  assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_precompiled_header_is_really_used(toolchain, cache_dir):
  ext = _extension(kernels.cuda_candidate())

  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=2))
    try:
      pch = await compiler.warm_up()
      return compiler.flags(ext), pch, await compiler.binding_environment(ext)
    finally:
      await compiler.close()
  flags, pch, env = asyncio.run(go())
  assert pch is not None and pathlib.Path(pch + ".gch").is_file()
  main_cpp, _ = buildspec.render_sources(ext)
  variants, _ = header_tiers.plan(main_cpp, env, (LITE,), level=header_tiers.BINDING)
  tier, text = variants[0]
  assert tier == LITE
  src = pathlib.Path(pch).parent / "probe_main.cpp"
  src.write_text(text)
  proc = subprocess.run(list(flags.cxx) + ["-include", pch, "-Winvalid-pch", "-H", "-fsyntax-only"]
                        + list(flags.cflags) + [str(src)], capture_output=True, text=True,
                        env=toolchain.build_env(), timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert re.search(r"^! .*\.gch$", proc.stderr, re.M), proc.stderr[:2000]


def test_warm_up_prepares_the_header_tiers_of_every_level_a_first_request_may_have(toolchain, tmp_path):
  """Types-level cuda.cu included: load_inline's cuda_sources strings that include no torch header
  (the built-in run's scaffolds, many DICE items). Before, the first such request computed its
  level's tiers while the build waited. A cache of its own: the session's has every level."""
  async def go():
    compiler = compile_lib.Compiler(toolchain, tmp_path, compile_lib.CompilerOptions(max_jobs=2, use_pch=False))
    try:
      await compiler.warm_up()
    finally:
      await compiler.close()
  asyncio.run(go())
  levels = {json.loads(p.read_text())["level"] for p in tmp_path.glob("headers/*/environment.json")}
  assert set(header_tiers.CUDA_LEVELS) <= levels, levels


# Host code in main.cpp (a C++-only extension): conversions pybind11 and torch's casters make.
BINDING_SOURCE = r'''
#include <vector>
''' + kernels.SCALED_ADD_CPP + r'''torch::Tensor throws(torch::Tensor a, torch::Tensor b, double s) {
  TORCH_CHECK(false, "deliberate failure in the candidate");
  return a;
}
std::vector<torch::Tensor> split_scaled(torch::Tensor a, std::vector<double> scales,
                                        c10::optional<int64_t> dim) {
  std::vector<torch::Tensor> out;
  for (double s : scales) out.push_back(a.mul(s).sum(dim.value_or(0)));
  return out;
}
'''
_BINDING_FUNCTIONS = ("scaled_add", "throws", "split_scaled")
_DESCRIBE_BINDING = textwrap.dedent("""
    import importlib.util, json, sys, torch
    spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    rows = {"doc": {f: getattr(module, f).__doc__ for f in sys.argv[3:]}}
    calls = [("scaled_add", (a, b, 0.5)), ("scaled_add", ("x", b, 0.5)),
             ("scaled_add", (a, b, "s")), ("scaled_add", (a, b)), ("throws", (a, b, 1.0)),
             ("split_scaled", (a, [0.5, 2], None)), ("split_scaled", (a, (1.0,), 1)),
             ("split_scaled", (a, 3.0, None)), ("split_scaled", (a, [1.0, "x"], 0))]
    for i, (name, args) in enumerate(calls):
      try:
        out = getattr(module, name)(*args)
        rows[f"{i}:{name}"] = [t.tolist() for t in out] if isinstance(out, list) else out.tolist()
      except Exception as e:  # the binding's own conversions and torch's error translation
        rows[f"{i}:{name}"] = f"{type(e).__name__}: {e}"
    print(json.dumps(rows))
""")


def _static_init_calls(so_path: str) -> set[str]:
  """What a module's static initialisers call, from its disassembly."""
  text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", so_path], capture_output=True,
                        text=True, check=True).stdout
  calls, inside = set(), False
  for line in text.splitlines():
    if re.match(r"^[0-9a-f]+ <(_GLOBAL__sub_I|_Z41__static_initialization_and_destruction)", line):
      inside = True
    elif not line.strip():
      inside = False
    elif inside and (match := re.search(r"\bcall\s.*<([^>]+)>", line)):
      calls.add(match.group(1))
  assert calls, "no static initialiser found"
  return calls


@pytest.mark.slow
def test_binding_lite_behaves_like_the_original(toolchain, cache_dir):
  """main.cpp at the lite tier (precompiled) and, for a source the lite headers cannot build
  (torch::matmul), at the original tier: same conversions, docstrings, errors and results."""
  functions = tuple((f, f) for f in _BINDING_FUNCTIONS)
  lite_ext = sources.InlineExtension(name="binding_lite", cpp_sources=(BINDING_SOURCE,),
                                     cuda_sources=(), functions=functions, with_cuda=True)
  lite = _build(toolchain, cache_dir, lite_ext)
  assert lite.ok, lite.log
  assert lite.main_tier == LITE and lite.pch_used and not lite.main_notes
  product = ("\ntorch::Tensor product(torch::Tensor a, torch::Tensor b) "
             "{ return torch::matmul(a, b); }\n")
  fallback_ext = dataclasses.replace(lite_ext, name="binding_fallback",
                                     cpp_sources=(BINDING_SOURCE + product,),
                                     functions=functions + (("product", "product"),))
  fallback = _build(toolchain, cache_dir, fallback_ext, use_pch=False)
  assert fallback.ok, fallback.log
  assert fallback.main_tier == ORIGINAL and fallback.main_notes == {LITE: "did not compile"}

  def describe(result, name):
    proc = subprocess.run([sys.executable, "-c", _DESCRIBE_BINDING, result.so_path, name,
                           *_BINDING_FUNCTIONS], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)
  described = describe(lite, "binding_lite")
  assert described == describe(fallback, "binding_fallback")
  # Loading runs the same static initialisers (the headers left out initialise nothing).
  assert _static_init_calls(lite.so_path) == _static_init_calls(fallback.so_path)
  assert "incompatible function arguments" in described["2:scaled_add"]
  assert "deliberate failure" in described["4:throws"]
  assert isinstance(described["5:split_scaled"], list)


def test_compile_errors_are_cached(toolchain, cache_dir):
  ext = _extension(kernels.BROKEN_CUDA)
  first = _build(toolchain, cache_dir, ext)
  assert not first.ok and not first.timed_out
  assert "s_typo" in first.log and "dice_tier" not in first.log
  start = time.monotonic()
  second = _build(toolchain, cache_dir, ext)
  assert time.monotonic() - start < 5
  assert second.cache_hit and second.log == first.log


def test_timeout_kills_the_build(toolchain, tmp_path):
  ext = _extension(kernels.cuda_candidate(name="never_finishes"))
  start = time.monotonic()
  result = _build(toolchain, tmp_path, ext, timeout_s=2)
  assert time.monotonic() - start < 15
  assert result.timed_out and not result.ok
  assert "within 2.0 s" in result.log


def test_flags_use_the_discovered_toolkit_even_if_torch_guessed_first(toolchain, cache_dir):
  # This module imported torch.utils.cpp_extension before discovery; torch's own CUDA_HOME guess
  # (the folder above a wrapper `nvcc`) must not leak into the flags.
  async def flags():
    compiler = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(max_jobs=1))
    return compiler.flags(_extension(kernels.cuda_candidate()))
  result = asyncio.run(flags())
  assert f"-L{toolchain.cuda_root}/lib64" in result.ldflags
  assert result.nvcc[0].startswith(toolchain.cuda_root)
  assert "-gencode=arch=compute_90,code=sm_90" in result.cuda_cflags


def test_build_result_records_round_trip():
  result = compile_lib.BuildResult(ok=True, header_tier=LITE, tier_notes={TYPES: "x"})
  data = json.loads(json.dumps(dataclasses.asdict(result)))
  assert compile_lib.BuildResult(**data) == result


def test_a_build_trace_names_each_process_with_its_start_and_wall_time(tmp_path):
  """procs.Trace: what a build ran, for reading its critical path (BuildResult.steps)."""
  runner = compile_procs.ProcessRunner(1, dict(os.environ))
  trace = compile_procs.Trace()

  async def go():
    token = compile_procs.STEPS.set(trace)
    try:
      await runner.run(["/bin/sh", "-c", "set -e\nexport A=1\nsleep 0.2\ntrue\n"], tmp_path)
      await runner.run(["sleep", "0.1"], tmp_path, step="named")
    finally:
      compile_procs.STEPS.reset(token)
    await runner.run(["true"], tmp_path)  # untraced
  asyncio.run(go())
  assert [s["step"] for s in trace.steps] == ["sleep+true", "named"]
  first, second = trace.steps
  assert first["wall_s"] >= 0.2 and second["start_s"] >= first["start_s"] + first["wall_s"] - 0.01
  assert compile_procs.step_name(["c++", "-c", "main.cpp", "-o", "main.o"]) == "c++ main.cpp"
  assert compile_procs.step_name(["g++", "a.o", "-o", "/x/ext.so"]) == "g++ ext.so"
