"""Device halves as cubins: `nvcc -cubin` of the split's device half against that half as built
today (issue 26: what loading phase-1 device code through the driver API would save; CPU only).

The split path (verifier_service/compile/device_split.py) builds a phase-1 cuda.cu's device half
with nvcc's whole chain (`-c`: both preprocessing passes, cudafe++, cicc, ptxas, fatbinary and the
host compile of cudafe++'s output) so that the host half's launches reach the kernels through
nvcc's registration stubs. A cubin needs only cicc and ptxas, and would be loaded with
cuModuleLoadData and launched with cuLaunchKernel (not built here). For each DICE phase-1 reference
middle that the split builds in two halves, in this process, one at a time:
  split   the split build of the source made new (a trailing comment: cold), its `device` steps'
          CPU seconds as the confined runner's wrapper measured them (BuildResult.steps)
  cubin   `nvcc -cubin` of the same device half text (the split's DEVICE_INCLUDE, its device
          header, the half) with the same nvcc flags less `-c`/`-o` and the host compiler's
          options, for the build's one architecture; the children's CPU seconds. Run here
          directly, not through the confined runner: a measurement of the compilers' cost.
Also says per source whether the cubin compiled and how many kernels its symbol table holds
against the kernels the split planned (a half that needs its host side would not compile alone),
and the same cubin without the device header (what its system headers cost: such a build would
not resolve overloads as the original does, so it is a bound, not a path).
Prints the mean CPU-s per device half both ways and the ratio split / cubin.

  TORCH_CUDA_ARCH_LIST=9.0 python benchmarks/verifier_cubin_device.py --count 8
"""

from __future__ import annotations

import asyncio
import pathlib
import re
import subprocess
import tempfile
import time

from verifier_service.compile import buildspec
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import device_split
from verifier_service.compile import header_tiers
from verifier_service.compile import split_source
from verifier_service.compile import toolchain as toolchain_lib

import verifier_split_compile as bench  # its DICE loading, `fresh` and CPU clock

_HOST_ONLY = re.compile(r"^(-c|-o|--compiler-options|-Xcompiler|-ccbin|--shared|-shared)$")


def cubin_argv(flags: buildspec.BuildFlags) -> list[str]:
  """nvcc's device command for cuda.cu (device_split.py's) as a cubin: `-c`, `-o` and the host
  compiler's options left out; `-gencode` kept when there is one architecture."""
  argv, skip = [], False
  for arg in [*flags.nvcc, *flags.cuda_cflags, *flags.cuda_post_cflags]:
    if skip:
      skip = False
      continue
    if _HOST_ONLY.match(arg):
      skip = arg not in ("-c", "--shared", "-shared")
      continue
    if arg.startswith(("--compiler-options=", "-Xcompiler=")):
      continue
    argv.append(arg)
  gencodes = [a for a in argv if "arch=" in a]
  if len(gencodes) > 2:  # `-gencode=...` or `-gencode`, `arch=...`: one architecture only
    raise SystemExit(f"a cubin is one architecture; set TORCH_CUDA_ARCH_LIST to one (got "
                     f"{gencodes})")
  return argv


def kernels_in(cubin: pathlib.Path) -> int:
  """FUNC symbols of the cubin's symbol table that are kernels (in a .text.<name> section with
  a .nv.info.<name>): counted by their .nv.info sections."""
  out = subprocess.run(["readelf", "-S", "-W", str(cubin)], capture_output=True, text=True,
                       check=False).stdout
  return len(re.findall(r"\.nv\.info\.\S+", out))


