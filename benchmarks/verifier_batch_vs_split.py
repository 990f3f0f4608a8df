"""Batches before the split: a burst of DICE phase-1 middles in one batch against each built alone
by the split path, per candidate's CPU, in this process (compile/compiler.py, point 8).

Every candidate is one the split path builds (found by a first, untimed split build, which also
caches its main.cpp and warms the fork servers). Then, each cuda.cu made new by a trailing comment:
  batch   CompilerOptions(split=True, warm_front_ends=True), batching on (the server's settings
          with the split on): all candidates at once, one problem each, so they share a batch
          (batches come first); a first round untimed (the batch's fork servers start and are
          checked), then the timed round.
  split   CompilerOptions(split=True, warm_front_ends=True, batch_members=1): one at a time, each
          a split build, which is what each candidate cost before batches came first.
CPU seconds are the sum of every build step's CPU as the exec wrapper measured it (a fork server's
child included); prints per variant the mean per candidate and the ratio split / batch.
`--small-batch N` sets batch.SMALL_BATCH (batches of N or fewer that the split could serve are
not built; 2 by default): `--count 2 --small-batch 1` measures a batch of two.

  TORCH_CUDA_ARCH_LIST=9.0 python benchmarks/verifier_batch_vs_split.py --count 8
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile

from verifier_service.compile import batch as batch_lib
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

from verifier_split_compile import dice_parser, first_splits, fresh, phase1_extensions


def _cpu(results: list[compile_lib.BuildResult]) -> float:
  return sum(step.get("cpu_s") or 0.0 for result in results for step in result.steps)


async def main(args) -> None:
  batch_lib.SMALL_BATCH = args.small_batch
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="batch-split-"))
  options = dict(max_jobs=args.jobs, split=True, warm_front_ends=True)
  batch = compile_lib.Compiler(toolchain, cache, compile_lib.CompilerOptions(**options))
  split = compile_lib.Compiler(toolchain, cache,
                               compile_lib.CompilerOptions(**options, batch_members=1))
  try:
    await asyncio.gather(batch.warm_up(), split.warm_up())
    if not (await batch.split_ready() and await split.split_ready()):
      raise SystemExit("the split path cannot serve on this machine")
    chosen = await first_splits(split, phase1_extensions(args.data), args.count)
    figures = {}
    for round_ in ("untimed", "timed"):
      results = await asyncio.gather(*(batch.build(fresh(ext, f"batch-{round_}"), 900, problem=name)
                                       for name, ext in chosen))
      sizes = [r.batch_size for r in results]
      print(f"batch, {round_} round: batch sizes {sizes}, tiers "
            f"{sorted({r.header_tier for r in results})}, all ok {all(r.ok for r in results)}",
            flush=True)
    figures["batch"] = _cpu(results) / len(results)
    results = [await split.build(fresh(ext, "split"), 900, problem=name) for name, ext in chosen]
    print(f"split, one at a time: tiers {sorted({r.header_tier for r in results})}, all ok "
          f"{all(r.ok for r in results)}", flush=True)
    figures["split"] = _cpu(results) / len(results)
    print(f"load average {os.getloadavg()}; batches {batch.batch_stats()}")
  finally:
    await asyncio.gather(batch.close(), split.close())
  for variant, cpu in figures.items():
    print(f"{variant:6s} cpu_s_per_candidate={cpu:.2f}")
  print(f"ratio split/batch: {figures['split'] / figures['batch']:.2f}x ({len(chosen)} candidates)")


if __name__ == "__main__":
  parser = dice_parser(__doc__, 8, "candidates in the burst")
  parser.add_argument("--small-batch", type=int, default=batch_lib.SMALL_BATCH,
                      help="batch.SMALL_BATCH for this run")
  asyncio.run(main(parser.parse_args()))
