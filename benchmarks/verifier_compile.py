"""Measures each compile-speed trick of the verifier against torch's plain load_inline.

One candidate (a DICE infilling item, or a file), cold caches, one variant at a time:
  naive          a fresh Python process calling torch.utils.cpp_extension.load_inline (ninja, both
                 translation units in parallel, empty extension folder): what KernelBench does.
  plain          the verifier's own path with every trick off (same flags and sources as naive).
  tiers          + header tiers for cuda.cu (lite, then torch/types.h, then as written).
  split          + nvcc's host and device front ends run concurrently.
  pch            + the precompiled torch/extension.h for main.cpp.
  all            every trick on (the default).
  scaffold_warm  all, with main.cpp already cached and only cuda.cu new: a phase-1 rollout of a
                 problem seen before (its C++ scaffold is fixed, only the CUDA middle changes).
  cache_hit      the same candidate again.
The precompiled header and the header-tier environment are built once per toolchain and flag set
(`warm_up`, printed as shared_build) and reused by every variant, as a running server does.
Wall seconds and CPU seconds (children's user+sys) are printed per variant, then the ratio
naive / all; CPU seconds are the steadier figure on a shared machine.

  python benchmarks/verifier_compile.py --data ../shared/data/dice/kernel_infilling_evaluation.json
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

from verifier_service import checks
from verifier_service import compile as compile_lib
from verifier_service import toolchain as toolchain_lib

_NAIVE = textwrap.dedent("""
    import sys, torch  # noqa: F401  (the candidate's own imports need torch)
    source = open(sys.argv[1]).read()
    exec(compile(source, "candidate", "exec"), {"__name__": "candidate"})
""")


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


async def ours(compiler: compile_lib.Compiler, ext) -> tuple[float, float, bool, str]:
  cpu0, t0 = _cpu_children(), time.monotonic()
  result = await compiler.build(ext, timeout_s=3600)
  note = f"tier={result.header_tier or '-'} pch={result.pch_used} {result.tier_notes or ''}"
  return time.monotonic() - t0, _cpu_children() - cpu0, result.ok, note.strip()


async def run(args: argparse.Namespace) -> list[dict]:
  toolchain = toolchain_lib.discover()
  if args.candidate:
    candidate = pathlib.Path(args.candidate).read_text()
  else:
    items = json.loads(pathlib.Path(args.data).read_text())
    item = next(i for i in items if str(i["id"]) == args.item_id) if args.item_id else items[0]
    candidate = item["cuda_code"]
  ext = checks.check_candidate(candidate).extensions[0]
  rows = []

  def report(name: str, wall: float, cpu: float, ok: bool, note: str = "") -> None:
    rows.append({"variant": name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "ok": ok,
                 "note": note})
    print(f"{name:14s} wall {wall:7.1f} s   cpu {cpu:7.1f} s   ok={ok}  {note}", flush=True)

  if not args.skip_naive:
    report("naive", *naive_build(candidate, toolchain))
  root = pathlib.Path(tempfile.mkdtemp(prefix="dice-compile-bench-"))
  shared = compile_lib.Compiler(toolchain, root / "shared", max_jobs=args.jobs)
  cpu0, t0 = _cpu_children(), time.monotonic()
  try:
    ok = await shared.warm_up() is not None
  finally:
    await shared.close()
  report("shared_build", time.monotonic() - t0, _cpu_children() - cpu0, ok)
  variants = {"plain": dict(use_pch=False, light_headers=False, split_nvcc=False),
              "tiers": dict(use_pch=False, light_headers=True, split_nvcc=False),
              "split": dict(use_pch=False, light_headers=False, split_nvcc=True),
              "pch": dict(use_pch=True, light_headers=False, split_nvcc=False),
              "all": dict(use_pch=True, light_headers=True, split_nvcc=True)}
  for name, options in variants.items():
    if args.variants and name not in args.variants.split(","):
      continue
    cache = root / name
    cache.mkdir()
    for sub in ("pch", "headers"):  # reuse the prebuilt shared artefacts, nothing else
      os.symlink(root / "shared" / sub, cache / sub)
    compiler = compile_lib.Compiler(toolchain, cache, max_jobs=args.jobs, **options)
    try:
      report(name, *await ours(compiler, ext))
      if name == "all":
        changed = dataclasses.replace(ext, cuda_sources=tuple(
            s + "\n// another rollout\n" for s in ext.cuda_sources))
        report("scaffold_warm", *await ours(compiler, changed))
        report("cache_hit", *await ours(compiler, ext))
    finally:
      await compiler.close()
  by_name = {row["variant"]: row for row in rows}
  if "naive" in by_name and "all" in by_name:
    naive, fast = by_name["naive"], by_name["all"]
    print(f"naive / all: wall {naive['wall_s'] / max(fast['wall_s'], 0.1):.1f}x   "
          f"cpu {naive['cpu_s'] / max(fast['cpu_s'], 0.1):.1f}x", flush=True)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data", default="../shared/data/dice/kernel_infilling_evaluation.json",
                      help="DICE infilling JSON (used when --candidate is not given)")
  parser.add_argument("--item-id", default="", help="DICE item id (default: the first item)")
  parser.add_argument("--candidate", default="", help="a candidate .py file instead of DICE")
  parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                      help="concurrent compiler processes for the verifier's path")
  parser.add_argument("--skip-naive", action="store_true", help="skip the naive load_inline run")
  parser.add_argument("--variants", default="",
                      help="comma-separated subset of plain,tiers,split,pch,all (default: every one)")
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  args = parser.parse_args()
  rows = asyncio.run(run(args))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
