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
Shared artefacts (header-tier environments, precompiled headers) are built once per toolchain and
flag set and reused by every variant, as a running server does; their cost is printed as
shared_build rows. Wall seconds and CPU seconds (children's user+sys) are printed per variant and
per candidate, then the ratios naive / all and before / all; CPU seconds are the steadier figure
on a shared machine, and the one that bounds throughput (cores x 3600 / CPU s per candidate).

  python benchmarks/verifier_compile.py --data ../shared/data/dice/kernel_infilling_evaluation.json
  python benchmarks/verifier_compile.py --count 4 --skip-naive --variants before,all
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


async def ours(compiler: compile_lib.Compiler, exts: list) -> tuple[float, float, bool, str]:
  """Builds `exts` one after another; total wall and CPU seconds, all ok, the tiers used."""
  cpu0, t0 = _cpu_children(), time.monotonic()
  notes, ok = set(), True
  for ext in exts:
    result = await compiler.build(ext, timeout_s=3600)
    ok &= result.ok
    notes.add(f"cuda={result.header_tier or '-'} main={result.main_tier or '-'} "
              f"pch={result.pch_used}")
  return time.monotonic() - t0, _cpu_children() - cpu0, ok, "; ".join(sorted(notes))


def _candidates(args: argparse.Namespace) -> list[str]:
  if args.candidate:
    return [pathlib.Path(args.candidate).read_text()]
  items = json.loads(pathlib.Path(args.data).read_text())
  if args.item_id:
    items = [i for i in items if str(i["id"]) == args.item_id]
  skip = set(args.skip_ids.split(","))
  items = [i for i in items if str(i["id"]) not in skip]
  usable = [i["cuda_code"] for i in items
            if checks.check_sources(i["pytorch_code"], i["cuda_code"]).outcome is None]
  return usable[:args.count]


async def run(args: argparse.Namespace) -> list[dict]:
  toolchain = toolchain_lib.discover()
  candidates = _candidates(args)
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
  for label, options in (("shared_build", {}), ("shared_build_h", dict(main_tiers=False))):
    shared = compile_lib.Compiler(toolchain, root / "shared", max_jobs=args.jobs, **options)
    cpu0, t0 = _cpu_children(), time.monotonic()
    try:
      ok = await shared.warm_up() is not None
    finally:
      await shared.close()
    report(label, time.monotonic() - t0, _cpu_children() - cpu0, ok,
           "tiers + lite main.cpp header" if not options else "torch/extension.h header")
  for name, options in VARIANTS.items():
    if args.variants and name not in args.variants.split(","):
      continue
    cache = root / name
    cache.mkdir()
    for sub in ("pch", "headers"):  # reuse the prebuilt shared artefacts, nothing else
      os.symlink(root / "shared" / sub, cache / sub)
    compiler = compile_lib.Compiler(toolchain, cache, max_jobs=args.jobs, **options)
    try:
      report(name, *await ours(compiler, exts), n=count)
      if name == "all":
        await compiler.settle()  # the background header of nvcc's last step
        steady = [dataclasses.replace(ext, cpp_sources=tuple(s + "\n// steady\n" for s in (
            ext.cpp_sources)), cuda_sources=tuple(s + "\n// steady\n" for s in ext.cuda_sources))
                  for ext in exts]
        report("steady", *await ours(compiler, steady), n=count)
        changed = [dataclasses.replace(ext, cuda_sources=tuple(
            s + "\n// another rollout\n" for s in ext.cuda_sources)) for ext in exts]
        report("scaffold_warm", *await ours(compiler, changed), n=count)
        report("cache_hit", *await ours(compiler, exts), n=count)
    finally:
      await compiler.close()
  by_name = {row["variant"]: row for row in rows}
  for base, fast in (("naive", "all"), ("before", "all"), ("before", "steady")):
    if base in by_name and fast in by_name:
      a, b = by_name[base], by_name[fast]
      print(f"{base} / {fast}: wall {a['wall_s'] / max(b['wall_s'], 0.1):.2f}x   "
            f"cpu {a['cpu_s'] / max(b['cpu_s'], 0.1):.2f}x", flush=True)
  if "steady" in by_name:
    cpu = by_name["steady"]["per_candidate_cpu_s"]
    print(f"steady: {cpu:.1f} CPU s per candidate: compile-bound at {3600 / cpu:.0f} candidates "
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
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  args = parser.parse_args()
  rows = asyncio.run(run(args))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
