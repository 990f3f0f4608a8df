"""Warm front ends as fork servers (verifier_service/compile/front_ends.py) against nvcc's front
ends run as usual, on a burst of DICE's phase-1 reference middles at the lite tier.

One cache, one process; two compilers that differ only in `warm_front_ends`: `usual` (every
cudafe++ and cicc parses the shared headers itself) and `fork` (each finishes in a child of one
warm process per command, which parsed them once). After start-up (both compilers' warm_up, which
in `fork` also starts and checks the warm processes) every candidate is built once by `usual`, so
main.cpp (the problem's fixed scaffold) is cached. Then, per round, each variant compiles the same
burst: every candidate at once, cuda.cu made new by a trailing comment (a cold object, as a
phase-1 rollout of a problem seen before is), batching off (`batch_members=1`: the figure is the
front ends', not the batches'). Rounds run usual, fork, usual, fork, ...: the ratio is taken
within each pair.

CPU seconds of a burst: the children's user+sys over the burst (every compiler process this
process reaps) plus the CPU of the fork servers' children (their waiters report it: those
children are not this process's to reap). The servers' own CPU (the start-up probe's prefix,
parsed once per server; read from /proc before they are killed) is printed apart, with what it
comes to per candidate of this run. Outcomes (ok, tier) must agree between
the variants; the script says when they do not.

  python benchmarks/verifier_warm_front_ends.py --count 8 --jobs 2
  python benchmarks/verifier_warm_front_ends.py --count 32 --rounds 2 --split   # device halves
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import tempfile
import time

from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

import verifier_split_compile as split_bench  # its data path, CPU reading, fresh candidates


async def _burst(compiler, exts, tag: str) -> tuple[float, float, list]:
  """CPU-s and wall-s of building every candidate at once, and the results."""
  warm_cpu = compiler.front_end_stats().get("warm_cpu_s", 0.0)
  cpu, wall = split_bench.children_cpu(), time.monotonic()
  results = await asyncio.gather(*(compiler.build(split_bench.fresh(ext, tag), 900, problem=name)
                                   for name, ext in exts))
  wall = time.monotonic() - wall
  cpu = (split_bench.children_cpu() - cpu
         + compiler.front_end_stats().get("warm_cpu_s", 0.0) - warm_cpu)
  return cpu, wall, results


async def main(args) -> None:
  exts = split_bench.phase1_extensions(args.data)
  exts = exts[:args.count] if args.count else exts
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(args.cache_dir or tempfile.mkdtemp(prefix="warm-bench-"))
  compilers = {
      name: compile_lib.Compiler(toolchain, cache, compile_lib.CompilerOptions(
          max_jobs=args.jobs, batch_members=1, split=args.split, warm_front_ends=warm))
      for name, warm in (("usual", False), ("fork", True))}
  try:
    start = time.monotonic()
    for compiler in compilers.values():  # one after the other: they share the header builds
      await compiler.warm_up()
      await compiler.settle()
    print(f"start-up {time.monotonic() - start:.1f} s; warm front ends: "
          f"{compilers['fork'].front_end_stats()}", flush=True)
    first = await asyncio.gather(*(compilers["usual"].build(ext, 900, problem=name)
                                   for name, ext in exts))
    print(f"{len(exts)} candidates; built by the usual path: "
          f"{sum(r.ok for r in first)} ok, tiers {sorted({r.header_tier for r in first})}",
          flush=True)
    figures: dict[str, list[tuple[float, float]]] = {"usual": [], "fork": []}
    outcomes: dict[str, list] = {}
    for round_ in range(args.rounds):
      for name in ("usual", "fork"):
        cpu, wall, results = await _burst(compilers[name], exts, f"{name}{round_}")
        figures[name].append((cpu / len(exts), wall))
        outcomes.setdefault(name, [(r.ok, r.header_tier) for r in results])
        steps = [s for r in results for s in r.steps if s["step"].endswith("(warm)")]
        print(f"round {round_} {name:5s} cpu_s_per_candidate={cpu / len(exts):.2f} "
              f"burst_wall_s={wall:.2f} ok={sum(r.ok for r in results)} "
              f"warm_steps={len(steps)}", flush=True)
    print(f"load average: {os.getloadavg()}")
    print("warm front ends:", compilers["fork"].front_end_stats())
    if args.split:
      print("split stats:", {k: c.split_stats() for k, c in compilers.items()})
    for name, rows in figures.items():
      print(f"{name:5s} cpu_s_per_candidate median={statistics.median(c for c, _ in rows):.2f} "
            f"burst_wall_s median={statistics.median(w for _, w in rows):.2f}")
    ratios = [u[0] / f[0] for u, f in zip(figures["usual"], figures["fork"])]
    walls = [u[1] / f[1] for u, f in zip(figures["usual"], figures["fork"])]
    print(f"ratio usual/fork per round: cpu {', '.join(f'{r:.2f}x' for r in ratios)}; "
          f"wall {', '.join(f'{r:.2f}x' for r in walls)}")
    same = outcomes["usual"] == outcomes["fork"]
    print(f"outcomes (ok, tier) per candidate agree: {same}")
    servers = compilers["fork"].front_end_stats()["warm_server_cpu_s"]
    print(f"the fork servers' own CPU (parsing the prefix, once each): {servers:.2f} s, "
          f"{servers / (len(exts) * args.rounds):.3f} s per candidate of this run")
  finally:
    await asyncio.gather(*(c.close() for c in compilers.values()))


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", default=str(split_bench.DATA))
  parser.add_argument("--count", type=int, default=8, help="candidates per burst (0: all)")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
  parser.add_argument("--split", action="store_true", help="both compilers with the split path")
  parser.add_argument("--cache-dir", default="", help="reuse a cache (shared headers built)")
  asyncio.run(main(parser.parse_args()))
