"""What torch's `load_inline` would build: its exact source files and compiler flags.

The verifier compiles candidates itself (compiler.py) but must build exactly what
`torch.utils.cpp_extension.load_inline` builds, or verdicts could differ from the naive path.
`render_sources` writes main.cpp and cuda.cu the way load_inline does (tested byte for byte
against torch); `torch_build_flags` runs torch's own ninja writer for the extension and reads
the flags back, so they follow whatever torch version is installed (2.11 on the GPU image, 2.14
in CI). Lighter headers are compiler.py's business (header_tiers.py), never this module's.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import shlex
import tempfile

from verifier_service.compile import sources
from verifier_service.compile import toolchain as toolchain_lib



@dataclasses.dataclass(frozen=True)
class BuildFlags:
  """Compiler command pieces as torch's ninja writer emits them for one extension."""
  cxx: tuple[str, ...]
  nvcc: tuple[str, ...]
  cflags: tuple[str, ...]
  post_cflags: tuple[str, ...]
  cuda_cflags: tuple[str, ...]
  cuda_post_cflags: tuple[str, ...]
  ldflags: tuple[str, ...]


def render_sources(ext: sources.InlineExtension) -> tuple[str, str | None]:
  """main.cpp and cuda.cu text, exactly as load_inline writes them."""
  cpp = list(ext.cpp_sources)
  if not ext.no_implicit_headers:
    cpp.insert(0, "#include <torch/extension.h>")
  if ext.functions is not None:
    cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
    for function, doc in ext.functions:
      if ext.with_pytorch_error_handling:
        cpp.append(f'm.def("{function}", torch::wrap_pybind_function({function}), "{doc}");')
      else:
        cpp.append(f'm.def("{function}", {function}, "{doc}");')
    cpp.append("}")
  if not ext.cuda_sources:
    return "\n".join(cpp), None
  cuda = list(ext.cuda_sources)
  if not ext.no_implicit_headers:
    cuda = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"] + cuda
  return "\n".join(cpp), "\n".join(cuda)


def _call_with_supported(fn, **kwargs):
  """Calls a torch-private function with only the keyword arguments its version accepts."""
  params = inspect.signature(fn).parameters
  return fn(**{k: v for k, v in kwargs.items() if k in params})


def torch_build_flags(ext: sources.InlineExtension, with_cuda: bool,
                      toolchain: toolchain_lib.Toolchain) -> BuildFlags:
  """Runs torch's own ninja writer for `ext` in a scratch folder and reads the flags back.

  torch reads CUDA_HOME once, when cpp_extension is first imported (possibly before toolchain
  discovery), so the discovered root and arch list are put in place for the duration.
  """
  from torch.utils import cpp_extension  # pylint: disable=import-outside-toplevel
  saved = cpp_extension.CUDA_HOME, os.environ.get("TORCH_CUDA_ARCH_LIST")
  cpp_extension.CUDA_HOME = toolchain.cuda_root
  os.environ["TORCH_CUDA_ARCH_LIST"] = toolchain.arch_list
  try:
    return _torch_build_flags(cpp_extension, ext, with_cuda)
  finally:
    cpp_extension.CUDA_HOME = saved[0]
    if saved[1] is None:
      os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    else:
      os.environ["TORCH_CUDA_ARCH_LIST"] = saved[1]


def _torch_build_flags(cpp_extension, ext: sources.InlineExtension,
                       with_cuda: bool) -> BuildFlags:
  with tempfile.TemporaryDirectory(prefix="dice-flags-") as scratch:
    srcs = [os.path.join(scratch, "main.cpp")]
    if with_cuda:
      srcs.append(os.path.join(scratch, "cuda.cu"))
    ldflags = _call_with_supported(
        cpp_extension._prepare_ldflags, extra_ldflags=list(ext.extra_ldflags),  # pylint: disable=protected-access
        with_cuda=with_cuda, with_sycl=False, verbose=False, is_standalone=False)
    path = os.path.join(scratch, "build.ninja")
    _call_with_supported(
        cpp_extension._write_ninja_file_to_build_library,  # pylint: disable=protected-access
        path=path, name=ext.name, sources=srcs, extra_cflags=list(ext.extra_cflags),
        extra_cuda_cflags=list(ext.extra_cuda_cflags), extra_sycl_cflags=[],
        extra_ldflags=ldflags, extra_include_paths=list(ext.extra_include_paths),
        with_cuda=with_cuda, with_sycl=False, is_python_module=True, is_standalone=False,
        torch_exclude=False)
    variables = {}
    with open(path, encoding="utf-8") as f:
      for line in f:
        match = re.match(r"^(\w+) = (.*)$", line.rstrip("\n"))
        if match:
          variables[match.group(1)] = match.group(2)
  split = lambda key: tuple(shlex.split(variables.get(key, "")))
  return BuildFlags(cxx=split("cxx"), nvcc=split("nvcc"), cflags=split("cflags"),
                    post_cflags=split("post_cflags"), cuda_cflags=split("cuda_cflags"),
                    cuda_post_cflags=split("cuda_post_cflags"), ldflags=split("ldflags"))
