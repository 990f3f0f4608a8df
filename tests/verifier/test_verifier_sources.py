"""Static extraction of load_inline arguments and CUDA kernels, without running candidates."""

from __future__ import annotations

import ast
import json

import pytest

from verifier_service.compile import checks
from verifier_service.compile import sources

import verifier_kernels as kernels


def _extract(code: str) -> list[sources.ExtractedCall]:
  return sources.find_load_inline_calls(ast.parse(code))


def test_folds_concatenation_fstrings_join_and_aliases():
  code = '''
import textwrap
from torch.utils.cpp_extension import load_inline as build
HEADER = "#include <torch/extension.h>\\n"
N = 256
body = f"__global__ void k(float* x) {{ x[threadIdx.x] = {N}; }}"
launch = "\\n".join(["void run(torch::Tensor t) {", "  k<<<1, 1>>>(t.data_ptr<float>());", "}"])
src = HEADER + body
src += "\\n" + textwrap.dedent(launch)
mod = build("ext", cpp_sources=["void run(torch::Tensor t);"], cuda_sources=src,
            functions={"run": "doc"}, extra_cuda_cflags=["-O3"])
'''
  (call,) = _extract(code)
  ext = call.extension
  assert ext is not None, call.error
  assert ext.name == "ext"
  assert ext.cpp_sources == ("void run(torch::Tensor t);",)
  assert ext.cuda_sources[0].startswith("#include <torch/extension.h>\n__global__ void k")
  assert "x[threadIdx.x] = 256;" in ext.cuda_sources[0]
  assert ext.functions == (("run", "doc"),)
  assert ext.extra_cuda_cflags == ("-O3",)


def test_call_inside_a_method_uses_module_constants_and_locals():
  code = '''
import torch.utils.cpp_extension
SRC = "__global__ void k() {}"
class ModelNew:
    def __init__(self):
        decl = "void f();"
        self.m = torch.utils.cpp_extension.load_inline(name="m", cpp_sources=decl,
                                                      cuda_sources=SRC, functions=["f"])
'''
  (call,) = _extract(code)
  assert call.extension is not None, call.error
  assert call.extension.cpp_sources == ("void f();",)
  assert call.extension.cuda_sources == ("__global__ void k() {}",)


@pytest.mark.parametrize("expr, reason", [
    ("open('k.cu').read()", "cannot be evaluated statically"),
    ("SRC_UNKNOWN", "not a module-level constant"),
    ("'x' * 10**9", "unsupported operator"),
    ("'x' * 100_000_000", "too large"),
])
def test_unresolvable_sources_say_why(expr, reason):
  code = f"from torch.utils.cpp_extension import load_inline\nm = load_inline('m', '', {expr})\n"
  (call,) = _extract(code)
  assert call.extension is None
  assert reason in call.error


def test_reassigned_name_is_not_taken_from_an_earlier_constant():
  code = '''
from torch.utils.cpp_extension import load_inline
SRC = "__global__ void k() {}"
SRC = compute()
m = load_inline("m", "", SRC)
'''
  (call,) = _extract(code)
  assert call.extension is None and "SRC" in call.error


def test_from_call_normalises_like_torch():
  a = sources.InlineExtension.from_call("m", "void f();", "__global__ void k(){}", functions="f")
  b = sources.InlineExtension.from_call("m", ["void f();"], ["__global__ void k(){}"],
                                        functions=["f"])
  c = sources.InlineExtension.from_call(name="m", cpp_sources=["void f();"],
                                        cuda_sources="__global__ void k(){}",
                                        functions={"f": "f"}, verbose=True)
  assert a == b == c
  assert a.fingerprint == c.fingerprint
  assert sources.InlineExtension.from_json(json.loads(json.dumps(a.to_json()))) == a
  with pytest.raises(sources.Unresolvable, match="identifier"):
    sources.InlineExtension.from_call("bad-name", "")
  with pytest.raises(sources.Unresolvable, match="functions"):
    sources.InlineExtension.from_call("m", "", functions=[1, 2])


def test_kernel_listing_handles_templates_bounds_and_comments():
  code = r'''
template <int B> __global__ void __launch_bounds__(256) tiled(float* x) {}
extern "C" __global__ void plain(int n);
// __global__ void commented_out(int n) {}
static __global__ void decoy(float* y) {}
void host() {
  tiled<32><<<1, 32>>>(nullptr);
  const char* s = "decoy<<<1,1>>>";  // a string, not a launch
  cudaLaunchKernel((const void*)plain, dim3(1), dim3(1), nullptr, 0, 0);
}
'''
  names = sources.global_kernels(code)
  assert names == ["tiled", "plain", "decoy"]
  assert sources.launched_kernels(code, names) == ["tiled", "plain"]


def test_every_dice_candidate_resolves(shared_dir):
  items = json.loads((shared_dir / "data/dice/kernel_infilling_evaluation.json").read_text())
  outcomes = {}
  for item in items:
    report = checks.check_sources(item["pytorch_code"], item["cuda_code"])
    assert all(e is not None for e in report.extensions)
    outcomes[item["id"]] = report.outcome
  # Two DICE candidates call cuBLASLt / cuDNN and define no __global__ kernel of their own.
  assert sorted(k for k, v in outcomes.items() if v) == [2193, 6936]
  assert sum(v is None for v in outcomes.values()) == 97


def test_test_candidates_resolve():
  report = checks.check_sources(kernels.REFERENCE, kernels.cuda_candidate())
  assert report.outcome is None
  assert report.kernel_names == ["scaled_add_kernel"]
  assert report.launched_kernels == ["scaled_add_kernel"]
  assert report.exported_functions == ["scaled_add"]


def test_locals_and_globals_in_functions():
  code = '''
from torch.utils.cpp_extension import load_inline
SRC = "__global__ void k() {}"
def forward(x):
    SRC = "shadowed locally"   # a local: the module constant stands
def mutate():
    global OTHER
    OTHER = 1
OTHER = "__global__ void j() {}"
def later():
    global OTHER
m = load_inline("m", "", SRC)
n = load_inline("n", "", OTHER)
'''
  first, second = _extract(code)
  assert first.extension is not None and first.extension.cuda_sources == ("__global__ void k() {}",)
  assert second.extension is None and "OTHER" in second.error
