"""What a phase-1 candidate that does not compile costs after its batch: a split build tried first
(how it went until a batch's errors naming it sent it to the usual path at once) against the usual
path alone, per candidate's CPU, in this process (compile/compiler.py, point 8).

Candidates: DICE phase-1 middles whose known-good answer the split path builds (found by a first,
untimed split build, which also caches the problem's main.cpp and warms the fork servers), each
with an undeclared name put at the top of its first kernel's body (rl_burst_mix.py's
`compile_error`, as an RL step's non-compiling samples are). One at a time, alone:
  split_first  CompilerOptions(split=True, warm_front_ends=True, batch_members=1): both halves
               compiled, one fails, then the lite tier's build gives the log (and a heavier tier
               where the log says it may help).
  usual        CompilerOptions(split=False, warm_front_ends=True, batch_members=1): the lite
               tier's build at once, as a member its batch's errors name now goes.
A batch's own cost is the same either way and not counted. CPU seconds are the sum of every build
step's CPU as the exec wrapper measured it (fork servers' children included); prints per variant
the mean per candidate and the ratio split_first / usual.

  TORCH_CUDA_ARCH_LIST=9.0 python benchmarks/verifier_failed_builds.py --count 6
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import tempfile

from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

import rl_burst_mix as mix_lib
from verifier_split_compile import dice_parser, first_splits, fresh, phase1_extensions


def broken(data: str, name: str, tag: str):
  """DICE item `name`'s known-good answer with a compile error in its first kernel."""
  item = json.loads(pathlib.Path(data).read_text())[int(name.removeprefix("dice_"))]
  middle = mix_lib.mutate(item["middle"], "compile_error", tag)
  return checks.check_candidate(item["prefix"] + middle + item["suffix"]).extensions[0]


def _cpu(result: compile_lib.BuildResult) -> float:
  return sum(step.get("cpu_s") or 0.0 for step in result.steps)


async def main(args) -> None:
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="failed-builds-"))
  options = dict(max_jobs=args.jobs, warm_front_ends=True, batch_members=1)
  compilers = {"split_first": compile_lib.Compiler(toolchain, cache, compile_lib.CompilerOptions(
                   **options, split=True)),
               "usual": compile_lib.Compiler(toolchain, cache, compile_lib.CompilerOptions(
                   **options, split=False))}
  cpu = {variant: [] for variant in compilers}
  try:
    await asyncio.gather(*(c.warm_up() for c in compilers.values()))
    if not await compilers["split_first"].split_ready():
      raise SystemExit("the split path cannot serve on this machine")
    chosen = await first_splits(compilers["split_first"], phase1_extensions(args.data), args.count)
    for name, _ in chosen:  # a first, untimed pass warms each variant's processes for the problem
      for variant, compiler in compilers.items():
        await compiler.build(fresh(broken(args.data, name, "warm"), variant), 900, problem=name)
    for name, _ in chosen:
      for variant, compiler in compilers.items():
        result = await compiler.build(fresh(broken(args.data, name, "timed"), variant), 900,
                                      problem=name)
        if result.ok:
          raise SystemExit(f"{name}: the broken candidate compiled ({variant})")
        cpu[variant].append(_cpu(result))
    split_stats = compilers["split_first"].split_stats()
    print(f"load average {os.getloadavg()}; split path {split_stats}")
  finally:
    await asyncio.gather(*(c.close() for c in compilers.values()))
  means = {variant: sum(values) / len(values) for variant, values in cpu.items()}
  for variant, mean in means.items():
    print(f"{variant:12s} cpu_s_per_candidate={mean:.2f} (each: "
          + ", ".join(f"{v:.2f}" for v in cpu[variant]) + ")")
  print(f"ratio split_first/usual: {means['split_first'] / means['usual']:.2f}x "
        f"({len(chosen)} candidates)")


if __name__ == "__main__":
  asyncio.run(main(dice_parser(__doc__, 6, "non-compiling candidates").parse_args()))
