"""Batches across include blocks that change nothing: a burst of DICE phase-1 middles, some of
which add <cmath> or <math.h> after torch's headers, batched with their blocks compared
(`batch.Batcher._group_includes`) against each block batched apart, per candidate's CPU, in this
process.

Candidates: `--count` DICE middles (one problem each) whose include block is the common one or
adds only <cmath> or <math.h> to it (66 and 16 of the 99), the latter in their DICE share (at
least one of each). Two compilers as a GPU server runs them (split, fork servers, batching), on one cache:
  merged  as is: a member whose block leaves the same tokens and macros joins another block's
          group (each block is preprocessed once, at its first meeting with another group).
  apart   `_group_includes` replaced in this process by the rule before it: each block its own
          group (a lone member of a block then splits).
Each variant sends all candidates at once, three rounds, cuda.cu made new each round: the first
untimed (fork servers start, blocks are compared), then two timed. CPU seconds are the sum of
every build step's CPU as the exec wrapper measured it (a fork server's child included); prints
per variant and round the batch sizes and the mean CPU per candidate, and the ratio.

  TORCH_CUDA_ARCH_LIST=9.0 python benchmarks/verifier_block_groups.py --count 8
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import tempfile

from verifier_service.compile import batch as batch_lib
from verifier_service.compile import buildspec
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

from verifier_split_compile import dice_parser, fresh, phase1_extensions

_EXTRA = ("#include <cmath>", "#include <math.h>")


def _block(ext) -> tuple[str, ...]:
  """The include lines of the candidate's cuda.cu as written (the lite tier rewrites torch's)."""
  _, cuda = buildspec.render_sources(ext)
  member, _ = batch_lib.split_member(cuda)
  return member.includes if member is not None else ()


def choose(exts: list, count: int) -> list:
  """(name, extension, what its block adds to the common one) of the chosen candidates."""
  blocks = [(name, ext, _block(ext)) for name, ext in exts]
  common = max({b for _, _, b in blocks}, key=lambda b: sum(x == b for _, _, x in blocks))
  extended = [(n, e, " ".join(b[len(common):])) for n, e, b in blocks
              if b[:len(common)] == common and len(b) > len(common)
              and set(b[len(common):]) <= set(_EXTRA)]
  plain = [(n, e, "") for n, e, b in blocks if b == common]
  # In DICE's share (16 of 82), at least one of each extra header.
  by_extra = [[x for x in extended if x[2] == extra] for extra in _EXTRA]
  share = max(2, round(count * len(extended) / (len(extended) + len(plain))))
  picked = [x for row in zip(*by_extra) for x in row][:share]
  return picked + plain[:count - len(picked)]


async def _rounds(compiler, chosen: list, tag: str) -> list[tuple[list[int], float]]:
  out = []
  for round_ in range(3):
    results = await asyncio.gather(*(compiler.build(fresh(ext, f"{tag}-{round_}"), 900,
                                                    problem=name) for name, ext in chosen))
    if not all(r.ok for r in results):
      raise SystemExit(f"{tag}: a build failed: " + next(r.log[-1000:] for r in results
                                                         if not r.ok))
    cpu = sum(step.get("cpu_s") or 0.0 for r in results for step in r.steps)
    out.append((sorted((r.batch_size for r in results), reverse=True), cpu / len(results)))
  return out


async def main(args) -> None:
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="block-groups-"))
  options = compile_lib.CompilerOptions(max_jobs=args.jobs, split=True, warm_front_ends=True)
  picked = choose(phase1_extensions(args.data), args.count)
  print(f"{len(picked)} candidates: " + ", ".join(
      name + (f" ({adds})" if adds else "") for name, _, adds in picked), flush=True)
  chosen = [(name, ext) for name, ext, _ in picked]
  figures = {}
  merge = batch_lib.Batcher._group_includes  # pylint: disable=protected-access
  for variant in ("merged", "apart"):
    async def apart(self, cmd, module_id, includes):  # pylint: disable=unused-argument
      return includes
    batch_lib.Batcher._group_includes = merge if variant == "merged" else apart
    compiler = compile_lib.Compiler(toolchain, cache, options)
    try:
      await compiler.warm_up()
      if not await compiler.split_ready():
        raise SystemExit("the split path cannot serve on this machine")
      rounds = await _rounds(compiler, chosen, variant)
      print(f"{variant}: batcher {compiler.batch_stats()}", flush=True)
    finally:
      await compiler.close()
    for i, (sizes, cpu) in enumerate(rounds):
      print(f"  {variant} round {i}{' (untimed)' if i == 0 else ''}: batch sizes {sizes}, "
            f"cpu_s_per_candidate={cpu:.2f}", flush=True)
    figures[variant] = sum(cpu for _, cpu in rounds[1:]) / (len(rounds) - 1)
  batch_lib.Batcher._group_includes = merge
  print(f"load average {os.getloadavg()}")
  for variant, cpu in figures.items():
    print(f"{variant:6s} cpu_s_per_candidate={cpu:.2f} (timed rounds)")
  print(f"ratio apart/merged: {figures['apart'] / figures['merged']:.2f}x ({len(chosen)} "
        "candidates)")


if __name__ == "__main__":
  asyncio.run(main(dice_parser(__doc__, 8, "candidates in the burst").parse_args()))
