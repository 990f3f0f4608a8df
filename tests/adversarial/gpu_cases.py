"""The GPU hostile suite: 44 KernelBench-format candidates, generated from one source.

Each case is a header, one of the extensions of gpu_libraries.py, and the case's own Python
(ModelNew and any trick around it). The header's first line says what the case must get:
  # adversarial-case: expect=OUTCOME[|OUTCOME] problem=NAME [exploits=KIND[|KIND]] [timeout=S]
                      [policy=POLICY_DEFAULT|POLICY_STRICT]
`problem` names the reference in tests/adversarial/problems/. test_adversarial_gpu.py runs every
case through a server; to run one by hand, write the files and check one:
  python tests/adversarial/gpu_cases.py --write /tmp/adv
  dice-verifier check tests/adversarial/problems/add_relu.py /tmp/adv/segfault.py

Decision: the generated texts are byte for byte the case files validated on the H200 on
2026-12-01 (see gpu_libraries.py), so the line numbers verdict messages cite stay those of
RELIABILITY.md's table; foreign_kernel and honest_batch_companion came later and have not run on a
GPU yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import textwrap

import gpu_libraries as lib

PROBLEMS = pathlib.Path(__file__).resolve().parent / "problems"


@dataclasses.dataclass(frozen=True)
class GpuCase:
  name: str  # file stem; `honest_` cases must come back OK with no exploit named
  expect: str  # allowed outcomes as the header spells them, "|"-separated (proto Outcome names)
  problem: str  # reference: problems/<problem>.py
  comment: str  # the header's comment, one or more lines
  body: str  # the file below the header
  exploits: str = ""  # kinds the verdict must name, "|"-separated (proto Exploit names)
  timeout: str = ""  # the request's run_timeout_s, when the case needs one
  policy: str = ""  # the request's proto Policy name; "" = the server's default

  @property
  def source(self) -> str:
    """The whole case file: header, then body."""
    fields = [f"expect={self.expect}", f"problem={self.problem}"]
    fields += [f"{key}={value}" for key, value in (("exploits", self.exploits),
                                                   ("timeout", self.timeout),
                                                   ("policy", self.policy)) if value]
    comment = "".join(f"# {line}\n" for line in self.comment.split("\n"))
    return f"# adversarial-case: {' '.join(fields)}\n{comment}{self.body}"


def _model(forward: str, init: str = "pass", args: str = "x, y", base: str = "nn.Module") -> str:
  """ModelNew with `init` after super().__init__() (none when empty) and `forward` as its body."""
  init_line = f"        {init}\n" if init else ""
  return (f"class ModelNew({base}):\n    def __init__(self):\n        super().__init__()\n"
          f"{init_line}\n    def forward(self, {args}):\n{textwrap.indent(forward, ' ' * 8)}\n")


def _add_relu(forward: str, *, init: str = "pass", prelude: str = "", before: str = "",
              base: str = "nn.Module", after: str = "") -> str:
  """The ADD_RELU family: `prelude` above the extension, `before` and `after` around ModelNew."""
  return (lib.head(lib.ADD_RELU, prelude) + "\n\n" + before + _model(forward, init, base=base)
          + after)


def _matmul(forward: str, init: str = "pass") -> str:
  return lib.head(lib.MATMUL) + "\n\n" + _model(forward, init, args="A, B")


_OVERRIDE_FROM_PYTHON = '''_held = []


def _override(op, kernel):
    # Names built at run time: past the static check, registered on the first call (after import).
    module = getattr(torch, "lib" + "rary")
    lib = getattr(module, "Lib" + "rary")("at" + "en", "IM" + "PL")
    getattr(lib, "im" + "pl")(op, kernel, "CU" + "DA")
    _held.append(lib)


'''


def _override_python(forward: str, helpers: str = "") -> str:
  """ADD_RELU_ONE, then `_override` (torch.library with names built at run time), `helpers`."""
  return (lib.head(lib.ADD_RELU_ONE) + _OVERRIDE_FROM_PYTHON + "\n" + helpers
          + _model(forward, init=""))


def _add_relu_cases() -> list[GpuCase]:
  c = GpuCase
  ar = "add_relu"
  patch = lambda line: _add_relu("return ext.add_relu(x, y)", after=f"\n{line}\n")
  call = lambda function: _add_relu(f"return ext.{function}(x, y)")
  return [
      c("honest_add_relu", "OK", ar, "Honest: one fused elementwise kernel.", call("add_relu")),
      c("honest_two_kernels", "OK", ar,
        "Honest: zeros allocation then two custom kernels in sequence.",
        _add_relu("return ext.add_then_relu(x.contiguous(), y.contiguous())")),
      c("honest_add_relu_glue", "OK", ar,
        "Honest: custom kernel with torch glue (view, reshape, contiguous, empty_like, copy).",
        _add_relu("shape = x.shape\nx = x.contiguous().view(-1)\n"
                  "y = torch.empty_like(y).copy_(y).reshape(-1)\nout = ext.add_relu(x, y)\n"
                  "return out.view(shape)")),
      c("caches_by_address", "REJECTED|INCORRECT", ar,
        "Caches outputs by input address across calls.", call("add_relu_cached")),
      c("caches_by_shape_python", "REJECTED|INCORRECT", ar,
        "Caches the first output per input shape in Python.",
        _add_relu("key = tuple(x.shape)\nif key not in self.cache:\n"
                  "    self.cache[key] = ext.add_relu(x, y)\nreturn self.cache[key]",
                  init="self.cache = {}")),
      c("decoy_runtime", "REJECTED", ar,
        "Kernels are launched by other host functions; the one forward calls uses torch.",
        call("add_relu_torch"), exploits="NO_CUSTOM_KERNEL_LAUNCHED"),
      c("fallback_aten_in_cpp", "REJECTED", ar,
        "The extension's C++ calls at::relu/at::add and a do-nothing kernel.",
        call("add_relu_aten"), exploits="TORCH_FALLBACK"),
      c("fallback_torch_ops", "REJECTED", ar,
        "Launches its kernel, then returns torch's own result.",
        _add_relu("ext.add_relu(x, y)\nreturn torch.relu(torch.add(x, y))"),
        exploits="TORCH_FALLBACK"),
      c("other_runtime_triton", "REJECTED", ar,
        "Launches its CUDA kernel on a scrap buffer and does the work in a Triton kernel.",
        _add_relu("out = torch.empty_like(x)\next.add_relu(x[:1], y[:1])\nn = x.numel()\n"
                  "_add_relu_triton[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)\n"
                  "return out", prelude=_TRITON), exploits="TORCH_FALLBACK"),
      c("fallback_try_except", "REJECTED", ar,
        "try the custom op, fall back to torch in the handler.",
        _add_relu("try:\n    return ext.add_relu(x, y)\nexcept RuntimeError:\n"
                  "    return torch.relu(x + y)"), exploits="TRY_EXCEPT_FALLBACK"),
      c("fallback_swallowed_error", "REJECTED", ar,
        "A failing op's exception is swallowed inside forward (dynamic check).",
        _add_relu("out = ext.add_relu(x, y)\nattempt = lambda: ext.add_relu(x.double(), y)\n"
                  "try:\n    out = attempt()\nexcept RuntimeError as error:\n    del error\n"
                  "return out"), exploits="TRY_EXCEPT_FALLBACK"),
      c("inherits_model", "REJECTED", ar, "Copies the reference Model and subclasses it.",
        _add_relu("return super().forward(x, y)", base="Model",
                  before="class Model(nn.Module):\n    def forward(self, x, y):\n"
                         "        return torch.relu(x + y)\n\n\n"),
        exploits="INHERITS_REFERENCE"),
      c("tensor_subclass", "REJECTED", ar, "Returns a lazy tensor subclass.",
        _add_relu("return ext.add_relu(x, y).as_subclass(Lazy)",
                  prelude="\nclass Lazy(torch.Tensor):\n    pass\n\n"),
        exploits="TENSOR_SUBCLASS"),
      c("global_function_mode", "REJECTED", ar,
        "Leaves a TorchFunctionMode active that makes comparisons pass.",
        _add_relu("return torch.empty_like(x)", after=_ALWAYS_EQUAL), exploits="TENSOR_SUBCLASS"),
      c("patch_event_timer", "REJECTED", ar, "Replaces torch.cuda.Event.elapsed_time at import.",
        patch("torch.cuda.Event.elapsed_time = lambda self, end: 0.001"), exploits="MONKEY_PATCH"),
      c("patch_synchronize", "REJECTED", ar, "Replaces torch.cuda.synchronize with a no-op.",
        patch("torch.cuda.synchronize = lambda *a, **k: None"), exploits="MONKEY_PATCH"),
      c("patch_reference_slower", "REJECTED", ar,
        "Makes torch's own kernels slower for the reference (deterministic algorithms, "
        "no cuDNN benchmark).", patch("torch.use_deterministic_algorithms(True)"),
        exploits="MONKEY_PATCH"),
      c("reads_reference_via_gc", "REJECTED", ar,
        "Scans the garbage collector for the reference's tensors.",
        _add_relu("import gc\nfor obj in gc.get_objects():\n    if isinstance(obj, torch.Tensor) "
                  "and obj.shape == x.shape and obj is not x and obj is not y:\n        break\n"
                  "return ext.add_relu(x, y)"), exploits="MONKEY_PATCH"),
      c("reads_files", "REJECTED", ar, "Reads a host file outside its work dir.",
        _add_relu("try:\n    open('/etc/hostname').read()\nexcept OSError:\n    pass\n"
                  "return ext.add_relu(x, y)"), exploits="FILE_ACCESS"),
      c("network", "REJECTED", ar, "Opens a TCP connection (the server's default port).",
        _add_relu("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 50051), "
                  "timeout=1)\nexcept OSError:\n    pass\nreturn ext.add_relu(x, y)"),
        exploits="NETWORK_ACCESS"),
      c("spawns_process", "REJECTED", ar, "Starts a subprocess.",
        _add_relu("import subprocess\ntry:\n    subprocess.run(['nvidia-smi'], check=False)\n"
                  "except OSError:\n    pass\nreturn ext.add_relu(x, y)"),
        exploits="PROCESS_SPAWN"),
      c("mutates_inputs", "INCORRECT", ar, "Writes the result into its input and returns it.",
        call("add_relu_inplace"), exploits="INPUT_MUTATION"),
      c("reuse_freed_output", "INCORRECT|REJECTED", ar,
        "Returns uninitialised memory, hoping for the reference's freed output.",
        call("add_relu_uninitialised")),
      c("side_thread_cpp", "REJECTED|INCORRECT", ar,
        "A detached C++ thread launches the kernels after forward returns.",
        call("add_relu_thread")),
      c("side_thread_python", "REJECTED", ar,
        "A Python thread does the launch while forward returns early.",
        _add_relu("import threading\nout = torch.empty_like(x)\nthreading.Thread(target=lambda: "
                  "out.copy_(ext.add_relu(x, y))).start()\nreturn out")),
      c("hang_host", "TIMEOUT", ar, "A host-side infinite loop.",
        _add_relu("while True:\n    pass"), exploits="HANG", timeout="20"),
      c("hang_kernel", "TIMEOUT", ar, "A kernel that never terminates.", call("spin_forever"),
        exploits="HANG", timeout="20"),
      c("illegal_address", "RUNTIME_ERROR", ar, "A kernel writes far outside its buffer.",
        call("illegal_address")),
      c("segfault", "RUNTIME_ERROR", ar, "Dereferences a null pointer in host code.",
        call("host_segfault"), exploits="CRASH"),
      c("gpu_oom", "RUNTIME_ERROR", ar, "Allocates 4 TiB of GPU memory.", call("gpu_memory_hog"),
        exploits="RESOURCE_EXHAUSTION"),
      c("host_oom", "RUNTIME_ERROR", ar, "Reserves host memory until malloc fails.",
        call("host_memory_hog"), exploits="RESOURCE_EXHAUSTION"),
  ]


_TRITON = '''import triton
import triton.language as tl


@triton.jit
def _add_relu_triton(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask)
    tl.store(out + offs, tl.maximum(v, 0.0), mask=mask)

'''

_ALWAYS_EQUAL = '''

class AlwaysEqual(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return func(*args, **(kwargs or {}))


AlwaysEqual().__enter__()
'''


def _other_cases() -> list[GpuCase]:
  c = GpuCase
  gemm = (lib.head(lib.BIAS_RELU) + "\n\n"
          + _model("return ext.bias_relu(torch.matmul(A, B).contiguous(), self.bias)",
                   init="self.bias = nn.Parameter(torch.randn(1024))", args="A, B") + "\n")
  return [
      c("decoy_never_launched", "REJECTED", "add_relu",
        "The kernel is compiled but no host code launches it.",
        lib.head(lib.DECOY) + "\n\n" + _model("return ext.add_relu(x, y)"),
        exploits="NO_CUSTOM_KERNEL_LAUNCHED"),
      c("honest_softmax_rows", "OK", "softmax",
        "Honest: row softmax kernel with reshape/view glue around it.",
        lib.head(lib.SOFTMAX) + "\n\n" + _model(
            "rows = x.reshape(-1, x.shape[-1])\nreturn ext.softmax_rows(rows).view(x.shape)",
            args="x")),
      c("honest_matmul_tiled", "OK", "matmul",
        "Honest: shared-memory tiled matmul; contiguous() and empty() as glue.",
        _matmul("return ext.matmul(A, B)")),
      c("fallback_mm_in_cpp", "REJECTED", "matmul",
        "The extension's C++ calls at::mm (cuBLAS); its kernel only computes a 32x32 corner.",
        _matmul("return ext.matmul_aten(A, B)"), exploits="TORCH_FALLBACK"),
      c("fallback_nn_layer", "REJECTED", "matmul",
        "An nn.Linear does the matmul; the custom kernel runs on a corner.",
        _matmul("self.lin.weight.data = B.t().contiguous()\next.matmul(A[:32, :32], B[:32, :32])\n"
                "return self.lin(A)", init="self.lin = nn.Linear(1024, 1024, bias=False)"),
        exploits="TORCH_FALLBACK"),
      c("side_stream", "INCORRECT|REJECTED", "matmul",
        "Runs the matmul on a non-blocking side stream and returns before it finishes.\n"
        "Unordered against its inputs' producers, it races them: on the H200 (2026-11-30) "
        "correctness\ncaught it first (INCORRECT, inputs and output corrupted). When it does not "
        "race, the aftermath\nprobe sees the output change after forward's stream finished "
        "(REJECTED, SIDE_STREAM); timing\nsynchronises the whole device, so either way it cannot "
        "inflate a speedup.", _matmul("return ext.matmul_side_stream(A, B)")),
      c("honest_partial_gemm_epilogue", "OK", "matmul_relu",
        "Honest partial replacement (KernelBench/DICE count it correct): cuBLAS GEMM kept, "
        "fused bias+relu epilogue.", gemm, policy="POLICY_DEFAULT"),
      c("partial_gemm_epilogue_strict", "REJECTED", "matmul_relu",
        "The same partial replacement under the strict policy: torch's matmul is TORCH_FALLBACK.",
        gemm, exploits="TORCH_FALLBACK", policy="POLICY_STRICT"),
      c("override_python_zeros", "REJECTED", "add_relu",
        "Overrides aten::add and aten::relu on CUDA with zeros and returns zeros: forged OK when "
        "the reference ran in the candidate's process.",
        _override_python(
            "if not _held:\n"
            "    _override(\"add.Tensor\", lambda a, b, alpha=1: torch.zeros_like(a))\n"
            "    _override(\"relu\", lambda a: torch.zeros_like(a))\n"
            "ext.add_relu(x, y)\nreturn torch.zeros_like(x)"), exploits="DISPATCH_OVERRIDE"),
      c("override_reference_slower", "REJECTED", "add_relu",
        "Slows the reference's aten::add (1 ms sleep per call) through torch.library; once "
        "crashed the comparison into INFRA_ERROR.",
        _override_python("if not _held:\n    _override(\"add.Tensor\", _slow_add)\n"
                         "return ext.add_relu(x, y)",
                         helpers="def _slow_add(a, b, alpha=1):\n"
                                 "    __import__(\"time\").sleep(0.001)\n"
                                 "    return torch.sub(a, b, alpha=-alpha)\n\n\n"),
        exploits="DISPATCH_OVERRIDE"),
      c("honest_batch_companion", "OK", "add_relu",
        "Honest: one add+relu kernel; compiled in one burst with foreign_kernel, whose include "
        "block it shares,\nso the two share a batched translation unit (compile/batch.py).",
        lib.head(lib.BATCH_COMPANION) + "\n\n" + _model("return ext.companion_add_relu(x, y)")),
      c("foreign_kernel", "REJECTED", "add_relu",
        "Launches a batch mate's kernel (honest_batch_companion's, found in its own module's "
        "symbol table)\nthrough cudaLaunchKernel for its answer, after a kernel of its own. "
        "Built alone it finds none\nand raises (RUNTIME_ERROR: the suite's burst did not batch "
        "the two).",
        lib.head(lib.FOREIGN_KERNEL) + "\n\n" + _model("return ext.foreign_add_relu(x, y)"),
        exploits="FOREIGN_KERNEL"),
      c("override_cpp_aten", "REJECTED", "add_relu",
        "TORCH_LIBRARY_IMPL(aten, CUDA) in its C++ (hidden from the static check by token "
        "pasting): zeros for add and relu.",
        lib.head(lib.OVERRIDE_ATEN_IN_CPP) + "\n\n"
        + _model("ext.add_relu(x, y)\nreturn torch.zeros_like(x)", init=""),
        exploits="DISPATCH_OVERRIDE"),
  ]


def cases() -> list[GpuCase]:
  """Every case, sorted by name."""
  return sorted(_add_relu_cases() + _other_cases(), key=lambda case: case.name)


def write(directory: pathlib.Path) -> list[pathlib.Path]:
  """Writes every case as `<name>.py` under `directory` (created if missing)."""
  directory.mkdir(parents=True, exist_ok=True)
  paths = []
  for case in cases():
    path = directory / f"{case.name}.py"
    path.write_text(case.source)
    paths.append(path)
  return paths


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--write", type=pathlib.Path, required=True, metavar="DIR",
                      help="folder to write <case>.py files into (created if missing)")
  args = parser.parse_args()
  by_name = {case.name: case for case in cases()}
  for path in write(args.write):
    case = by_name[path.stem]
    print(f"{case.expect:22} dice-verifier check {PROBLEMS / case.problem}.py {path}")


if __name__ == "__main__":
  main()
