"""The split path end to end (verifier_service/compile/device_split.py): real nvcc, real g++,
real torch headers. A source the cut accepts is built in two halves and linked; its kernels'
SASS equals the lite tier's build of the same source, its module exports the same symbols and
its host functions answer alike (on CPU tensors: no GPU here). A refused source, and a source
whose half does not compile, take the usual path with the usual outcome (COMPILE_ERROR's log
included). One module-scoped run builds everything, with the split on and off, so the names and
the precompiled host header are computed once (a few minutes on 2 cores)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from verifier_service.compile import batch as batch_lib
from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import limits as limits_lib

import verifier_kernels as kernels

pytestmark = pytest.mark.slow

GOOD = r'''
#include <torch/extension.h>
#include <cuda_runtime.h>
#define TILE 256

__device__ float twice(float x) { return 2.0f * x; }

__global__ void scaled_add_kernel(const float* a, const float* b, float* out, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = twice(a[i] + b[i]) * s;
}

torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  TORCH_CHECK(a.dim() == 1, "scaled_add wants 1-d tensors, got ", a.dim());
  if (!a.is_cuda()) return a.add(b).mul(s * 3.0);
  auto out = torch::empty_like(a);
  int n = a.numel();
  scaled_add_kernel<<<(n + TILE - 1) / TILE, TILE>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), (float)s, n);
  return out;
}
'''
# Refused by the cut (a `__` name in host code), built by the usual path.
REFUSED = GOOD.replace("auto out = torch::empty_like(a);",
                       "auto out = torch::empty_like(a);\n  (void)sizeof(__half2);")
# Accepted by the cut, its device half does not compile: the usual path decides (an error).
BROKEN = GOOD.replace("* s;\n}", "* s_typo;\n}")
# Without torch/extension.h: load_inline's torch/types.h alone, the other level of header tiers
# (header_tiers.CUDA_LEVELS), with its own names and host header, as the bundled scaffolds are.
TYPES_LEVEL = GOOD.replace("#include <torch/extension.h>\n", "")
# Includes beyond the lite headers (device_split.py computes names for them): a C header the
# device half keeps, and a torch header only the host half includes, used by the launch.
FURTHER = GOOD.replace("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n#include <math.h>\n"
                       "#include <c10/cuda/CUDAStream.h>\n").replace(
    "return 2.0f * x;", "return 2.0f * fabsf(x);").replace(
    "TILE>>>(", "TILE, 0, c10::cuda::getCurrentCUDAStream()>>>(")
# A further include no folder holds: no names, so the usual path decides (its compile error).
MISSING_INCLUDE = GOOD.replace("#include <cuda_runtime.h>\n",
                               "#include <cuda_runtime.h>\n#include <dice_no_such_header.h>\n")
SOURCES = {"split_good": GOOD, "split_refused": REFUSED, "split_broken": BROKEN,
           "split_types": TYPES_LEVEL, "split_further": FURTHER,
           "split_missing_include": MISSING_INCLUDE}
DICE_ITEMS = (3, 4, 5)  # phase-1 reference middles of kernel_infilling_evaluation.json


def _cuobjdump() -> str | None:
  try:
    import triton  # pylint: disable=import-outside-toplevel  (ships cuobjdump; the toolkit may not)
  except ImportError:
    return None
  path = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
  return str(path) if path.is_file() else None


def _sass(so: str) -> str:
  tool = _cuobjdump()
  out = subprocess.run([tool, "-sass", so], capture_output=True, text=True, check=True).stdout
  kept = [line for line in out.split("\n") if not line.startswith(("Fatbin", "code for", "\t"
                                                                     "File"))]
  assert any("Function :" in line for line in kept), out[:2000]
  return "\n".join(kept)


def _symbols(so: str) -> dict[str, str]:
  """{exported symbol: nm's type}."""
  out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                       check=True).stdout
  return {line.split()[-1]: line.split()[-2] for line in out.split("\n") if line.strip()}


def _same_exports(split_so: str, lite_so: str) -> None:
  """The split module exports every symbol the lite one does, with its type, and nothing more
  but weak (inline) definitions from the CUDA headers its device half includes: the same
  strong symbols, so nothing that another module would bind to differently."""
  split, lite = _symbols(split_so), _symbols(lite_so)
  assert {k: v for k, v in split.items() if k in lite} == lite
  extra = {k: v for k, v in split.items() if k not in lite}
  assert all(v in "WVuv" for v in extra.values()), extra
  assert not [k for k in split if "__dice" in k]  # launchers stay hidden


