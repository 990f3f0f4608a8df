"""The compile stage's confinement and bounds: what a compiler process may read, reach and use,
what of its output leaves the stage, and hostile sources ending in bounded errors (real nvcc).

Hostile builds run with small bounds (2 GiB, 20-120 CPU-s per process) so the suite stays light on
a shared CI machine; the process tree of every candidate's compiler command is sampled (psutil) and
must stay under the memory bound. The server's own shared header builds, which a test's Compiler
may start or restart, have bounds of their own (Limits.shared) and are left out of the sample, as
in the benchmark. Builds that compile torch/extension.h as written (the original tier) need
the default bounds: an honest compile's memory."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from verifier_service.compile import cgroups as cgroups_lib
from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import confine as confine_lib
from verifier_service.compile import diagnostics
from verifier_service.compile import limits as limits_lib
from verifier_service.compile import procs as compile_procs

import verifier_kernels as kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import verifier_compile_limits as sampling  # noqa: E402  (the benchmark's process-tree sampler)

SMALL = limits_lib.Limits(memory_bytes=2 << 30, cpu_s=120)  # a lite-tier cuda.cu fits in them
# The shared header builds' confinement wrapper argument (their file bound): the sampler skips them.
_SHARED_BUILDS = str(SMALL.shared().file_bytes)
CPU_SMALL = limits_lib.Limits(memory_bytes=2 << 30, cpu_s=20)
SECRET_LINES = ("hunter2 TOPSECRET-LINE-ONE", "AWS_SECRET=TOPSECRET-LINE-TWO;")
# The same kernel family as verifier_kernels, with a hostile line; its own extension name.
_BOOM = kernels.CUDA_SOURCE.replace(
    "torch::Tensor scaled_add(", kernels.MACRO_BOMB_KERNEL + "\ntorch::Tensor scaled_add(")


def _candidate(cuda: str, name: str) -> str:
  return kernels.cuda_candidate(cuda.replace("\\", "\\\\"), name)


def _include(path: str) -> str:
  return kernels.CUDA_SOURCE.replace("#include <torch/extension.h>\n",
                                     f'#include <torch/extension.h>\n#include "{path}"\n')


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> pathlib.Path:
  """A world-readable host file outside everything a compiler may read, its lines not C++."""
  folder = tmp_path_factory.mktemp("host-secret")
  path = folder / "token.txt"
  path.write_text("\n".join(SECRET_LINES) + "\n")
  os.chmod(folder, 0o755)
  os.chmod(path, 0o644)
  return path


def _build(toolchain, cache_dir, candidate: str, **options):
  """Builds `candidate` with a fresh Compiler (bounded by SMALL unless given) while sampling
  every compiler command's process tree: (BuildResult, the sampler, seconds)."""
  options.setdefault("limits", SMALL)

  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir,
                                    compile_lib.CompilerOptions(max_jobs=2, **options))
    try:
      (ext,) = checks.check_candidate(candidate).extensions
      return await compiler.build(ext, 900)
    finally:
      await compiler.close()
  with sampling.TreeSampler(skip=_SHARED_BUILDS) as sampler:
    start = time.monotonic()
    result = asyncio.run(go())
  return result, sampler, time.monotonic() - start


def _grep(folder: pathlib.Path, needle: bytes) -> list[str]:
  found = []
  for path in folder.rglob("*"):
    try:
      if path.is_file() and needle in path.read_bytes():
        found.append(str(path))
    except OSError:
      pass
  return found


# ----------------------------------------------------------------------------- no compiler


