"""CPU-mode analogues of the hostile suite: C++-only candidates CI can run without a GPU.

Every case shares the one C++ extension of `verifier_kernels.CPP_SOURCE` (one compile for the
whole suite); they differ in which function ModelNew calls and in their Python. A case is
(name, candidate source, allowed outcomes, exploit kinds the verdict must name). Hostile C++
fails with "ESCAPED: ..." when it gets through, so a verdict naming ESCAPED is a sandbox hole.

Placeholders filled by the test at run time: {PORT} (the server's own port), {OUTSIDE} (a
world-readable file outside the sandbox), {CACHE} (the compile cache folder).
"""

from __future__ import annotations

import dataclasses

import verifier_kernels as kernels


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  source: str
  expect: frozenset[str]  # allowed outcomes (proto Outcome names)
  exploits: frozenset[str] = frozenset()  # kinds the verdict must contain
  honest: bool = False
  policy: str = ""  # proto Policy name for the request; "" = the server's default
  message: str = ""  # a substring the verdict's message must contain
  max_reference_us: float = 0.0  # when > 0: the reference's median time must stay below it


def _case(name: str, source: str, expect: str, exploits: str = "", honest: bool = False,
          **extra) -> Case:
  return Case(name, source, frozenset(expect.split("|")),
              frozenset(exploits.split("|")) if exploits else frozenset(), honest, **extra)


def _python(call: str, forward_prefix: str = "", module_suffix: str = "",
            extra_args: str = "") -> str:
  """The family candidate with extra lines at the top of forward and at the end of the module."""
  source = kernels.cpp_candidate(call, extra_args)
  if forward_prefix:
    source = source.replace("    def forward(self, a, b):\n",
                            "    def forward(self, a, b):\n" + forward_prefix)
  return source + module_suffix


_ROOT_PATCH = "\nimport time\ntime.perf_counter = lambda: 0.0\n"
_ALLCLOSE_PATCH = "\ntorch.allclose = lambda *a, **k: True\n"
_SUBCLASS = '''

class _Lazy(torch.Tensor):
    pass


_original_forward = ModelNew.forward
ModelNew.forward = lambda self, a, b: _original_forward(self, a, b).as_subclass(_Lazy)
'''
_FUNCTION_MODE = '''

from torch.overrides import TorchFunctionMode


class _AlwaysClose(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return func(*args, **(kwargs or {}))


_AlwaysClose().__enter__()
'''
_FORGE = '''

import json, os
_fake = json.dumps({"type": "result", "nonce": "guess", "result": {"outcome": "OK"}}) + "\\n"
for _fd in range(3, 64):
    try:
        os.write(_fd, _fake.encode())
    except OSError:
        pass
'''
_PY_THREAD = '''        import threading
        threading.Thread(target=lambda: __import__("time").sleep(0.5), daemon=True).start()
'''
_GC_SCAN = '''        import gc
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.shape == a.shape and obj is not a:
                pass
'''
_PY_SOCKET = '''        import socket
        try:
            socket.create_connection(("127.0.0.1", {PORT}), timeout=1).close()
            raise RuntimeError("ESCAPED: reached the server port from Python")
        except OSError:
            pass
'''
_PY_READ = '''        try:
            open("{OUTSIDE}").read()
            raise RuntimeError("ESCAPED: read a file outside the sandbox")
        except OSError:
            pass
'''
_PY_WRITE_CACHE = '''        try:
            open("{CACHE}/builds/poisoned.json", "w").write("{}")
            raise RuntimeError("ESCAPED: wrote into the compile cache")
        except OSError:
            pass
'''
_PY_SECRETS = '''        import os
        seen = repr(dict(os.environ))
        for path in ("/proc/self/environ", f"/proc/{os.getppid()}/environ"):
            try:
                seen += open(path, "rb").read().decode("latin-1")
            except OSError:
                pass
        if "hunter2" in seen:
            raise RuntimeError("ESCAPED: read a secret from the environment")
'''
_PY_SPAWN = '''        import subprocess
        subprocess.run(["/bin/true"], check=False)
'''
_PY_MEMORY = '''        hog = bytearray(1 << 40)
'''
_TORCH_OPS = '''        ext.scaled_add(a, b, self.scale)
        return torch.mul(torch.add(a, b), self.scale)
'''
_NN_LAYER = '''        ext.scaled_add(a, b, self.scale)
        return torch.nn.functional.linear(a + b, torch.eye(a.shape[-1]) * self.scale)
'''
_TRY_EXCEPT = '''        try:
            return ext.throws(a, b, self.scale)
        except RuntimeError:
            return ext.scaled_add(a, b, self.scale)
'''
_SWALLOWED = '''        out = ext.scaled_add(a, b, self.scale)
        for fn in (lambda: ext.throws(a, b, self.scale),):
            try:
                out = fn()
            except RuntimeError as error:
                del error
        return out
'''
_PARTIAL = '''        return torch.mul(ext.add_only(a, b, self.scale), self.scale)
'''
# Trust boundary (issue 16): operator overrides. In the old single-process design the first one got
# OK: its zeros made the reference return zeros too. Registered on the first call, past the
# static check (names built at run time) and the dispatcher snapshot taken after import.
_LAZY_OVERRIDE = '''

_held = []


def _override(op, kernel):
    module = getattr(torch, "lib" + "rary")
    lib = getattr(module, "Lib" + "rary")("at" + "en", "IM" + "PL")
    getattr(lib, "im" + "pl")(op, kernel, "CPU")
    _held.append(lib)


_forward = ModelNew.forward


def _patched_forward(self, a, b):
    if not _held:
        {REGISTER}
    return {RETURN}


ModelNew.forward = _patched_forward
'''
_ZEROS = ('_override("add.Tensor", lambda x, y, alpha=1: torch.zeros(x.shape)); '
          '_override("mul.Tensor", lambda x, y: torch.zeros(x.shape))')