async def measure(args) -> None:
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="cubin-bench-"))
  compiler = compile_lib.Compiler(toolchain, cache, compile_lib.CompilerOptions(
      max_jobs=args.jobs, split=True, batch_members=1))
  work = pathlib.Path(tempfile.mkdtemp(prefix="cubin-halves-"))
  rows = []
  try:
    await compiler.warm_up()
    if not await compiler.split_ready():
      raise SystemExit("the split path cannot serve this toolchain")
    chosen = await bench.first_splits(compiler, bench.phase1_extensions(args.data), args.count)
    for name, ext in chosen:
      ext = bench.fresh(ext, "cubin")
      result = await compiler.build(ext, 900, problem=name)
      if result.header_tier != compile_lib.SPLIT:
        print(f"{name}: not split this time ({result.split_note})", flush=True)
        continue
      split_cpu = sum(s.get("cpu_s", 0.0) for s in result.steps if s.get("what") == "device")
      # The half as device_split.py compiled it (private parts: a benchmark's look inside).
      flags = compiler.flags(ext)
      _, cuda_text = buildspec.render_sources(ext)
      env = await compiler._envs.ensure(  # pylint: disable=protected-access
          compiler._nvcc_argv(flags), header_tiers.original_level(cuda_text))  # pylint: disable=protected-access
      split_path = compiler._split  # pylint: disable=protected-access
      names, _, _ = split_path._ready(  # pylint: disable=protected-access
          cuda_text, env, compiler._envs.folder(env.key))  # pylint: disable=protected-access
      plan = split_source.plan(cuda_text, names)
      folder = work / name
      folder.mkdir()
      (folder / device_split.DEVICE_HEADER).write_text(split_path.device_header(env))
      (folder / "cuda.cu").write_text(device_split.DEVICE_INCLUDE + plan.device)
      (folder / "bare.cu").write_text("#line 1 \"cuda.cu\"\n" + plan.device)
      runs = {}
      for variant, source in (("cubin", "cuda.cu"), ("bare", "bare.cu")):
        cpu, wall = bench.children_cpu(), time.monotonic()
        done = subprocess.run([*cubin_argv(flags), "-cubin", source, "-o", f"{variant}.cubin"],
                              cwd=folder, capture_output=True, text=True, check=False,
                              env=toolchain.build_env())
        runs[variant] = (bench.children_cpu() - cpu, time.monotonic() - wall, done)
      cubin_cpu, cubin_wall, done = runs["cubin"]
      bare_cpu, _, bare = runs["bare"]
      found = kernels_in(folder / "cubin.cubin") if done.returncode == 0 else 0
      rows.append((name, split_cpu, cubin_cpu, done.returncode == 0, found, len(plan.kernels),
                   bare_cpu, bare.returncode == 0))
      print(f"{name}: split device half {split_cpu:.2f} CPU-s; cubin {cubin_cpu:.2f} CPU-s "
            f"({cubin_wall:.2f} s wall), {'compiled' if done.returncode == 0 else 'FAILED'}, "
            f"{found} of {len(plan.kernels)} kernels; without the device header "
            f"{bare_cpu:.2f} CPU-s, {'compiled' if bare.returncode == 0 else 'failed'}"
            + (f"\n  {done.stderr.strip()[-600:]}" if done.returncode else ""), flush=True)
  finally:
    await compiler.close()
  ok = [r for r in rows if r[3]]
  if not ok:
    raise SystemExit("no device half compiled as a cubin")
  split_mean = sum(r[1] for r in ok) / len(ok)
  cubin_mean = sum(r[2] for r in ok) / len(ok)
  print(f"device halves: {len(ok)} of {len(rows)} compiled as cubins, kernels all found in "
        f"{sum(r[4] == r[5] for r in ok)}; CPU-s per half: split {split_mean:.2f}, cubin "
        f"{cubin_mean:.2f}; split / cubin {split_mean / cubin_mean:.2f}x", flush=True)
  bare = [r for r in ok if r[7]]
  if bare:
    bare_mean = sum(r[6] for r in bare) / len(bare)
    print(f"without the device header (its system headers: not the original's overloads, so "
          f"not a build to serve): {len(bare)} of {len(ok)} compiled, {bare_mean:.2f} CPU-s per "
          f"half; cubin / bare {cubin_mean / bare_mean:.2f}x", flush=True)


def main() -> None:
  parser = bench.dice_parser(__doc__, 8, "device halves to measure (default %(default)s)")
  asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
  main()
