"""Where an RL step's compile CPU-seconds went: its builds, read from their BuildResults.

Used by benchmarks/verifier_rl_burst.py, which keeps every build the served verifier ran
(`compiler.Compiler.build`'s results, with their processes: BuildResult.steps, whose `cpu_s` the
compile stage's exec wrapper measures per process tree). Each process is put in one bucket by
what it compiled:

  main.cpp        g++ on load_inline's binding (once per problem: later samples hit its cache)
  cuda.cu         one candidate's cuda.cu, alone (nvcc or one of its split steps)
  batch           a batch translation unit (batch.py), or its include block's own object and
                  name lists (counted on the build that started the batch)
  device, host    the split path's device-only nvcc and host-only g++ (device_split.py)
  link            g++ linking a module
  tools           readelf/nm/objdump/c++filt on objects, and anything else

A build's `path` says how its cuda.cu ended: the header tier, "batch<n>", "split", or "failed",
with "+fallback" when a faster path was tried first and did not give the object.
"""

from __future__ import annotations

import collections
import statistics

BUCKETS = ("main.cpp", "cuda.cu", "batch", "device", "host", "link", "tools")


def bucket(entry: dict) -> str:
  """The bucket of one BuildResult step (procs.Trace)."""
  step, what = entry["step"], entry.get("what", "")
  if what in ("batch", "device", "host"):
    return what
  if "main.cpp" in step:
    return "main.cpp"
  if step.endswith(".so") or step.startswith(("c++ ", "g++ ")) and ".o" in step:
    return "link"
  if any(t in step for t in ("readelf", "nm", "objdump", "c++filt")):
    return "tools"
  if "cuda.cu" in step or any(t in step for t in ("cicc", "cudafe++", "ptxas", "fatbinary",
                                                    "nvcc", "gcc", "g++", "c++")):
    return "cuda.cu"
  return "tools"


def path_of(build: dict) -> str:
  """How a build's cuda.cu was made (see the module docstring)."""
  if build.get("cache_hit"):
    return "cache"
  if not build.get("ok"):
    return "failed"
  if build.get("split"):
    base = "split"
  elif build.get("batch_size"):
    base = f"batch{build['batch_size']}"
  else:
    base = build.get("header_tier") or "none"
  tried = build.get("batch_note") or build.get("split_note")
  return base + ("+fallback" if tried and base != "split" else "")


def summarise(builds: list[dict]) -> dict:
  """CPU-s by bucket, per build and per failed build; paths, tiers, batch notes."""
  cpu = collections.Counter()
  per_build, failed_cpu, lone_compiles_failed = [], [], []
  for b in builds:
    total = 0.0
    for s in b.get("steps", ()):
      seconds = s.get("cpu_s", 0.0)
      cpu[bucket(s)] += seconds
      total += seconds
    if not b.get("cache_hit"):
      per_build.append(total)
    if not b.get("ok") and not b.get("cache_hit"):
      failed_cpu.append(total)
      lone_compiles_failed.append(sum(1 for s in b.get("steps", ()) if bucket(s) == "cuda.cu"))
  notes = collections.Counter()
  for b in builds:
    for tier, why in (b.get("tier_notes") or {}).items():
      notes[f"{tier}: {why[:70]}"] += 1
    if b.get("batch_note"):
      notes[f"batch: {b['batch_note'][:70]}"] += 1
    if b.get("split_note"):
      notes[f"split: {b['split_note'][:70]}"] += 1
  return {
      "builds": len(builds), "cache_hits": sum(1 for b in builds if b.get("cache_hit")),
      "cpu_s_by_bucket": {k: round(cpu[k], 1) for k in BUCKETS if cpu[k]},
      "cpu_s_total": round(sum(cpu.values()), 1),
      "cpu_s_per_build_mean": round(statistics.mean(per_build), 2) if per_build else 0.0,
      "cpu_s_per_build_p50": round(statistics.median(per_build), 2) if per_build else 0.0,
      "cpu_s_per_failed_build_mean": (round(statistics.mean(failed_cpu), 2) if failed_cpu
                                      else 0.0),
      "failed_builds": len(failed_cpu),
      "cuda_processes_per_failed_build": dict(collections.Counter(lone_compiles_failed)),
      "paths": dict(collections.Counter(path_of(b) for b in builds)),
      "main_tiers": dict(collections.Counter(b.get("main_tier") or "-" for b in builds
                                             if not b.get("cache_hit"))),
      "notes": dict(notes.most_common(12)),
  }


def line(summary: dict) -> str:
  """One printable line of `summarise`'s figures."""
  buckets = ", ".join(f"{k} {v:.0f}" for k, v in summary["cpu_s_by_bucket"].items())
  return (f"  builds {summary['builds']} ({summary['cache_hits']} cached); compile CPU-s "
          f"{summary['cpu_s_total']:.0f} ({buckets}); per build mean "
          f"{summary['cpu_s_per_build_mean']:.1f}, p50 {summary['cpu_s_per_build_p50']:.1f}; "
          f"{summary['failed_builds']} failed at {summary['cpu_s_per_failed_build_mean']:.1f} each; "
          f"paths {summary['paths']}")
