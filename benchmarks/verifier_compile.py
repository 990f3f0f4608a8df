"""Measures each compile-speed trick of the verifier against torch's plain load_inline.

Distinct DICE infilling candidates (or one file), cold caches, one variant at a time:
  naive          a fresh Python process calling torch.utils.cpp_extension.load_inline (ninja, both
                 translation units in parallel, empty extension folder): what KernelBench does.
  plain          the verifier's own path with every trick off (same flags and sources as naive).
  cuda_tiers     + header tiers for cuda.cu (lite, then torch/types.h, then as written).
  split          + nvcc's host and device front ends run concurrently.
  pch            + the precompiled torch/extension.h for main.cpp.
  before         cuda.cu tiers + split nvcc + torch/extension.h's precompiled header: the compile
                 stage before main.cpp got header tiers (commit c9e3f04).
  all            every trick on (the default): main.cpp also at the lite binding tier, whose
                 precompiled header is a third of torch/extension.h's.
  steady         all again on changed sources (both translation units new), now that every shared
                 header exists, the precompiled host code of nvcc's last step included (built in
                 the background during `all`, once two builds shared it): a running server's cost.
  scaffold_warm  all, with main.cpp already cached and only cuda.cu new: a phase-1 rollout of a
                 problem seen before (its C++ scaffold is fixed, only the CUDA middle changes).
  cache_hit      the same candidates again.
With --burst, the candidates are instead submitted all at once to one compiler pool of --jobs
processes, as a running server receives a batch: `burst` (cold) and `burst_steady` with each
cuda.cu compiled alone, then `burst_batched`, where cuda.cu sources compiled at the same time share
translation units (compile/batch.py; its per-group preprocessing and header object included);
the ratio burst_steady / burst_batched is printed. Each candidate's tiers, batch and wall time are
printed, so fallbacks to heavier headers and candidates built alone show.
Shared artefacts (header-tier environments, precompiled headers) are built once per toolchain and
flag set and reused by every variant, as a running server does; their cost is printed as
shared_build rows. Wall seconds and CPU seconds (children's user+sys) are printed per variant and
per candidate, then the ratios naive / all and before / all; CPU seconds are the steadier figure
on a shared machine, and the one that bounds throughput (cores x 3600 / CPU s per candidate).

  python benchmarks/verifier_compile.py --data ../shared/data/dice/kernel_infilling_evaluation.json
  python benchmarks/verifier_compile.py --count 4 --skip-naive --variants before,all
  python benchmarks/verifier_compile.py --count 32 --skip-naive --burst --jobs 16
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Callable

from verifier_service.compile import batch as batch_lib
from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib

_NAIVE = textwrap.dedent("""
    import sys, torch  # noqa: F401  (the candidate's own imports need torch)
    source = open(sys.argv[1]).read()
    exec(compile(source, "candidate", "exec"), {"__name__": "candidate"})
""")
VARIANTS = {
    "plain": dict(use_pch=False, light_headers=False, split_nvcc=False),
    "cuda_tiers": dict(use_pch=False, light_headers=True, main_tiers=False, split_nvcc=False),
    "split": dict(use_pch=False, light_headers=False, split_nvcc=True),
    "pch": dict(use_pch=True, light_headers=False, split_nvcc=False),
    "before": dict(use_pch=True, light_headers=True, main_tiers=False, split_nvcc=True),
    "all": dict(use_pch=True, light_headers=True, split_nvcc=True),
}


def _cpu_children() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def naive_build(candidate: str, toolchain: toolchain_lib.Toolchain) -> tuple[float, float, bool]:
  """Fresh process + plain load_inline into an empty extension folder."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "candidate.py")
    with open(path, "w") as f:
      f.write(candidate)
    env = toolchain.build_env()
    env["TORCH_EXTENSIONS_DIR"] = os.path.join(tmp, "ext")
    cpu0, t0 = _cpu_children(), time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _NAIVE, path], env=env, capture_output=True,
                          text=True, check=False)
    return time.monotonic() - t0, _cpu_children() - cpu0, proc.returncode == 0


def print_steps(result: compile_lib.BuildResult) -> None:
  """One build's processes, in start order: its critical path can be read off."""
  print(f"    {result.duration_s:5.1f} s  {result.header_tier or '-'} / {result.main_tier or '-'}",
        flush=True)
  for step in sorted(result.steps, key=lambda s: s["start_s"]):
    queued = f"  (queued {step['queued_s']:.1f} s)" if step["queued_s"] >= 0.05 else ""
    print(f"      {step['start_s']:5.2f} +{step['wall_s']:5.2f} s  {step['step']}{queued}",
          flush=True)


