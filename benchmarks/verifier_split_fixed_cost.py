"""What a split build (compile/device_split.py) costs whatever the candidate: the per-translation-unit
fixed cost, from a kernel of a few lines against DICE's phase-1 reference middles.

One compiler as a GPU server runs it for RL (CompilerOptions(split=True, warm_front_ends=True),
the macro snapshot on, candidates one at a time: batch_members=1), in this process. Candidates
alternate between `tiny` (the tests' scaled_add kernel: one __global__ function of three lines
and a host function of five) and the next DICE middle that splits, each cuda.cu made new by a
trailing comment (a cold object; main.cpp from cache: every candidate is built once untimed
first, which also takes and checks the macro snapshot and warms the fork servers). Per build, the
CPU of each step (the exec wrapper's figure, by half and tool) is summed; prints each step's mean
per kind and the ratio tiny / DICE of the whole: the share of a split build that does not depend on
the candidate's code, which only compiling several candidates per translation unit can spread.

  TORCH_CUDA_ARCH_LIST=9.0 python benchmarks/verifier_split_fixed_cost.py --count 6
"""

from __future__ import annotations

import asyncio
import collections
import os
import pathlib
import statistics
import sys
import tempfile

from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

from verifier_split_compile import dice_parser, first_splits, fresh, phase1_extensions

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "verifier"))
import verifier_kernels as kernels  # noqa: E402  pylint: disable=wrong-import-position


def _by_step(result: compile_lib.BuildResult) -> collections.Counter:
  """CPU-s per step of one build, keyed `half: tool` (the link and main.cpp: `build: tool`)."""
  out: collections.Counter = collections.Counter()
  for step in result.steps:
    out[f"{step.get('what') or 'build'}: {step['step'].split(' ')[0]}"] += step.get("cpu_s") or 0.0
  return out


async def main(args) -> None:
  (tiny,) = checks.check_candidate(kernels.cuda_candidate(name="tiny_ext")).extensions
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="split-fixed-"))
  compiler = compile_lib.Compiler(toolchain_lib.discover(), cache, compile_lib.CompilerOptions(
      max_jobs=args.jobs, split=True, batch_members=1, warm_front_ends=True))
  rows: dict[str, list[collections.Counter]] = {"tiny": [], "dice": []}
  try:
    await compiler.warm_up()
    if not await compiler.split_ready():
      raise SystemExit("the split path cannot serve on this machine")
    chosen = await first_splits(compiler, phase1_extensions(args.data), args.count)
    for _ in range(2):  # tiny's main.cpp cached too
      await compiler.build(fresh(tiny, "first"), 900, problem="tiny")
    for name, ext in chosen:
      for kind, problem, extension in (("tiny", "tiny", tiny), ("dice", name, ext)):
        result = await compiler.build(fresh(extension, kind), 900, problem=problem)
        if result.header_tier != compile_lib.SPLIT:
          raise SystemExit(f"{problem} split once, then not: {result.header_tier}")
        rows[kind].append(_by_step(result))
        print(f"  {kind:4s} {problem:8s} ok={result.ok} cpu={sum(rows[kind][-1].values()):5.2f} s",
              flush=True)
    print(f"load average {os.getloadavg()}; split stats {compiler.split_stats()}")
  finally:
    await compiler.close()
  count = len(rows["dice"])  # one row of each kind per DICE item
  if count == 0:
    raise SystemExit("no timed split builds")
  steps = sorted({k for r in rows.values() for c in r for k in c},
                 key=lambda k: -sum(c[k] for c in rows["dice"]))
  print(f"CPU-s per split build, mean of {count} (tiny, DICE):")
  for step in steps:
    means = [statistics.mean(c[step] for c in rows[kind]) for kind in ("tiny", "dice")]
    print(f"  {step:28s} {means[0]:6.3f} {means[1]:6.3f}")
  totals = [statistics.mean(sum(c.values()) for c in rows[kind]) for kind in ("tiny", "dice")]
  print(f"  {'total':28s} {totals[0]:6.3f} {totals[1]:6.3f}")
  print(f"tiny / DICE: {totals[0] / totals[1]:.2f}")


if __name__ == "__main__":
  asyncio.run(main(dice_parser(__doc__, 6, "timed split builds of each kind").parse_args()))
