"""The split path's cut (verifier_service/compile/split_source.py), no compiler: what it makes
of a source, each refusal class with its reason, and hostile text that tries to make the cut read
something other than what the compiler reads (refused: the build then takes the usual path)."""

from __future__ import annotations

import asyncio

import pytest

from verifier_service.compile import split_names
from verifier_service.compile import split_source

NAMES = split_source.Names(
    device=frozenset({"TORCH_CHECK", "at", "torch", "c10", "C10_CUDA_KERNEL_LAUNCH_CHECK"}),
    host=frozenset({"__half", "thrust"}),
    block_includes=frozenset({"cuda.h", "cuda_runtime.h", "cuda_fp16.h", "vector"}))

KERNEL = r'''__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sq(a[i]) + b[i];
}
'''
HOST = r'''torch::Tensor add(torch::Tensor a, torch::Tensor b) {
  TORCH_CHECK(a.is_cuda(), "a must be a CUDA tensor");
  auto out = torch::empty_like(a);
  int n = a.numel();
  add_kernel<<<(n + TILE - 1) / TILE, TILE>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                               out.data_ptr<float>(), n);
  return out;
}
'''
SOURCE = ("#include <torch/extension.h>\n#include <cuda_runtime.h>\n#define TILE 256\n\n"
          "__device__ float sq(float x) { return x * x; }\n\n" + KERNEL + "\n" + HOST)


def _refused(text: str) -> str:
  with pytest.raises(split_source.Refused) as e:
    split_source.plan(text, NAMES)
  return str(e.value)


def test_the_halves_keep_every_line_and_divide_the_code():
  split = split_source.plan(SOURCE, NAMES)
  lines = SOURCE.count("\n")
  # Line for line the source's up to its end (the device half appends its launchers after it).
  assert split.host.count("\n") == lines
  assert split.device.split("\n")[:lines] != SOURCE.split("\n")[:lines]
  for i, line in enumerate(SOURCE.split("\n")):
    if "TORCH_CHECK" in line:  # TORCH_CHECK's __LINE__ is the source's
      assert split.host.split("\n")[i] == line
      assert not split.device.split("\n")[i].strip()
    if "x * x" in line:
      assert split.device.split("\n")[i] == line and not split.host.split("\n")[i].strip()
  assert "torch/extension.h" not in split.device and "torch/extension.h" not in split.host
  assert [k.name for k in split.kernels] == ["add_kernel"]
  assert split.kernels[0].param_names == ("a", "b", "out", "n")
  # The launch is nvcc's own expansion with the launcher for the kernel's stub.
  assert ("(__cudaPushCallConfiguration((n + TILE - 1) / TILE, TILE)) ? (void)0 : "
          "__dice_launch_add_kernel(a.data_ptr<float>()") in split.host
  assert "add_kernel<<<__dice_grid, __dice_block, __dice_shared, __dice_stream>>>(a, b, out, n)" \
      in split.device