def test_the_redactor_withholds_diagnostics_in_foreign_files(tmp_path):
  """gcc, nvcc's front ends, the assembler and the linker each quote the lines they point at; a
  diagnostic in a file outside the build folder and the allowed roots keeps its path and kind
  only. A symlink from an allowed folder to a host file is resolved first; our folders get
  neutral names."""
  allowed = tmp_path / "toolkit"
  (allowed / "include").mkdir(parents=True)
  host = tmp_path / "host" / "secret.h"
  host.parent.mkdir()
  host.write_text("secret\n")
  (allowed / "include" / "link.h").symlink_to(host)
  build = tmp_path / "cache" / "tmp" / "tu-1"
  build.mkdir(parents=True)
  redactor = diagnostics.Redactor([str(allowed)], {str(tmp_path / "cache"): "<cache>",
                                                  str(allowed): "<cuda>"})
  log = "\n".join([
      f"$ nvcc -isystem {tmp_path}/cache/headers/k -c cuda.cu",
      "In file included from cuda.cu:3:",
      f"{host}:1:1: error: 'hunter2' does not name a type",
      "    1 | hunter2 TOPSECRET-LINE-ONE",
      "      | ^~~~~~~",
      f"{host}(2): error: identifier \"TOPSECRET\" is undefined",
      "  AWS_SECRET=TOPSECRET-LINE-TWO;",
      "  ^",
      "",
      f"{allowed}/include/link.h:1:1: error: 'secret' TOPSECRET via a link",
      f"{host}: Assembler messages:",
      f"{host}:1: Error: no such instruction: `hunter2 TOPSECRET-LINE-ONE'",
      f"/usr/bin/ld:{host}:1: ignoring invalid character `T' in TOPSECRET",
      f"{build}/../../obj/x/cuda.cu:4:1: error: another build's TOPSECRET line",
      f"{allowed}/include/cuda_runtime.h(12): warning #20: quoted from the toolkit",
      "  int toolkit_line;",
      f"{build}/cuda.cu:5:3: error: expected ';' before 'return'",
      "    5 |   int x = 1",
      "1 error detected in the compilation of \"cuda.cu\".",
  ])
  cleaned = redactor.clean(log, build)
  assert "TOPSECRET" not in cleaned, cleaned
  assert cleaned.count(diagnostics.WITHHELD) == 7, cleaned
  assert f"{host}:1: error: {diagnostics.WITHHELD}" in cleaned
  assert "cuda.cu:5:3: error: expected ';' before 'return'\n    5 |   int x = 1" in cleaned
  assert "<cuda>/include/cuda_runtime.h(12): warning #20: quoted from the toolkit\n" \
         "  int toolkit_line;" in cleaned
  assert "-isystem <cache>/headers/k" in cleaned and str(build) not in cleaned


def test_limits_name_the_bound_and_read_the_wrappers_report():
  limits = limits_lib.Limits(memory_bytes=3 << 30, cpu_s=45)
  assert limits.message(limits_lib.Limit.MEMORY) == (
      "error: compile exceeded its memory limit of 3.0 GiB per compiler process")
  assert "CPU-time limit of 45 s" in limits.message(limits_lib.Limit.CPU)
  usage = limits_lib.Usage.parse("signal 24 1024 19.5 0.5\n")
  assert (usage.signal, usage.max_rss_bytes, usage.cpu_s) == (24, 1 << 20, 20.0)
  assert limits_lib.exceeded(usage, "", limits) == limits_lib.Limit.CPU
  assert limits_lib.Usage.parse("setup landlock: Operation not supported").setup.startswith(
      "landlock")
  exited = limits_lib.Usage.parse("exit 1 4096 1.0 0.1")
  said = "cc1plus: out of memory allocating 2147483664 bytes after a total of 11403264 bytes"
  assert limits_lib.exceeded(exited, said, limits) == limits_lib.Limit.MEMORY
  assert limits_lib.exceeded(exited, "cuda.cu(3): error: expected a \";\"", limits) is None
  with pytest.raises(ValueError):
    limits_lib.Limits(memory_bytes=0)


