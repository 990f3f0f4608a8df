"""The verifier's own load_inline build path: same sources as torch, real nvcc, cache, fallbacks."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import torch.utils.cpp_extension

from verifier_service import buildspec
from verifier_service import checks
from verifier_service import compile as compile_lib

import verifier_kernels as kernels


def _extension(candidate: str, allow_cpu_only: bool = False):
  (ext,) = checks.check_candidate(candidate, allow_cpu_only=allow_cpu_only).extensions
  return ext


def _build(toolchain, cache_dir, ext, timeout_s: float = 900) -> compile_lib.BuildResult:
  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir, max_jobs=2)
    return await compiler.build(ext, timeout_s)
  return asyncio.run(go())


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


def test_lighten_rewrites_only_the_extension_include():
  text = '#include <torch/extension.h>\n  # include "torch/extension.h"\n#include <cuda.h>\n'
  assert buildspec.lighten(text) == (
      '#include <torch/types.h>\n#include <torch/types.h>\n#include <cuda.h>\n')
  assert buildspec.lighten("#include <torch/types.h>\n") is None


def test_bound_log_keeps_head_and_tail():
  text = "first error\n" + "x" * 10_000 + "\nlast line"
  bounded, truncated = compile_lib.bound_log(text, 1000)
  assert truncated and bounded.startswith("first error") and bounded.endswith("last line")
  assert len(bounded) < 1100
  assert compile_lib.bound_log("short", 1000) == ("short", False)


def test_cuda_build_uses_light_header_and_pch_and_loads(toolchain, cache_dir):
  result = _build(toolchain, cache_dir, _extension(kernels.cuda_candidate()))
  assert result.ok, result.log
  assert result.light_header and result.pch_used
  again = _build(toolchain, cache_dir, _extension(kernels.cuda_candidate()))
  assert again.cache_hit and again.so_path == result.so_path
  probe = textwrap.dedent(f"""
      import importlib.util, torch
      spec = importlib.util.spec_from_file_location("scaled_add_ext", {result.so_path!r})
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      print(module.scaled_add.__doc__)
  """)
  proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                        timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "scaled_add" in proc.stdout


def test_cpp_extension_runs_and_computes(toolchain, cache_dir):
  result = _build(toolchain, cache_dir,
                  _extension(kernels.cpp_candidate("scaled_add"), allow_cpu_only=True))
  assert result.ok, result.log
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


def test_light_header_falls_back_to_the_original(toolchain, cache_dir):
  result = _build(toolchain, cache_dir, _extension(kernels.NEEDS_EXTENSION_H))
  assert result.ok, result.log
  assert not result.light_header


def test_compile_errors_are_cached(toolchain, cache_dir):
  ext = _extension(kernels.BROKEN_CUDA)
  first = _build(toolchain, cache_dir, ext)
  assert not first.ok and not first.timed_out
  assert "s_typo" in first.log
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
    compiler = compile_lib.Compiler(toolchain, cache_dir, max_jobs=1)
    return compiler.flags(_extension(kernels.cuda_candidate()))
  result = asyncio.run(flags())
  assert f"-L{toolchain.cuda_root}/lib64" in result.ldflags
  assert result.nvcc[0].startswith(toolchain.cuda_root)
  assert "-gencode=arch=compute_90,code=sm_90" in result.cuda_cflags