@pytest.mark.parametrize("text, reason", [
    # Host code naming device code other than to launch it.
    (SOURCE.replace("return out;", "(void)&add_kernel; return out;"), "names kernel add_kernel"),
    (SOURCE.replace("return out;", "cudaFuncSetAttribute(add_kernel, "
                    "cudaFuncAttributeMaxDynamicSharedMemorySize, 0); return out;"),
     "names kernel add_kernel"),
    (SOURCE.replace("return out;", "(void)sq; return out;"), "names device code: sq"),
    # Launches from device code or from a macro.
    (SOURCE.replace("#define TILE 256", "#define TILE 256\n#define GO(n) add_kernel<<<1, 1>>>"),
     "launches a kernel from device code, a macro"),
    (SOURCE.replace("add_kernel<<<", "LAUNCH<<<").replace("#define TILE 256",
                                                            "#define TILE 256\n#define LAUNCH "
                                                            "add_kernel"),
     "not a kernel of its own by name"),
    (SOURCE.replace("<<<(n + TILE - 1) / TILE, TILE>>>", "<<<std::max<int>(1, n), TILE>>>"),
     "< or > in its configuration"),
    # Kernels the launcher cannot stand in for.
    (SOURCE.replace("__global__ void add_kernel", "template <int N> __global__ void add_kernel"),
     "templated kernel"),
    (SOURCE.replace("int n) {\n  int i", "int n, ...) {\n  int i"), "default or variadic"),
    (SOURCE.replace('#define TILE 256', '#define TILE 256\nextern "C" int shared_counter;'),
     "extern"),
    (SOURCE.replace("__device__ float sq", "__host__ __device__ float sq"), "__host__"),
    (SOURCE.replace("#define TILE 256", "#define TILE 256\nnamespace ns { int x; }"),
     "namespace"),
    (SOURCE.replace("out[i] = sq(a[i]) + b[i];", 'asm volatile("trap;");'), "inline assembly"),
    (SOURCE.replace("#define TILE 256", "#define TILE 256\n#pragma GCC optimize(\"O0\")"),
     "#pragma"),
    # Includes the lite headers do not hold, or after the code began.
    (SOURCE.replace("#include <cuda_runtime.h>", '#include "/etc/passwd"'), "includes"),
    (SOURCE.replace("#include <cuda_runtime.h>", "#include <cublas_v2.h>"), "includes"),
    (SOURCE + "#include <vector>\n", "after its code began"),
    # Names: torch's in device code, nvcc/g++-dependent ones in host code, ours.
    (SOURCE.replace("out[i] = sq(a[i]) + b[i];", "out[i] = c10::detail::x;"), "uses c10"),
    (SOURCE.replace("return out;", "__half h; return out;"), "__half"),
    (SOURCE.replace("return out;", "thrust::plus<int> p; return out;"), "thrust"),
    (SOURCE.replace("return out;", "__dice_launch_add_kernel(0, 0, 0, 0); return out;"),
     "__dice"),
    (SOURCE.replace("float sq(float x)", "float add(float x)").replace("sq(a[i])", "add(a[i])"),
     "in host and device code"),
    (SOURCE.replace("__global__ void add_kernel(const float* a, const float* b, float* out, "
                    "int n) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) "
                    "out[i] = sq(a[i]) + b[i];\n}\n", ""), "no kernel"),
])
def test_each_refusal_class_is_refused_with_its_reason(text, reason):
  assert reason in _refused(text)


@pytest.mark.parametrize("text, reason", [
    # The kernel's name where the cut could think it sees code: it is refused (__dice is ours).
    (SOURCE.replace('"a must be a CUDA tensor"', '"__dice_launch_add_kernel"'), "__dice"),
    # A comment continued onto the next line with a backslash hides code from the compiler
    # (or shows the cut code that is a comment).
    (SOURCE.replace("#define TILE 256", "#define TILE 256 // tile \\"), "splices a comment"),
    (SOURCE.replace("__global__ void add_kernel", "__glo\\\nbal__ void add_kernel"), "splices"),
    (SOURCE.replace("(void)", "").replace("return out;", "return out; // end \\\n  (void)sq;"),
     "splices"),
    # Digraphs and trigraphs: `%:include` is an #include the cut's directive reader does not see.
    ("%:include \"/etc/shadow\"\n" + SOURCE, "digraph"),
    (SOURCE.replace("out[i] = sq(a[i])", "out<:i:> = sq(a[i])"), "digraph"),
    ("??=include \"/etc/shadow\"\n" + SOURCE, "trigraph"),
    # A raw string holding a quote: the cut's literal reader would end it early.
    (SOURCE.replace('"a must be a CUDA tensor"', 'R"x(" __global__ void evil() {} ")x"'),
     "raw string"),
    # A digit separator reads as a character literal to the cut, hiding what follows.
    (SOURCE.replace("int n = a.numel();", "int n = 1'0 + (int)(long)&sq + 1'0;"),
     "digit separator"),
    # Token pasting builds names the cut never sees (its own launcher, device code).
    (SOURCE.replace("#define TILE 256", "#define TILE 256\n#define CAT(a, b) a##b").replace(
        "return out;", "CAT(__di, ce_launch_add_kernel)(0, 0, 0, 0); return out;"), "pastes tokens"),
    (SOURCE.replace("#define TILE 256", "#define TILE 256\n#define CAT(a, b) a##b").replace(
        "return out;", "(void)CAT(s, q); return out;"), "pastes tokens"),
    # A launch inside a macro the host code expands.
    (SOURCE.replace("#define TILE 256", "#define TILE 256\n#define RUN(k) k<<<1, 1>>>"),
     "a macro"),
    # Kernel-looking text inside a string or comment stays text: the plan must not count it.
    (SOURCE.replace("/ TILE, TILE>>>", "/ TILE, TILE>>>").replace(
        '"a must be a CUDA tensor"', '"__global__ void k(){}"').replace(
            "__global__ void add_kernel", "/* add_kernel<<<1,1>>>() */ __global__ void add_kernel"
        ).replace("return out;", "evil_kernel<<<1, 1>>>(); return out;"), "evil_kernel"),
])
def test_hostile_text_is_refused(text, reason):
  assert reason in _refused(text)