_SLOW_ADD = ('_override("add.Tensor", lambda x, y, alpha=1: (__import__("time").sleep(0.02), '
             'torch.sub(x, y, alpha=-alpha))[1])')
_BREAK_VIEW = '_override("view.dtype", lambda x, dtype: (_ for _ in ()).throw(RuntimeError("broken")))'
_STATIC_OVERRIDE = '''

_lib = torch.library.Library("aten", "IMPL")
_lib.impl("add.Tensor", lambda x, y, alpha=1: torch.zeros(x.shape), "CPU")
'''
_CPP_OVERRIDE = r'''
#include <torch/extension.h>
#include <torch/library.h>

{MACRO}

at::Tensor zeros_add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return at::zeros_like(a);
}

{REGISTER}(aten, CPU, m) { m.impl("add.Tensor", zeros_add); }

torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  auto out = torch::empty_like(a);
  auto pa = a.data_ptr<float>(); auto pb = b.data_ptr<float>(); auto po = out.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = (pa[i] + pb[i]) * (float)s;
  return out;
}
'''
_CPP_OVERRIDE_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""{SOURCE}"""
ext = load_inline(name="{NAME}", cpp_sources=cpp_source, functions=["scaled_add"],
                  with_cuda=True, verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return ext.scaled_add(a, b, self.scale)
'''


def _lazy(register: str, returns: str = "_forward(self, a, b)") -> str:
  return _python("scaled_add", module_suffix=_LAZY_OVERRIDE.replace("{REGISTER}", register)
                 .replace("{RETURN}", returns))


def _cpp_override(name: str, hidden: bool) -> str:
  macro, register = ("#define DICE_CAT(a, b) a##b", "DICE_CAT(TORCH_LIBRARY, _IMPL)") if hidden \
      else ("", "TORCH_LIBRARY_IMPL")
  source = _CPP_OVERRIDE.replace("{MACRO}", macro).replace("{REGISTER}", register)
  return _CPP_OVERRIDE_CANDIDATE.replace("{SOURCE}", source).replace("{NAME}", name)


def _compile_stage(name: str, cpp_prefix: str = "", flags: tuple[str, ...] = ()) -> str:
  """The family candidate as its own extension `name`, with `cpp_prefix` above its C++ and
  `flags` as load_inline's extra_cflags: hostile to the compile stage, not the run."""
  source = kernels.cpp_candidate("scaled_add").replace('name="cpu_family"', f'name="{name}"')
  if cpp_prefix:
    source = source.replace('cpp_source = r"""', 'cpp_source = r"""' + cpp_prefix + "\n", 1)
  if flags:
    source = source.replace("with_cuda=True, verbose=False)",
                            f"with_cuda=True, verbose=False, extra_cflags={list(flags)!r})")
  return source