def test_a_confined_process_reads_only_its_roots_and_reaches_nothing(toolchain, tmp_path):
  """Through the wrapper, as every compiler process runs: its build folder and the shared headers
  are there; a host file, another build's folder, the cache's objects, /proc of another
  process, the network and other processes are not; the shared headers cannot be written."""
  cache = tmp_path / "cache"
  for part in ("pch", "tmp/other-build", "obj"):
    (cache / part).mkdir(parents=True)
  (cache / "pch" / "shared.h").write_text("shared\n")
  (cache / "tmp" / "other-build" / "cuda.cu").write_text("another candidate\n")
  (cache / "obj" / "x.o").write_text("object\n")
  outside = tmp_path / "outside.txt"
  outside.write_text("outside\n")
  build = cache / "tmp" / "mine"
  build.mkdir()
  confinement = confine_lib.Confinement(cache, toolchain.cuda_root, toolchain.cxx,
                                        toolchain.build_env(), limits_lib.Limits())
  try:
    assert confinement.layers["landlock"].startswith("on"), confinement.layers
    probes = {
        "own folder": f"echo mine > {build}/f && cat {build}/f",
        "shared headers": f"cat {cache}/pch/shared.h",
        "write shared headers": f"echo x > {cache}/pch/shared.h",
        "host file": f"cat {outside}",
        "other build": f"cat {cache}/tmp/other-build/cuda.cu",
        "cached objects": f"cat {cache}/obj/x.o",
        "proc of another process": f"cat /proc/{os.getpid()}/environ",
        "signal another process": f"kill -0 {os.getpid()}",
        "host name": "uname -n",
        "tmp": "ls /tmp",
    }
    ran = {}
    for name, script in probes.items():
      argv = confinement.argv(["/bin/sh", "-c", script], rw=build)
      proc = subprocess.run(argv, cwd=build, env=confinement.env, capture_output=True, text=True,
                            timeout=60, check=False)
      ran[name] = (proc.returncode, proc.stdout.strip())
    assert ran["own folder"] == (0, "mine") and ran["shared headers"] == (0, "shared")
    for name in ("write shared headers", "host file", "other build", "cached objects",
                 "proc of another process", "signal another process", "tmp"):
      assert ran[name][0] != 0, (name, ran[name])
    assert ran["host name"] == (0, "dice-compile")
    assert (cache / "pch" / "shared.h").read_text() == "shared\n"
    python = "/usr/bin/python3"  # the system's: its files lie beneath the roots
    if os.path.exists(python):
      script = ("import socket\nfor family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n"
                "  try:\n    socket.socket(family)\n    print('opened', family)\n"
                "  except OSError as e:\n    print('refused', e.errno)\n")
      proc = subprocess.run(confinement.argv([python, "-I", "-S", "-c", script], rw=build),
                            cwd=build, env=confinement.env, capture_output=True, text=True,
                            timeout=60, check=False)
      assert proc.stdout.split("\n")[:3] == ["refused 13"] * 3, (proc.stdout, proc.stderr)
  finally:
    confinement.close()


@pytest.mark.parametrize("limit, script", [
    (limits_lib.Limit.PROCESSES, "i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done; wait"),
    (limits_lib.Limit.OUTPUT, "yes"),
    (limits_lib.Limit.FILE_SIZE, "yes > big"),
    (limits_lib.Limit.CPU, "while :; do :; done"),
])
def test_a_command_over_a_bound_raises_a_limit_naming_it(toolchain, tmp_path, limit, script):
  """Through the compile stage's process runner (as every compiler command runs): a fork bomb,
  endless output, an endless file and a busy loop each end at their bound, named."""
  bounds = limits_lib.Limits(processes=16, output_bytes=1 << 20, file_bytes=1 << 20, cpu_s=2)
  confinement = confine_lib.Confinement(tmp_path / "cache", toolchain.cuda_root, toolchain.cxx,
                                        toolchain.build_env(), bounds)
  if limit == limits_lib.Limit.PROCESSES and not (confinement.cgroups and confinement.cgroups.pids):
    confinement.close()
    pytest.skip(f"no pids cgroup here ({confinement.layers['processes']})")
  runner = compile_procs.ProcessRunner(1, toolchain.build_env(), confinement=confinement)
  work = tmp_path / "work"
  work.mkdir()
  start = time.monotonic()
  try:
    with pytest.raises(compile_procs.LimitExceeded) as over:
      asyncio.run(runner.run(["/bin/sh", "-c", script], work))
  finally:
    confinement.close()
  assert over.value.limit == limit, over.value.log[:500]
  assert over.value.log.startswith(bounds.message(limit))
  assert time.monotonic() - start < 60


def test_a_host_that_cannot_confine_refuses_to_start_and_says_what_is_missing(
    toolchain, tmp_path, monkeypatch):
  """Strict by default: a layer the wrapper cannot apply (here a seccomp filter it cannot load)
  stops the Compiler with a message naming it and the switch; unconfined it starts, says so."""
  real = confine_lib._export_filter  # pylint: disable=protected-access

  def broken(folder):
    path = real(folder)
    bad = folder / "broken.bpf"
    bad.write_bytes(path.read_bytes()[:5])  # not a whole instruction: the kernel refuses it
    return bad
  monkeypatch.setattr(confine_lib, "_export_filter", broken)
  with pytest.raises(confine_lib.ConfinementError) as refused:
    compile_lib.Compiler(toolchain, tmp_path / "cache", compile_lib.CompilerOptions(max_jobs=1))
  assert "seccomp" in str(refused.value) and "--compile-unconfined" in str(refused.value)
  compiler = compile_lib.Compiler(toolchain, tmp_path / "cache",
                                  compile_lib.CompilerOptions(max_jobs=1, confine=False))
  try:
    assert compiler.confinement.layers["sandbox"].startswith("off: UNCONFINED")
    assert compiler.confinement.layers["memory"].startswith("RLIMIT_DATA")
  finally:
    asyncio.run(compiler.close())