@pytest.fixture(scope="module")
def built(toolchain, cache_dir, request):
  """{name: (split build, lite build)} for the bundled sources and DICE's items (where ../shared
  is present), and the split path's counters (with "further": each source's further includes
  whose names it waited for, split_ready_for's answer)."""
  try:
    shared_dir = request.getfixturevalue("shared_dir")
  except pytest.skip.Exception:
    shared_dir = None
  exts = {name: checks.check_candidate(kernels.cuda_candidate(text, name)).extensions[0]
          for name, text in SOURCES.items()}
  if shared_dir is not None:
    items = json.loads((shared_dir / "data/dice/kernel_infilling_evaluation.json").read_text())
    for i in DICE_ITEMS:
      item = items[i]
      (exts[f"dice_{i}"],) = checks.check_candidate(
          item["prefix"] + item["middle"] + item["suffix"]).extensions

  async def go():
    on = compile_lib.Compiler(toolchain, cache_dir,
                              compile_lib.CompilerOptions(max_jobs=2, split=True, batch_members=1))
    off = compile_lib.Compiler(toolchain, cache_dir,
                               compile_lib.CompilerOptions(max_jobs=2, split=False,
                                                           batch_members=1))
    try:
      await asyncio.gather(on.warm_up(), off.warm_up())
      assert await asyncio.wait_for(on.split_ready(), 1800), on.split_stats()
      out, further = {}, {}
      for name, ext in exts.items():
        # What a server's later builds of it find: the names for its further includes.
        further[name] = await asyncio.wait_for(on.split_ready_for(ext), 1800)
        out[name] = (await on.build(ext, 900, problem=name),
                     await off.build(ext, 900, problem=name))
      return out, {**on.split_stats(), "further": further}
    finally:
      await asyncio.gather(on.close(), off.close())
  return asyncio.run(go())


_CALL = textwrap.dedent("""
    import importlib.util, json, sys, torch
    out = []
    for path in sys.argv[1:]:
      spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[-1][:-3], path)
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      answer = [module.scaled_add(torch.ones(3), torch.ones(3), 0.5).tolist()]
      try:
        module.scaled_add(torch.ones(2, 2), torch.ones(2, 2), 0.5)
      except RuntimeError as e:
        answer.append([line for line in str(e).split("\\n") if "wants 1-d" in line
                       or line.startswith("Exception raised from")])
      out.append(answer)
    print(json.dumps(out))
""")


def _call(*paths: str) -> list:
  # With C++ stack traces on, c10's message names the throwing function's file and line. No GPU
  # visible, as on CI: the calls take the host function's CPU branch.
  env = {**os.environ, "TORCH_SHOW_CPP_STACKTRACES": "1", "CUDA_VISIBLE_DEVICES": ""}
  proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CALL, *paths],
                        capture_output=True, text=True,
                        timeout=300, check=False, env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout)


def _gpu_box() -> bool:
  import torch  # pylint: disable=import-outside-toplevel  (the verifier side's dependency)
  return torch.cuda.is_available()


# Measured on the H200 image (torch 2.11): these CPU calls end the calling process with SIGSEGV,
# for the lite build as much as for the split one, with CUDA_VISIBLE_DEVICES="" too, while a plain
# load_inline C++ extension's TORCH_CHECK there returns its message under the same stack-trace
# setting. Cause not found; on a GPU box the GPU test below compares the modules' answers instead.
_CPU_CALLS_CRASH_ON_GPU_BOXES = pytest.mark.xfail(
    condition=_gpu_box(), strict=False,
    reason="CPU calls into a compiled module segfault on the H200 image (lite and split alike)")


@pytest.mark.skipif(_cuobjdump() is None, reason="no cuobjdump (triton's) to read SASS with")
def test_a_split_build_has_the_lite_builds_kernels_and_symbols(built):
  results, _ = built
  split, lite = results["split_good"]
  assert split.ok and lite.ok, (split.log[-2000:], lite.log[-2000:])
  assert (split.header_tier, lite.header_tier) == ("split", "lite"), split.split_note
  assert _sass(split.so_path) == _sass(lite.so_path)
  _same_exports(split.so_path, lite.so_path)


def _with_split_compiler(toolchain, cache_dir, body, **options):
  """`body(compiler)`'s result, run with a compiler that has the split on (and `options`), warmed
  up, and whose split path is ready."""
  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir,
                                    compile_lib.CompilerOptions(max_jobs=2, split=True, **options))
    try:
      await compiler.warm_up()
      assert await asyncio.wait_for(compiler.split_ready(), 1800), compiler.split_stats()
      return await body(compiler)
    finally:
      await compiler.close()
  return asyncio.run(go())


