"""The split path for phase-1 cuda.cu (verifier_service/compile/device_split.py) against the
lite tier's path, per candidate, on DICE's phase-1 reference middles.

Each candidate's cuda.cu gets a new trailing comment per variant (its main.cpp is the problem's
fixed scaffold, built once before timing), so every variant compiles cuda.cu cold and main.cpp
from cache, as a phase-1 rollout of a problem seen before does. Variants, one compiler each, one
after the other, in this process, on one cache (shared headers built once, before timing):
  split        CompilerOptions(split=True), candidates one at a time: cuda.cu in two halves
               where the cut accepts it, else as `lite`.
  lite         CompilerOptions(split=False, batch_members=1), one at a time: today's path alone.
  lite_batch   CompilerOptions(split=False), all candidates at once: today's path with batching.
Only candidates the split path built in two halves are timed in every variant (the others cost
what `lite` costs). CPU seconds are the children's user+sys (every compiler process is a child);
wall seconds are per build (one at a time) or per burst (lite_batch). Prints per variant the
mean CPU-s and wall-s per candidate, and the ratios lite / split and lite_batch / split.

  python benchmarks/verifier_split_compile.py --count 8
  python benchmarks/verifier_split_compile.py            # every reference middle that splits
  python benchmarks/verifier_split_compile.py --count 8 --warm-front-ends   # as a GPU server
  python benchmarks/verifier_split_compile.py --further-includes   # sources with <math.h>, ...
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pathlib
import resource
import tempfile
import time

from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared/data/dice/" \
    "kernel_infilling_evaluation.json"


def children_cpu() -> float:
  """User+system CPU seconds of every child this process has reaped."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def phase1_extensions(path: str) -> list:
  """(name, InlineExtension) of each DICE phase-1 item at `path` whose known-good answer has one
  extension with CUDA sources."""
  exts = []
  for i, item in enumerate(json.loads(pathlib.Path(path).read_text())):
    report = checks.check_candidate(item["prefix"] + item["middle"] + item["suffix"])
    if len(report.extensions) == 1 and report.extensions[0].cuda_sources:
      exts.append((f"dice_{i}", report.extensions[0]))
  return exts


def _data_file(path: str) -> str:
  """--data's check at parse time (argparse applies it to the default too)."""
  if not pathlib.Path(path).is_file():
    raise argparse.ArgumentTypeError(f"{path}: no such file (DICE's kernel_infilling_evaluation.json; "
                                     "on a machine without ../shared, copy it and give its path)")
  return path


def dice_parser(doc: str, count: int, count_help: str) -> argparse.ArgumentParser:
  """The flags every DICE compile benchmark takes: --data, --count, --jobs, --cache-dir."""
  parser = argparse.ArgumentParser(description=doc.split("\n")[0])
  parser.add_argument("--data", type=_data_file, default=str(DATA),
                      help="DICE's phase-1 items (default: %(default)s)")
  parser.add_argument("--count", type=int, default=count, help=count_help)
  parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
  parser.add_argument("--cache-dir", default="", help="reuse a cache (shared headers built)")
  return parser


async def first_splits(compiler, exts: list, count: int) -> list:
  """The first `count` (name, extension) pairs of `exts` that `compiler` builds split, each built
  once untimed (cuda.cu made new: `fresh`; its main.cpp then cached)."""
  chosen = []
  for name, ext in exts:
    if len(chosen) >= count:
      break
    result = await compiler.build(fresh(ext, "first"), 900, problem=name)
    if result.header_tier == compile_lib.SPLIT:
      chosen.append((name, ext))
  return chosen


def fresh(ext, tag: str):
  """`ext` with cuda.cu made new by a trailing comment (same meaning, a cold object)."""
  cuda = tuple(s + f"\n// {tag} {os.urandom(6).hex()}\n" for s in ext.cuda_sources)
  return dataclasses.replace(ext, cuda_sources=cuda)


async def _one_at_a_time(compiler, exts, tag):
  rows = []
  for name, ext in exts:
    cpu, wall = children_cpu(), time.monotonic()
    result = await compiler.build(fresh(ext, tag), 900, problem=name)
    rows.append((name, result, children_cpu() - cpu, time.monotonic() - wall))
  return rows