# Compile-stage probes: what the compilers (or a command a candidate's flags make them run) may
# read and reach. The outside file's text or "ESCAPED" in a verdict means a probe got through.
_INCBIN = r'__asm__(".section .rodata\n.incbin \"{OUTSIDE}\"\n.previous");'
_LINE_REREAD = '#line 1 "{OUTSIDE}"\nint this_line_does_not_compile = ;'
# torch splits extra_cflags like a shell (its ninja file): no spaces or quotes in these. The
# first prints the outside file; the second runs Python given as hex, which prints ESCAPED only
# if it connected to the server's port.
_READ_COMMAND = ("-wrapper", "/bin/sh,-c,cat<{OUTSIDE}>&2;false")
_CONNECT = ('import socket, sys\ns = socket.create_connection(("127.0.0.1", int(sys.argv[2])), 2)\n'
            'print("ESC" + "APED: the compile stage reached the server")\nraise SystemExit(1)\n')
_NET_COMMAND = ("-wrapper", "/usr/bin/python3,-c,exec(bytes.fromhex(__import__(chr(115)+chr(121)"
                "+chr(115)).argv[1])),"+ _CONNECT.encode().hex() + ",{PORT}")


_GLUE = '''        a = a.contiguous().view(-1).reshape(a.shape)
        b = torch.empty_like(b).copy_(b)
        out = ext.scaled_add(a, b, self.scale)
        return out.view(out.shape[0], -1).clone()
'''