def test_a_group_emptied_after_its_loop_closed_still_kills_its_processes(tmp_path):
  """A compile's coroutine closed by the garbage collector after its event loop closed (CI saw
  it: "no running event loop" in cgroups._empty) still kills what its group holds."""
  sleeper = subprocess.Popen(["sleep", "60"])
  (tmp_path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
  with pytest.raises(StopIteration):  # runs to its end without a loop
    cgroups_lib._empty(tmp_path).send(None)
  assert sleeper.wait(timeout=10) == -9


def test_the_servers_compile_settings_reach_its_compiler(toolchain, tmp_path):
  """`--compile-unconfined`, `--compile-memory` and `--compile-cpu` reach the server's compiler."""
  from verifier_service.service import config as config_lib  # pylint: disable=import-outside-toplevel
  from verifier_service.service import scheduler as scheduler_lib  # pylint: disable=import-outside-toplevel
  limits = limits_lib.Limits(memory_bytes=3 << 30, cpu_s=77)
  config = config_lib.ServerConfig(cache_dir=tmp_path, compile_workers=1, verdict_store_size=0,
                                   compile_confine=False, compile_limits=limits)
  scheduler = scheduler_lib.Scheduler.create(config, toolchain)
  try:
    assert scheduler.compiler.confinement.limits == limits
    assert not scheduler.compiler.confinement.enabled
  finally:
    asyncio.run(scheduler.stop())


_SAMPLED_FORK = """
import json, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import verifier_compile_limits as sampling
ballast = bytearray(1 << 30)  # this process at >= 1 GiB resident: every page touched
for i in range(0, len(ballast), 4096):
  ballast[i] = 1
with sampling.TreeSampler() as sampler:
  subprocess.run(["sleep", "0.5"], check=True, preexec_fn=lambda: time.sleep(0.5))
print(json.dumps({"peak": sampler.peak_tree_bytes, "tree": sampler.peak_tree}))
"""


def test_the_sampler_leaves_out_a_child_not_yet_executed():
  """Until its exec a child shares this process's pages (Python's vfork: the same memory; a fork:
  the same pages, copied on write), so its RSS reads as this process's. The sampler must not count
  that as the child's tree: a CI run's 6.0 GB pytest process was sampled as a compiler tree
  against the 2 GiB bound. Here a fork that waits 0.5 s before its exec makes the window certain;
  it runs in a fresh interpreter (a fork of this one, with JAX's threads, could deadlock)."""
  benchmarks = str(pathlib.Path(sampling.__file__).parent)
  proc = subprocess.run([sys.executable, "-c", _SAMPLED_FORK, benchmarks],
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  sampled = json.loads(proc.stdout)
  assert any("sleep" in command for command, _ in sampled["tree"]), sampled
  assert sampled["peak"] < 256 << 20, sampled


# ----------------------------------------------------------------------------- real nvcc


def test_an_included_host_file_is_not_opened_and_never_quoted(toolchain, cache_dir, secret):
  """Confined, the compiler cannot open it (first defence); unconfined, its diagnostics are
  withheld (second defence). Either way no line of it is in the log or anywhere in the cache."""
  candidate = _candidate(_include(str(secret)), "host_include_ext")
  confined, _, _ = _build(toolchain, cache_dir, candidate)
  assert not confined.ok
  assert f"{secret}: Permission denied" in confined.log, confined.log
  # Unconfined, the file's lines fail at the lite tier and the source then compiles as written
  # (torch/extension.h: an honest compile's memory, the default bounds).
  unconfined, _, _ = _build(toolchain, cache_dir, candidate, confine=False,
                            limits=limits_lib.Limits())
  assert not unconfined.ok and diagnostics.WITHHELD in unconfined.log, unconfined.log
  for result in (confined, unconfined):
    assert not any(line in result.log for line in SECRET_LINES), result.log
  assert not _grep(cache_dir / "builds", b"TOPSECRET")


def test_an_incbin_of_a_host_file_embeds_nothing(toolchain, cache_dir, secret):
  """`.incbin` in the C++ source's inline assembly: the assembler cannot open the file, the build
  fails, and no object or module in the cache holds its bytes."""
  asm = '__asm__(".section .rodata\\n.incbin \\"' + str(secret) + '\\"\\n.previous");'
  declaration = "torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s);"
  candidate = kernels.cuda_candidate(name="host_incbin_ext").replace(
      f'cpp_src = "{declaration}"', f"cpp_src = r'''{asm}\n{declaration}'''")
  result, _, _ = _build(toolchain, cache_dir, candidate, limits=limits_lib.Limits())
  assert not result.ok, "the .incbin of a host file compiled"
  assert "file not found" in result.log or "Permission denied" in result.log, result.log
  assert not _grep(cache_dir, b"TOPSECRET"), "a host file's bytes are in the cache"


@pytest.mark.parametrize("name, include", [
    ("urandom", "/dev/urandom"),  # readable, never ends: the memory bound
    ("zero", "/dev/zero"),  # not readable confined
    ("stdin", "/proc/self/fd/0"),  # the compilers' standard input is /dev/null: empty, it builds
    ("itself", None),  # includes itself twice per level: the CPU or the file-size bound
])
def test_an_endless_include_ends_within_the_bounds(toolchain, cache_dir, name, include):
  if include is None:
    cuda = kernels.CUDA_SOURCE.replace(
        "#include <torch/extension.h>\n", "#include <torch/extension.h>\n#if __INCLUDE_LEVEL__ < 30"
        "\n#include __FILE__\n#include __FILE__\n#endif\n")
  else:
    cuda = _include(include)
  result, sampled, seconds = _build(toolchain, cache_dir,
                                    _candidate(cuda, f"endless_{name}_ext"), limits=CPU_SMALL)
  assert result.ok == (name == "stdin"), result.log[:500]
  assert 0 < sampled.peak_tree_bytes < CPU_SMALL.memory_bytes, sampled.peak_tree
  assert seconds < 8 * CPU_SMALL.cpu_s, seconds
  if name == "urandom":
    assert result.log.startswith(CPU_SMALL.message(limits_lib.Limit.MEMORY)), result.log[:500]
  if name == "zero":
    assert "/dev/zero: Permission denied" in result.log, result.log[:500]
  if name == "itself":  # its preprocessed output grows too: whichever bound comes first
    first = result.log.split("\n")[0]
    assert first in (CPU_SMALL.message(limits_lib.Limit.CPU),
                     CPU_SMALL.message(limits_lib.Limit.FILE_SIZE)), result.log[:500]
    assert result.timed_out == (first == CPU_SMALL.message(limits_lib.Limit.CPU))


def test_an_exploding_macro_ends_at_the_memory_bound(toolchain, cache_dir):
  result, sampled, _ = _build(toolchain, cache_dir, _candidate(_BOOM, "macro_boom_ext"))
  assert not result.ok and not result.timed_out
  assert result.log.startswith(SMALL.message(limits_lib.Limit.MEMORY)), result.log[:500]
  assert 0 < sampled.peak_tree_bytes < SMALL.memory_bytes, sampled.peak_tree


def test_a_batch_over_a_bound_costs_its_honest_member_nothing(toolchain, cache_dir):
  """An honest cuda.cu and an exploding one compiled at the same time share a batch; the batch
  goes over the memory bound, both build alone, the honest one builds and only the other fails,
  with its own message."""
  honest = checks.check_candidate(kernels.cuda_candidate(
      kernels.CUDA_SOURCE + "\n// batch mate\n", "batch_honest_ext")).extensions[0]
  hostile = checks.check_candidate(_candidate(_BOOM, "batch_boom_ext")).extensions[0]

  async def go():
    compiler = compile_lib.Compiler(toolchain, cache_dir,
                                    compile_lib.CompilerOptions(max_jobs=2, limits=SMALL))
    try:
      results = await asyncio.gather(compiler.build(honest, 900, problem="a"),
                                     compiler.build(hostile, 900, problem="b"))
      return results, compiler.batch_stats()
    finally:
      await compiler.close()
  with sampling.TreeSampler(skip=_SHARED_BUILDS) as sampler:
    (good, bad), stats = asyncio.run(go())
  assert stats["failed"] >= 1 and stats["batched"] == 0, stats
  assert good.ok, good.log[-2000:]
  assert not bad.ok and bad.log.startswith(SMALL.message(limits_lib.Limit.MEMORY)), bad.log[:500]
  assert sampler.peak_tree_bytes < SMALL.memory_bytes, sampler.peak_tree