async def main(args) -> None:
  exts = phase1_extensions(args.data)
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="split-bench-"))
  warm = args.warm_front_ends
  split = compile_lib.Compiler(toolchain, cache,
                               compile_lib.CompilerOptions(max_jobs=args.jobs, split=True,
                                                           batch_members=1, warm_front_ends=warm))
  lite = compile_lib.Compiler(toolchain, cache,
                              compile_lib.CompilerOptions(max_jobs=args.jobs, split=False,
                                                          batch_members=1, warm_front_ends=warm))
  batch = compile_lib.Compiler(toolchain, cache,
                               compile_lib.CompilerOptions(max_jobs=args.jobs, split=False))
  try:
    start = time.monotonic()
    await asyncio.gather(split.warm_up(), lite.warm_up(), batch.warm_up())
    ready = await split.split_ready()
    print(f"shared_build split_ready={ready} {time.monotonic() - start:.1f} s", flush=True)
    # Which candidates split (and each refusal's reason), main.cpp cached for every variant.
    chosen, reasons = [], {}
    for name, ext in exts:
      if args.further_includes and not await split.split_ready_for(ext):
        continue  # no further includes, or none the split takes
      result = await split.build(ext, 900, problem=name)
      await lite.build(ext, 900, problem=name)
      if result.header_tier == compile_lib.SPLIT:
        chosen.append((name, ext))
      else:
        why = result.split_note or ("did not compile" if not result.ok else result.header_tier)
        reasons[why] = reasons.get(why, 0) + 1
      if args.count and len(chosen) >= args.count:
        break
    print(f"split {len(chosen)} of {len(exts) if not args.count else 'the first'} candidates; "
          f"not split: {json.dumps(reasons, sort_keys=True)}", flush=True)
    figures = {}
    for variant, compiler in (("split", split), ("lite", lite)):
      rows = await _one_at_a_time(compiler, chosen, variant)
      for name, result, cpu, wall in rows:
        parts = {}
        for step in result.steps:  # per half (procs.WHAT), as the exec wrapper measured it
          what = step.get("what") or step["step"]
          parts[what] = parts.get(what, 0.0) + step.get("cpu_s", 0.0)
        print(f"  {variant:10s} {name:9s} tier={result.header_tier:6s} ok={result.ok} "
              f"cpu={cpu:6.2f} s wall={wall:6.2f} s steps_cpu="
              + ", ".join(f"{k} {v:.2f}" for k, v in sorted(parts.items())), flush=True)
      figures[variant] = (sum(r[2] for r in rows) / len(rows), sum(r[3] for r in rows) / len(rows))
    cpu, wall = children_cpu(), time.monotonic()
    results = await asyncio.gather(*(batch.build(fresh(ext, "batch"), 900, problem=name)
                                     for name, ext in chosen))
    figures["lite_batch"] = ((children_cpu() - cpu) / len(chosen), (time.monotonic() - wall) / len(chosen))
    print(f"  lite_batch members batched: {sum(1 for r in results if r.batch_size)} of "
          f"{len(results)}", flush=True)
    print(f"load average: {os.getloadavg()}")
    for variant, (cpu_s, wall_s) in figures.items():
      print(f"{variant:10s} cpu_s_per_candidate={cpu_s:.2f} wall_s_per_candidate={wall_s:.2f}")
    s_cpu, s_wall = figures["split"]
    for variant in ("lite", "lite_batch"):
      print(f"ratio {variant}/split: cpu {figures[variant][0] / s_cpu:.2f}x, "
            f"wall {figures[variant][1] / s_wall:.2f}x")
    print("split stats:", split.split_stats(), "warm front ends:", split.front_end_stats())
  finally:
    await asyncio.gather(split.close(), lite.close(), batch.close())


if __name__ == "__main__":
  parser = dice_parser(__doc__, 0, "stop after this many that split")
  parser.add_argument("--warm-front-ends", action="store_true",
                      help="split and lite with warm front ends, as a server with GPUs runs")
  parser.add_argument("--further-includes", action="store_true",
                      help="only candidates including more than the lite headers (math.h, ...), "
                           "once the split's names for their includes are computed")
  asyncio.run(main(parser.parse_args()))