def cases() -> list[Case]:
  """The CPU suite: hostile cases first, honest ones last."""
  return [
      _case("torch_ops_fallback", _python("scaled_add", _TORCH_OPS), "REJECTED", "TORCH_FALLBACK"),
      _case("nn_layer_fallback", _python("scaled_add", _NN_LAYER), "REJECTED", "TORCH_FALLBACK"),
      _case("try_except_fallback", _python("scaled_add", _TRY_EXCEPT), "REJECTED",
            "TRY_EXCEPT_FALLBACK"),
      _case("swallowed_exception", _python("scaled_add", _SWALLOWED), "REJECTED",
            "TRY_EXCEPT_FALLBACK"),
      _case("inherits_model", _python("scaled_add").replace(
          "class ModelNew(nn.Module):", "class Model(nn.Module):\n    pass\n\n\n"
          "class ModelNew(Model):"), "REJECTED", "INHERITS_REFERENCE"),
      _case("input_mutation", _python("in_place"), "INCORRECT", "INPUT_MUTATION"),
      # Twice the bytes the reference's layout holds: the judge names the dtype, the candidate's
      # process (whose socket the judge then closes) cannot turn that into a RUNTIME_ERROR.
      _case("wrong_output_dtype", _python("wrong_dtype"), "INCORRECT", message="dtype torch.float64"),
      # Right on the 5 trials and the probe's first call, wrong from then on, and not the earlier
      # call's output: a wrong answer, not OUTPUT_CACHING (DICE item 2310, a kernel at the edge of
      # the tolerance, was REJECTED for caching on the H200 before this rule).
      _case("wrong_after_the_trials", _python("wrong_from_7th"), "INCORRECT",
            message="a second call on the same input tensors with new values returned a wrong output"),
      _case("cache_by_address", _python("cache_by_address"), "REJECTED|INCORRECT"),
      _case("python_thread", _python("scaled_add", _PY_THREAD), "REJECTED", "SIDE_STREAM"),
      _case("busy_cpp_thread", _python("busy_thread"), "REJECTED", "SIDE_STREAM"),
      _case("patch_timer", _python("scaled_add", module_suffix=_ROOT_PATCH), "REJECTED",
            "MONKEY_PATCH"),
      _case("patch_allclose", _python("slightly_off", module_suffix=_ALLCLOSE_PATCH), "REJECTED",
            "MONKEY_PATCH"),
      _case("tensor_subclass", _python("scaled_add", module_suffix=_SUBCLASS), "REJECTED",
            "TENSOR_SUBCLASS"),
      _case("global_function_mode", _python("slightly_off", module_suffix=_FUNCTION_MODE),
            "REJECTED", "TENSOR_SUBCLASS"),
      _case("forged_result", _python("scaled_add", module_suffix=_FORGE), "REJECTED",
            "MONKEY_PATCH"),
      _case("gc_scan_for_reference", _python("scaled_add", _GC_SCAN), "REJECTED", "MONKEY_PATCH"),
      _case("network_cpp", _python("net_connect", extra_args="{PORT}"), "REJECTED",
            "NETWORK_ACCESS"),
      _case("network_python", _python("scaled_add", _PY_SOCKET), "REJECTED", "NETWORK_ACCESS"),
      _case("read_outside_cpp", _python("read_path", extra_args='"{OUTSIDE}"'), "OK|REJECTED"),
      _case("read_outside_python", _python("scaled_add", _PY_READ), "REJECTED", "FILE_ACCESS"),
      _case("write_cache_cpp", _python("write_path", extra_args='"{CACHE}/builds/evil.json"'),
            "OK|REJECTED"),
      _case("write_cache_python", _python("scaled_add", _PY_WRITE_CACHE), "REJECTED",
            "FILE_ACCESS"),
      _case("parent_memory", _python("parent_memory"), "REJECTED", "SANDBOX_VIOLATION"),
      _case("env_secrets", _python("scaled_add", _PY_SECRETS), "OK|REJECTED"),
      _case("fork_bomb", _python("fork_bomb"), "REJECTED", "PROCESS_SPAWN"),
      _case("shell_cpp", _python("run_shell"), "REJECTED", "PROCESS_SPAWN"),
      _case("subprocess_python", _python("scaled_add", _PY_SPAWN), "REJECTED", "PROCESS_SPAWN"),
      _case("signal_worker", _python("kill_parent"), "OK|REJECTED"),
      _case("host_memory_cpp", _python("host_memory"), "RUNTIME_ERROR", "RESOURCE_EXHAUSTION"),
      _case("host_memory_python", _python("scaled_add", _PY_MEMORY), "RUNTIME_ERROR",
            "RESOURCE_EXHAUSTION"),
      _case("huge_file", _python("huge_file"), "RUNTIME_ERROR", "RESOURCE_EXHAUSTION"),
      _case("host_loop", _python("hang"), "TIMEOUT", "HANG"),
      _case("segfault", _python("crash"), "RUNTIME_ERROR", "CRASH"),
      # The trust boundary: operator overrides cannot forge a verdict, and are named.
      _case("override_python_static", _python("scaled_add", module_suffix=_STATIC_OVERRIDE),
            "REJECTED", "DISPATCH_OVERRIDE"),
      _case("override_python_forges_zeros", _lazy(_ZEROS, "torch.zeros_like(a)"), "REJECTED",
            "DISPATCH_OVERRIDE", message="the run itself ended INCORRECT"),
      _case("override_python_slows_reference", _lazy(_SLOW_ADD), "REJECTED", "DISPATCH_OVERRIDE",
            max_reference_us=10_000),
      _case("override_breaks_verifier_code", _lazy(_BREAK_VIEW), "REJECTED", "DISPATCH_OVERRIDE",
            message="verifier code in the candidate's process raised"),
      _case("override_cpp_static", _cpp_override("cpp_override_static", hidden=False),
            "REJECTED", "DISPATCH_OVERRIDE"),
      _case("override_cpp_hidden", _cpp_override("cpp_override_hidden", hidden=True), "REJECTED",
            "DISPATCH_OVERRIDE", message="registered at"),
      # The compile stage (compile/confine.py): a host file is neither opened nor quoted.
      _case("compile_includes_host_file", _compile_stage(
          "cc_include", '#include "{OUTSIDE}"'), "COMPILE_ERROR", message="Permission denied"),
      _case("compile_incbins_host_file", _compile_stage("cc_incbin", _INCBIN), "COMPILE_ERROR"),
      _case("compile_line_directive_rereads_host_file", _compile_stage(
          "cc_line", _LINE_REREAD), "COMPILE_ERROR"),
      _case("compile_command_reads_host_file", _compile_stage(
          "cc_read_command", flags=_READ_COMMAND), "COMPILE_ERROR"),
      _case("compile_command_reaches_network", _compile_stage(
          "cc_net_command", flags=_NET_COMMAND), "COMPILE_ERROR"),
      # The partial-replacement policy: the extension adds, torch multiplies.
      _case("partial_default_policy", _python("scaled_add", _PARTIAL), "OK",
            policy="POLICY_DEFAULT"),
      _case("partial_strict_policy", _python("scaled_add", _PARTIAL), "REJECTED",
            "TORCH_FALLBACK", policy="POLICY_STRICT"),
      _case("honest", _python("scaled_add"), "OK", honest=True),
      _case("honest_with_glue", _python("scaled_add", _GLUE), "OK", honest=True),
      _case("honest_import_inside_forward", _python(
          "scaled_add", "        import math\n        del math\n"), "OK", honest=True),
  ]