def test_hostile_sources_meet_the_compile_stages_bounds_and_confinement_through_the_split(
    toolchain, cache_dir, tmp_path):
  """The split's halves run through the compile stage's confined, bounded runner like every
  compiler process: with the split on and small bounds, an honest source still splits and
  builds; a macro that explodes in a source the split accepts ends at the memory bound (in a
  half, with the bound's message), and a source that includes a host file is refused by the
  split and, confined, cannot open it: no line of the file in any log."""
  small = limits_lib.Limits(memory_bytes=2 << 30, cpu_s=120)
  secret = tmp_path / "token.txt"
  secret.write_text("hunter2 TOPSECRET-SPLIT-LINE\n")
  secret.chmod(0o644)
  tmp_path.chmod(0o755)
  sources = {
      "bounded_good": GOOD,
      "bounded_boom": GOOD.replace("__device__ float twice",
                                   kernels.MACRO_BOMB_KERNEL + "\n__device__ float twice"),
      "bounded_secret": GOOD.replace("#include <cuda_runtime.h>\n",
                                     f'#include <cuda_runtime.h>\n#include "{secret}"\n'),
  }
  exts = {name: checks.check_candidate(kernels.cuda_candidate(src.replace("\\", "\\\\"), name))
          .extensions[0] for name, src in sources.items()}

  async def body(compiler):
    return {name: await compiler.build(ext, 900, problem=name) for name, ext in exts.items()}
  results = _with_split_compiler(toolchain, cache_dir, body, batch_members=1, limits=small)
  good, boom, leak = results["bounded_good"], results["bounded_boom"], results["bounded_secret"]
  assert good.ok and good.header_tier == "split", (good.split_note, good.log[-2000:])
  assert [s for s in boom.steps if s.get("what") in ("device", "host")], boom.steps  # it split
  assert not boom.ok and boom.log.startswith(small.message(limits_lib.Limit.MEMORY)), boom.log[:500]
  assert not leak.ok and leak.header_tier != "split"
  assert f"{secret}: Permission denied" in leak.log, leak.log[-2000:]
  assert "TOPSECRET" not in leak.log + boom.log + good.log


@_CPU_CALLS_CRASH_ON_GPU_BOXES
def test_with_company_a_source_batches_before_it_splits(built, toolchain, cache_dir):
  """With the split on and batching on, three sources compiled at the same time share a batch
  (per member a fraction of a split build's fixed cost: BENCHMARKS.md, "Batches before the
  split"); two at once that the split accepts split instead (a batch of two costs more:
  batch.SMALL_BATCH). The batched modules answer as the split ones."""
  exts = [checks.check_candidate(kernels.cuda_candidate(GOOD, f"company_{k}")).extensions[0]
          for k in "abcde"]

  async def body(compiler):
    three = await asyncio.gather(*(compiler.build(ext, 900, problem=ext.name)
                                   for ext in exts[:3]))
    two = await asyncio.gather(*(compiler.build(ext, 900, problem=ext.name)
                                 for ext in exts[3:]))
    return three, two, compiler.batch_stats()
  three, two, stats = _with_split_compiler(toolchain, cache_dir, body)
  assert all(r.ok for r in three + two), [r.log[-2000:] for r in three + two]
  assert [(r.header_tier, r.batch_size) for r in three] == [("lite", 3)] * 3, [
      (r.batch_note, r.split_note) for r in three]
  assert [(r.header_tier, r.batch_size, r.batch_note) for r in two] == [
      ("split", 0, batch_lib.SMALL)] * 2, [(r.batch_note, r.split_note) for r in two]
  assert (stats["batches"], stats["batched"]) == (1, 3), stats
  answers = _call(*(r.so_path for r in three + two))
  assert [a[0] for a in answers] == [[3.0] * 3] * 5, answers