async def ours(compiler: compile_lib.Compiler, exts: list, steps: bool = False
               ) -> tuple[float, float, bool, str]:
  """Builds `exts` one after another; total wall and CPU seconds, all ok, the tiers used."""
  cpu0, t0 = _cpu_children(), time.monotonic()
  notes, ok = set(), True
  for ext in exts:
    result = await compiler.build(ext, timeout_s=3600)
    if steps:
      print_steps(result)
    ok &= result.ok
    notes.add(f"cuda={result.header_tier or '-'} main={result.main_tier or '-'} "
              f"pch={result.pch_used}")
  return time.monotonic() - t0, _cpu_children() - cpu0, ok, "; ".join(sorted(notes))


async def burst(compiler: compile_lib.Compiler, exts: list, ids: list[str]
                ) -> tuple[float, float, bool, str]:
  """Builds `exts` all at once; total wall and CPU seconds, all ok, the tiers used (counted)."""
  cpu0, t0 = _cpu_children(), time.monotonic()
  results = await asyncio.gather(*(compiler.build(ext, timeout_s=3600) for ext in exts))
  tiers: dict[str, int] = {}
  for ident, result in zip(ids, results):
    tier = f"cuda={result.header_tier or '-'} main={result.main_tier or '-'}"
    tiers[tier] = tiers.get(tier, 0) + 1
    if result.batch_size:
      tier += f" batch={result.batch_size}"
    elif result.batch_note:
      tier += f" alone ({result.batch_note[:80]})"
    notes = {**result.tier_notes, **result.main_notes}
    print(f"  {ident:>6s} {result.duration_s:6.1f} s  ok={result.ok}  {tier}"
          + (f"  {notes}" if notes else ""), flush=True)
  return (time.monotonic() - t0, _cpu_children() - cpu0, all(r.ok for r in results),
          "; ".join(f"{k}: {v}" for k, v in sorted(tiers.items())))


def _changed(exts: list, tag: str, cuda_only: bool = False) -> list:
  """The extensions with a comment appended to their sources: new objects, same meaning."""
  mark = lambda sources: tuple(f"{text}\n// {tag}\n" for text in sources)
  return [dataclasses.replace(ext, cuda_sources=mark(ext.cuda_sources), **(
      {} if cuda_only else {"cpp_sources": mark(ext.cpp_sources)})) for ext in exts]


async def _bursts(args: argparse.Namespace, toolchain: toolchain_lib.Toolchain, root: pathlib.Path,
                  exts: list, ids: list[str], report: Callable[..., None]) -> None:
  """The --burst rows: cold with every cuda.cu alone, then steady (sources changed, every
  shared header built) alone, then steady with batching (compile/batch.py: cuda.cu sources
  compiled at once share translation units; its one-off per-group work included)."""
  cache = root / "burst"
  cache.mkdir()
  for sub in ("pch", "headers"):
    os.symlink(root / "shared" / sub, cache / sub)
  rows = (("burst", exts, 1), ("burst_steady", _changed(exts, "steady"), 1),
          ("burst_batched", _changed(exts, "batched"), args.batch_members))
  if args.skip_steady:
    rows = rows[:1] + rows[2:]
  for name, batch, members in rows:
    compiler = compile_lib.Compiler(toolchain, cache,
                                    compile_lib.CompilerOptions(max_jobs=args.jobs,
                                                                batch_members=members))
    try:
      print(f"{name}: {len(batch)} candidates at once, {args.jobs} compiler processes, "
            f"batches of up to {members}", flush=True)
      report(name, *await burst(compiler, batch, ids), n=len(batch))
      if members > 1:
        print(f"  batching: {compiler.batch_stats()}", flush=True)
      await compiler.settle()
    finally:
      await compiler.close()


def _candidates(args: argparse.Namespace) -> list[tuple[str, str]]:
  """(id, candidate source) pairs."""
  if args.candidate:
    return [("file", pathlib.Path(args.candidate).read_text())]
  items = json.loads(pathlib.Path(args.data).read_text())
  if args.item_id:
    items = [i for i in items if str(i["id"]) == args.item_id]
  skip = set(args.skip_ids.split(","))
  items = [i for i in items if str(i["id"]) not in skip]
  usable = [(str(i["id"]), i["cuda_code"]) for i in items
            if checks.check_sources(i["pytorch_code"], i["cuda_code"]).outcome is None]
  return usable[:args.count]