def test_kernel_text_in_strings_and_comments_is_not_code():
  """A kernel named only in a comment or a string is not a kernel the cut launches or blanks:
  the halves keep that text verbatim where the source has it."""
  text = SOURCE.replace('"a must be a CUDA tensor"', '"add_kernel<<<1, 1>>>()"').replace(
      "#define TILE 256", "#define TILE 256\n// __global__ void ghost(int* p) { *p = 1; }")
  split = split_source.plan(text, NAMES)
  assert [k.name for k in split.kernels] == ["add_kernel"]
  assert '"add_kernel<<<1, 1>>>()"' in split.host
  assert "ghost" not in "".join(k.name for k in split.kernels)


def test_further_includes_are_named_in_order_without_those_of_comments_or_the_block():
  text = ("#include <torch/extension.h>\n#include <math.h>\n// #include <commented.h>\n"
          "/*\n#include <in_a_block_comment.h>\n*/\n#include <vector>\n"
          "#include <ATen/cuda/CUDAContext.h>\n#include <math.h>\n#include \"quoted.h\"\n")
  assert split_source.extra_includes(text, NAMES.block_includes) == (
      "math.h", "ATen/cuda/CUDAContext.h")
  assert split_source.extra_includes(SOURCE, NAMES.block_includes) == ()
  assert split_source.torch_header("ATen/cuda/CUDAContext.h")
  assert split_source.torch_header("c10/cuda/CUDAStream.h")
  assert not split_source.torch_header("math.h") and not split_source.torch_header("cublas_v2.h")


def test_names_for_further_includes_let_them_through_and_the_device_half_drops_torchs():
  text = SOURCE.replace("#include <cuda_runtime.h>",
                        "#include <cuda_runtime.h>\n#include <math.h>\n"
                        "#include <ATen/cuda/CUDAContext.h>")
  assert "includes math.h" in _refused(text)  # with the environment's names alone
  names = split_source.Names(NAMES.device, NAMES.host, NAMES.block_includes,
                             extras=("math.h", "ATen/cuda/CUDAContext.h"))
  split = split_source.plan(text, names)
  lines = text.split("\n")
  at = {h: next(i for i, line in enumerate(lines) if h in line)
        for h in ("math.h", "CUDAContext.h")}
  host, device = split.host.split("\n"), split.device.split("\n")
  # The host half (g++ after the lite headers) includes both as written; the device half, made
  # without torch, keeps <math.h> and leaves torch's header out, line numbers unchanged.
  assert host[at["math.h"]] == lines[at["math.h"]] == device[at["math.h"]]
  assert host[at["CUDAContext.h"]] == lines[at["CUDAContext.h"]]
  assert not device[at["CUDAContext.h"]].strip()
  # A further include the names were not computed with is still refused.
  assert "includes cublas_v2.h" in str(pytest.raises(
      split_source.Refused, split_source.plan,
      text.replace("#include <math.h>", "#include <math.h>\n#include <cublas_v2.h>"),
      names).value)


def test_names_are_computed_only_for_plain_header_paths_and_a_bounded_number_of_lists(tmp_path):
  ran = []

  async def run(argv, cwd):
    ran.append(argv)
    return 1, "no compiler here"

  store = split_names.Store(tmp_path, run)
  assert store.admits(()) and store.admits(("math.h",)) and store.admits(("ATen/cuda/x.h",))
  for bad in (("../../etc/passwd",), ("/etc/passwd",), ("a/../../b.h",), ("x.h\n#define y",),
              ("a b.h",), tuple(f"h{i}.h" for i in range(split_names.MAX_EXTRAS + 1))):
    assert not store.admits(bad), bad

  async def go():
    # Refused lists start nothing; each admitted one is computed (here: fails, so no names).
    assert await store.ensure(tmp_path, ["nvcc"], "", "extension", ("../x.h",)) is None
    assert not ran
    for i in range(split_names.MAX_EXTRA_LISTS):
      assert await store.ensure(tmp_path, ["nvcc"], "", "extension", (f"h{i}.h",)) is None
      assert store.failed(tmp_path, (f"h{i}.h",))
    started = len(ran)
    assert started >= split_names.MAX_EXTRA_LISTS
    assert not store.admits(("one_more.h",))
    assert await store.ensure(tmp_path, ["nvcc"], "", "extension", ("one_more.h",)) is None
    assert len(ran) == started and not store.failed(tmp_path, ("one_more.h",))
    assert store.admits(("h0.h",))  # a list already computed is not one more
    await store.close()
  asyncio.run(go())