def test_a_source_its_batchs_errors_name_skips_the_split(toolchain, cache_dir):
  """With the split on, a source that breaks its batch (its own code named in the errors) is
  built the usual way at once, which gives its compile error; no split build is tried for it
  (both halves would fail first). Its two batch mates, too few then for another batch
  (batch.SMALL_BATCH), split."""
  good = [checks.check_candidate(kernels.cuda_candidate(GOOD, f"mate_good_{k}")).extensions[0]
          for k in "ab"]
  broken = checks.check_candidate(kernels.cuda_candidate(BROKEN, "mate_broken")).extensions[0]

  async def body(compiler):
    before = dict(compiler.split_stats())
    results = await asyncio.gather(*(compiler.build(ext, 900, problem=ext.name)
                                     for ext in (*good, broken)))
    return results, before, dict(compiler.split_stats()), compiler.batch_stats()
  (*ok, failed), before, after, batches = _with_split_compiler(toolchain, cache_dir, body)
  assert batches["failed"] == 1 and batches["batched"] == 0, batches  # tried together, no retry
  assert not failed.ok and "s_typo" in failed.log, failed.log[-2000:]
  assert not [s for s in failed.steps if s.get("what") in ("device", "host")], failed.steps
  for result in ok:
    assert result.ok and result.header_tier == "split", (result.batch_note, result.split_note)
    assert result.batch_note.startswith("its batch was not used"), result.batch_note
  assert (after["split"] - before["split"], after["failed"] - before["failed"]) == (2, 0), after


@_CPU_CALLS_CRASH_ON_GPU_BOXES
def test_a_split_builds_host_function_answers_and_checks_as_the_lite_ones(built):
  results, _ = built
  split, lite = results["split_good"]
  assert (split.header_tier, lite.header_tier) == ("split", "lite"), split.split_note
  answers = _call(split.so_path, lite.so_path)
  assert answers[0] == answers[1]
  assert answers[0][0] == [3.0] * 3  # (1 + 1) x 0.5 x 3 on the CPU path
  # TORCH_CHECK's message, file and line included, reads as in the source as written.
  # load_inline's cuda.cu is three include lines, then the source.
  line = 3 + next(i for i, text in enumerate(GOOD.split("\n"), 1) if "TORCH_CHECK" in text)
  assert f"Exception raised from scaled_add at cuda.cu:{line} " in "\n".join(answers[0][1]), \
      answers[0][1]


@pytest.mark.skipif(_cuobjdump() is None, reason="no cuobjdump (triton's) to read SASS with")
def test_dice_reference_middles_split_with_the_lite_builds_kernels(built, shared_dir):
  results, _ = built
  for i in DICE_ITEMS:
    split, lite = results[f"dice_{i}"]
    assert split.ok and lite.ok, (i, split.log[-1500:], lite.log[-1500:])
    assert split.header_tier == "split", (i, split.split_note)
    assert _sass(split.so_path) == _sass(lite.so_path), i
    _same_exports(split.so_path, lite.so_path)


def test_a_source_with_further_includes_splits_with_the_lite_builds_kernels_and_answers(built):
  """<math.h> stays in both halves, torch's c10/cuda/CUDAStream.h only in the host half; the
  names the cut checks were computed with both included (split_names.Store, per include list)."""
  results, stats = built
  assert stats["further"]["split_further"] == ("math.h", "c10/cuda/CUDAStream.h")
  split, lite = results["split_further"]
  assert split.ok and lite.ok, (split.log[-2000:], lite.log[-2000:])
  assert (split.header_tier, lite.header_tier) == ("split", "lite"), split.split_note
  if _cuobjdump() is not None:
    assert _sass(split.so_path) == _sass(lite.so_path)
  _same_exports(split.so_path, lite.so_path)
  answers = _call(split.so_path, lite.so_path)
  assert answers[0] == answers[1] and answers[0][0] == [3.0] * 3


def test_a_further_include_without_names_builds_by_the_usual_path(built):
  results, stats = built
  assert stats["further"]["split_missing_include"] is None
  split, lite = results["split_missing_include"]
  assert not split.ok and not lite.ok and split.log == lite.log
  assert "dice_no_such_header.h" in split.log
  # Refused before any half was compiled (a failed build's notes are not kept: its steps say it).
  assert not [step for step in split.steps if step.get("what") in ("device", "host")]
  broken, _ = results["split_broken"]  # which the split did try
  assert {step.get("what") for step in broken.steps} >= {"device", "host"}, broken.steps


def test_both_header_levels_split_from_the_first_build_after_start_up(built):
  """split_ready (which a server's start-up waits for) covers sources with torch/extension.h and
  those with torch/types.h alone: neither level's first build finds the split not ready."""
  results, stats = built
  split, lite = results["split_types"]
  assert split.ok and lite.ok, (split.log[-2000:], lite.log[-2000:])
  assert (split.header_tier, lite.header_tier) == ("split", "lite"), split.split_note
  assert stats["not_ready"] == 0, stats


def test_device_halves_are_preprocessed_from_a_snapshot_of_their_headers_macros(built):
  """rest_preprocess.py: the first device half of each command (host and device pass, per header
  level) is preprocessed both ways and compared byte for byte; the later ones from the snapshot.
  The builds above then have the lite builds' kernels and answers."""
  results, stats = built
  assert stats["rest_off"] == 0 and stats["rest_checked"] >= 2, stats
  if any(name.startswith("dice_") for name in results):  # more halves than the bundled sources'
    assert stats["rest_preprocessed"] >= 2, stats


