"""Measures each compile-speed trick of the verifier against torch's plain load_inline.

One candidate (a DICE infilling item, or a file), cold caches, one variant at a time:
  naive          a fresh Python process calling torch.utils.cpp_extension.load_inline (ninja, both
                 translation units in parallel, empty extension folder): what KernelBench does.
  plain          the verifier's own path with every trick off (same flags and sources as naive).
  light          + torch/extension.h -> torch/types.h in the CUDA translation unit.
  pch            + the precompiled torch/extension.h for main.cpp (header built beforehand; its
                 one-off cost is printed as pch_build).
  light+pch      both (the default).
  scaffold_warm  light+pch with main.cpp already cached, only cuda.cu new: a phase-1 rollout of
                 a problem seen before (its C++ scaffold is fixed, only the CUDA middle changes).
  cache_hit      the same candidate again.
Wall seconds and CPU seconds (children's user+sys) are printed per variant; CPU seconds are the
steadier figure on a shared machine.

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


async def ours(compiler: compile_lib.Compiler, ext) -> tuple[float, float, bool]:
  cpu0, t0 = _cpu_children(), time.monotonic()
  result = await compiler.build(ext, timeout_s=3600)
  return time.monotonic() - t0, _cpu_children() - cpu0, result.ok


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

  def report(name: str, wall: float, cpu: float, ok: bool) -> None:
    rows.append({"variant": name, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "ok": ok})
    print(f"{name:14s} wall {wall:7.1f} s   cpu {cpu:7.1f} s   ok={ok}", flush=True)

  if not args.skip_naive:
    report("naive", *naive_build(candidate, toolchain))
  root = pathlib.Path(tempfile.mkdtemp(prefix="dice-compile-bench-"))
  pch_compiler = compile_lib.Compiler(toolchain, root / "shared", max_jobs=args.jobs)
  cpu0, t0 = _cpu_children(), time.monotonic()
  ok = await pch_compiler.warm_up() is not None
  report("pch_build", time.monotonic() - t0, _cpu_children() - cpu0, ok)
  variants = [("plain", False, False), ("light", False, True), ("pch", True, False),
              ("light+pch", True, True)]
  for name, use_pch, light in variants:
    if args.variants and name not in args.variants.split(","):
      continue
    cache = root / name
    if use_pch:  # reuse the prebuilt header, nothing else
      cache.mkdir()
      os.symlink(root / "shared" / "pch", cache / "pch")
    compiler = compile_lib.Compiler(toolchain, cache, max_jobs=args.jobs, use_pch=use_pch,
                                    light_headers=light)
    report(name, *await ours(compiler, ext))
    if name == "light+pch":
      changed = dataclasses.replace(ext, cuda_sources=tuple(
          s + "\n// another rollout\n" for s in ext.cuda_sources))
      report("scaffold_warm", *await ours(compiler, changed))
      report("cache_hit", *await ours(compiler, ext))
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
                      help="comma-separated subset of plain,light,pch,light+pch (default: all)")
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  args = parser.parse_args()
  rows = asyncio.run(run(args))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