async def run(args: argparse.Namespace) -> list[dict]:
  toolchain = toolchain_lib.discover()
  ids, candidates = zip(*_candidates(args))
  exts = [checks.check_candidate(c).extensions[0] for c in candidates]
  count = len(exts)
  rows = []

  def report(name: str, wall: float, cpu: float, ok: bool, note: str = "", n: int = 1) -> None:
    rows.append({"variant": name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "ok": ok,
                 "per_candidate_wall_s": round(wall / n, 2),
                 "per_candidate_cpu_s": round(cpu / n, 2), "note": note})
    print(f"{name:14s} wall {wall:7.1f} s   cpu {cpu:7.1f} s   per candidate {wall / n:6.1f} / "
          f"{cpu / n:6.1f} s   ok={ok}  {note}", flush=True)

  print(f"{count} candidate(s), {args.jobs} compiler processes", flush=True)
  if not args.skip_naive:
    results = [naive_build(c, toolchain) for c in candidates]
    report("naive", sum(r[0] for r in results), sum(r[1] for r in results),
           all(r[2] for r in results), n=count)
  root = pathlib.Path(tempfile.mkdtemp(prefix="dice-compile-bench-"))
  shared_builds = (("shared_build", {}), ("shared_build_h", dict(main_tiers=False)))
  for label, options in shared_builds[:1] if args.burst else shared_builds:
    shared = compile_lib.Compiler(toolchain, root / "shared",
                                  compile_lib.CompilerOptions(max_jobs=args.jobs, **options))
    cpu0, t0 = _cpu_children(), time.monotonic()
    try:
      ok = await shared.warm_up() is not None
    finally:
      await shared.close()
    report(label, time.monotonic() - t0, _cpu_children() - cpu0, ok,
           "tiers + lite main.cpp header" if not options else "torch/extension.h header")
  if args.burst:
    await _bursts(args, toolchain, root, exts, list(ids), report)
  for name, options in VARIANTS.items() if not args.burst else ():
    if args.variants and name not in args.variants.split(","):
      continue
    cache = root / name
    cache.mkdir()
    for sub in ("pch", "headers"):  # reuse the prebuilt shared artefacts, nothing else
      os.symlink(root / "shared" / sub, cache / sub)
    compiler = compile_lib.Compiler(toolchain, cache,
                                    compile_lib.CompilerOptions(max_jobs=args.jobs, **options))
    try:
      report(name, *await ours(compiler, exts, args.steps), n=count)
      if name == "all":
        await compiler.settle()  # the background header of nvcc's last step
        report("steady", *await ours(compiler, _changed(exts, "steady"), args.steps), n=count)
        changed = _changed(exts, "another rollout", cuda_only=True)
        report("scaffold_warm", *await ours(compiler, changed, args.steps), n=count)
        report("cache_hit", *await ours(compiler, exts), n=count)
    finally:
      await compiler.close()
  by_name = {row["variant"]: row for row in rows}
  for base, fast in (("naive", "all"), ("before", "all"), ("before", "steady")):
    if base in by_name and fast in by_name:
      a, b = by_name[base], by_name[fast]
      print(f"{base} / {fast}: wall {a['wall_s'] / max(b['wall_s'], 0.1):.2f}x   "
            f"cpu {a['cpu_s'] / max(b['cpu_s'], 0.1):.2f}x", flush=True)
  for alone in ("burst_steady", "burst"):
    if alone in by_name and "burst_batched" in by_name:
      a, b = by_name[alone], by_name["burst_batched"]
      print(f"{alone} / burst_batched: wall {a['wall_s'] / max(b['wall_s'], 0.1):.2f}x   "
            f"cpu {a['cpu_s'] / max(b['cpu_s'], 0.1):.2f}x", flush=True)
      break
  for name in ("steady", "burst_steady", "burst_batched"):
    if name not in by_name:
      continue
    cpu = by_name[name]["per_candidate_cpu_s"]
    print(f"{name}: {cpu:.1f} CPU s per candidate: compile-bound at {3600 / cpu:.0f} candidates "
          f"per hour per core ({16 * 3600 / cpu:.0f}/h on 16 such cores)", flush=True)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data", default="../shared/data/dice/kernel_infilling_evaluation.json",
                      help="DICE infilling JSON (used when --candidate is not given)")
  parser.add_argument("--item-id", default="", help="DICE item id (default: the first items)")
  parser.add_argument("--count", type=int, default=1,
                      help="distinct DICE candidates per variant, built one after another "
                           "(default %(default)s)")
  parser.add_argument("--skip-ids", default="",
                      help="comma-separated DICE ids to leave out (e.g. 7526,4383, which need "
                           "CUDA library headers a CPU-only toolkit may lack)")
  parser.add_argument("--candidate", default="", help="a candidate .py file instead of DICE")
  parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                      help="concurrent compiler processes for the verifier's path")
  parser.add_argument("--skip-naive", action="store_true", help="skip the naive load_inline run")
  parser.add_argument("--variants", default="",
                      help="comma-separated subset of " + ",".join(VARIANTS) +
                           " (default: every one)")
  parser.add_argument("--burst", action="store_true",
                      help="submit the candidates all at once instead (variants burst, "
                           "burst_steady, burst_batched)")
  parser.add_argument("--skip-steady", action="store_true",
                      help="--burst without the burst_steady row (burst_batched is then "
                           "compared with the cold burst)")
  parser.add_argument("--batch-members", type=int, default=batch_lib.MAX_MEMBERS,
                      help="the most cuda.cu sources one translation unit holds in the "
                           "burst_batched row (default %(default)s)")
  parser.add_argument("--steps", action="store_true",
                      help="print each one-at-a-time build's processes (start, wall, tool)")
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  args = parser.parse_args()
  rows = asyncio.run(run(args))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