def test_a_refused_source_builds_by_the_usual_path(built):
  results, stats = built
  split, lite = results["split_refused"]
  assert split.ok and lite.ok
  assert split.header_tier == "lite" and "__half2" in split.split_note
  assert stats["refused"] >= 1


@_CPU_CALLS_CRASH_ON_GPU_BOXES
def test_a_refused_sources_module_answers_as_the_lite_one(built):
  results, _ = built
  split, lite = results["split_refused"]
  assert _call(split.so_path)[0] == _call(lite.so_path)[0]


def test_a_half_that_does_not_compile_ends_as_the_usual_paths_compile_error(built):
  results, stats = built
  split, lite = results["split_broken"]
  assert not split.ok and not lite.ok
  assert "s_typo" in split.log and split.log == lite.log
  assert split.split_note == "" and stats["failed"] >= 1
  assert "__dice" not in split.log and "dice_split" not in split.log


def test_device_halves_finish_in_warm_front_ends_with_the_lite_builds_kernels(
    toolchain, cache_dir, built):
  """Every device half starts with the same preprocessed text (one header include, one module id
  per environment), so with warm front ends on (as in a server with GPUs) a later candidate's
  device half finishes in front ends that parsed its headers ahead; its kernels and exports are
  still the lite build's. (`built` first: the shared headers and names exist.)"""
  variants = {f"warm_{k}": GOOD.replace("2.0f * x", f"{k}.0f * x") for k in (3, 5, 7)}
  exts = {name: checks.check_candidate(kernels.cuda_candidate(text, name)).extensions[0]
          for name, text in variants.items()}

  async def go():
    on = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(
        max_jobs=2, split=True, batch_members=1, warm_front_ends=True))
    off = compile_lib.Compiler(toolchain, cache_dir, compile_lib.CompilerOptions(
        max_jobs=2, split=False, batch_members=1))
    try:
      await asyncio.gather(on.warm_up(), off.warm_up())
      assert await asyncio.wait_for(on.split_ready(), 900), on.split_stats()
      out, further = {}, {}
      for name, ext in exts.items():
        # What a server's later builds of it find: the names for its further includes.
        further[name] = await asyncio.wait_for(on.split_ready_for(ext), 1800)
        out[name] = (await on.build(ext, 900, problem=name),
                     await off.build(ext, 900, problem=name))
        # The warm processes this build started (lite tier's and device half's): ready before
        # the next build, as between a burst's waves.
        for _ in range(600):
          if on.front_end_stats().get("warm_front_ends", 0) >= 4:
            break
          await asyncio.sleep(0.2)
      return out, on.front_end_stats()
    finally:
      await asyncio.gather(on.close(), off.close())

  results, stats = asyncio.run(go())
  warm_device_steps = []
  for name, (split, lite) in results.items():
    assert split.ok and lite.ok, (name, split.log[-1500:], lite.log[-1500:])
    assert split.header_tier == "split", (name, split.split_note)
    warm_device_steps += [s["step"] for s in split.steps
                          if s.get("what") == "device" and s["step"].endswith("(warm)")]
    _same_exports(split.so_path, lite.so_path)
    if _cuobjdump() is not None:
      assert _sass(split.so_path) == _sass(lite.so_path), name
  assert {"cudafe++ (warm)", "cicc (warm)"} <= set(warm_device_steps), (warm_device_steps, stats)
  assert stats["warm_off"] == 0, stats


_CALL_GPU = textwrap.dedent("""
    import importlib.util, json, sys, torch
    out = []
    for path in sys.argv[1:]:
      spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[-1][:-3], path)
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      g = torch.Generator(device="cuda").manual_seed(0)
      a = torch.rand(100003, device="cuda", generator=g)
      b = torch.rand(100003, device="cuda", generator=g)
      c = module.scaled_add(a, b, 0.25)
      torch.cuda.synchronize()
      out.append(c.double().sum().item())
    print(json.dumps(out))
""")


@pytest.mark.gpu
def test_on_a_gpu_the_split_module_computes_what_the_lite_one_does(built):
  results, _ = built
  split, lite = results["split_good"]
  assert split.header_tier == "split"
  proc = subprocess.run([sys.executable, "-c", _CALL_GPU, split.so_path, lite.so_path],
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  sums = json.loads(proc.stdout)
  assert sums[0] == sums[1] and sums[0] > 0
