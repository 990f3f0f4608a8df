"""Device halves preprocessed from a snapshot of their headers' macros (compile/rest_preprocess.py)
against preprocessed as usual, on DICE's phase-1 reference middles, in this process.

Two compilers on one cache, both with the split path (device_split.py): `snapshot`
(CompilerOptions(split=True), split_preprocess on, the default) and `usual` (split_preprocess
off). Candidates are built one at a time, each cuda.cu made new by a trailing comment per build
(a cold object; main.cpp from cache), alternating between the two compilers candidate by
candidate, so that both see the same load. The first two candidates that split are built by
`snapshot` before timing: the first gives a command its snapshot, the second checks it (both
ways), as on a server's first two device halves per command. CPU seconds are the children's
user+sys per build; `device half` is the device half's steps as the exec wrapper measured them
(the build's steps). Prints per variant the mean CPU-s per build and per device half, and the
ratio usual / snapshot of each.

  python benchmarks/verifier_rest_preprocess.py --count 12
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import statistics
import tempfile
import time

from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

from verifier_split_compile import children_cpu, dice_parser, fresh, phase1_extensions


def _device_cpu(result: compile_lib.BuildResult) -> float:
  """CPU-s of the device half's steps (nvcc's, as the exec wrapper measured them)."""
  return sum(step.get("cpu_s") or 0.0 for step in result.steps if step.get("what") == "device")


async def main(args) -> None:
  exts = phase1_extensions(args.data)
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="rest-bench-"))
  compilers = {
      name: compile_lib.Compiler(toolchain, cache, compile_lib.CompilerOptions(
          max_jobs=args.jobs, split=True, batch_members=1, split_preprocess=on))
      for name, on in (("snapshot", True), ("usual", False))}
  try:
    start = time.monotonic()
    await asyncio.gather(*(c.warm_up() for c in compilers.values()))
    ready = all([await c.split_ready() for c in compilers.values()])
    print(f"shared builds: split_ready={ready} after {time.monotonic() - start:.1f} s", flush=True)
    chosen = []
    for name, ext in exts:  # those the split builds (the others never reach rest_preprocess)
      result = await compilers["usual"].build(ext, 900, problem=name)
      if result.header_tier == compile_lib.SPLIT:
        chosen.append((name, ext))
      if len(chosen) >= args.count + 2:
        break
    for name, ext in chosen[:2]:  # the snapshot taken, then checked
      await compilers["snapshot"].build(fresh(ext, "learn"), 900, problem=name)
    print(f"timed: {len(chosen) - 2} candidates that split; before timing: "
          f"{compilers['snapshot'].split_stats()}", flush=True)
    rows: dict[str, list[tuple[float, float]]] = {"snapshot": [], "usual": []}
    for name, ext in chosen[2:]:
      for variant, compiler in compilers.items():
        cpu = children_cpu()
        result = await compiler.build(fresh(ext, variant), 900, problem=name)
        used = children_cpu() - cpu
        rows[variant].append((used, _device_cpu(result)))
        print(f"  {variant:8s} {name:9s} tier={result.header_tier} ok={result.ok} "
              f"cpu={used:5.2f} s device half={rows[variant][-1][1]:5.2f} s", flush=True)
    print(f"load average: {os.getloadavg()}")
    means = {v: (statistics.mean(r[0] for r in rs), statistics.mean(r[1] for r in rs))
             for v, rs in rows.items()}
    for variant, (cpu, device) in means.items():
      print(f"{variant:8s} cpu_s_per_build={cpu:.2f} device_half_cpu_s_per_build={device:.2f}")
    print(f"ratio usual/snapshot: build cpu {means['usual'][0] / means['snapshot'][0]:.2f}x, "
          f"device half cpu {means['usual'][1] / max(means['snapshot'][1], 1e-9):.2f}x")
    print("snapshot compiler:", compilers["snapshot"].split_stats())
  finally:
    await asyncio.gather(*(c.close() for c in compilers.values()))


if __name__ == "__main__":
  asyncio.run(main(dice_parser(__doc__, 12, "timed candidates that split").parse_args()))
