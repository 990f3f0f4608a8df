"""Sizes the compile stage's bounds (compile/limits.py) against honest DICE compiles, and measures
what confinement (compile/confine.py) costs per compiler process.

Builds DICE's phase-1 candidates (prefix + middle + suffix, as graded) through the real Compiler,
confined and bounded as a server runs it, one at a time (and with --burst all at once, so batched
translation units are measured too), while a thread samples every compiler process tree (psutil,
every 10 ms). Per build it prints: peak memory of one process tree (the sum of its processes' RSS,
what a cgroup's memory.max would see) and of one process (what RLIMIT_DATA bounds), the largest
CPU time of one process (RLIMIT_CPU), the largest file in the build folders (RLIMIT_FSIZE), the
log bytes kept, and the most tasks alive in one tree (threads count: pids.max). Then the maxima and
the ratio of each limit to its maximum (the headroom; a ratio below 1 means an honest compile
would be killed).

--overhead: `nvcc --version`, a tiny g++ compile and /bin/true run N times each: plainly, under
`nice -n 10` (how the runner started compilers before confinement) and through the wrapper with
every layer at the same nice level (how it starts them now), interleaved; prints the medians, the
differences per process and the ratios.

  python benchmarks/verifier_compile_limits.py --count 10            # the 10 largest sources
  python benchmarks/verifier_compile_limits.py --count 50 --jobs 16           # GPU box, in parts
  python benchmarks/verifier_compile_limits.py --offset 50 --count 0 --burst --jobs 16
  python benchmarks/verifier_compile_limits.py --count 10 --original --overhead 0   # as written
  python benchmarks/verifier_compile_limits.py --overhead 50 --no-builds      # overhead only
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import pathlib
import resource
import statistics
import subprocess
import tempfile
import threading
import time

import psutil


class TreeSampler:
  """Samples this process's children and their descendants (each child: one tree) until closed.
  Trees whose command line holds `skip` (the shared header builds' own file bound) are left out:
  they have bounds of their own (Limits.shared) and are measured separately; so are children
  already alive when sampling starts (a test session's long-lived servers): not the work measured.

  peak_tree_bytes: the largest sum of RSS over one tree at one sample (peak_tree: its processes'
  command lines and RSS then; forked processes' shared pages count in each); peak_process_bytes: the
  largest RSS of one process; peak_data_bytes: the largest data segment of one process (virtual:
  heap and private mappings, what RLIMIT_DATA counts); max_process_cpu_s: the most CPU one process had used when last
  seen; peak_tasks: the most threads alive in one tree; processes: distinct pids seen. Sampled:
  a process shorter than the interval can be missed.

  A child of this process seen between its fork and its exec is left out of that sample: until the
  exec it shares this process's pages (Python's vfork: the same memory; a fork: the same pages,
  copied on write), so its RSS reads as this process's (a test session's pytest process: 6.0 GB in
  CI, sampled as a compiler tree against a 2 GiB bound). Its command line, read before its memory,
  is still this process's then; the exec replaces both at once."""

  def __init__(self, interval_s: float = 0.01, skip: str | None = None):
    self.interval_s = interval_s
    self.skip = skip
    self.peak_tree_bytes = 0
    self.peak_tree: list[tuple[str, int]] = []
    self.peak_process_bytes = 0
    self.peak_data_bytes = 0
    self.max_process_cpu_s = 0.0
    self.peak_tasks = 0
    self.processes: set[int] = set()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._before: set[tuple[int, float]] = set()

  def __enter__(self) -> TreeSampler:
    self._before = {_identity(p) for p in psutil.Process().children(recursive=False)}
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    me = psutil.Process()
    mine = me.cmdline()
    while not self._stop.is_set():
      for root in me.children(recursive=False):
        try:
          if _identity(root) in self._before:
            continue
          command = root.cmdline()  # before its memory: see the class's note on vfork
          if command == mine or (self.skip and self.skip in command):
            continue
          tree = [root] + root.children(recursive=True)
        except psutil.Error:
          continue
        rss = tasks = 0
        seen = []
        for proc in tree:
          try:
            with proc.oneshot():
              memory = proc.memory_info()
              one = memory.rss
              times = proc.cpu_times()
              tasks += proc.num_threads()
              seen.append((" ".join(proc.cmdline())[:160], one))
          except psutil.Error:
            continue
          rss += one
          self.processes.add(proc.pid)
          self.peak_process_bytes = max(self.peak_process_bytes, one)
          self.peak_data_bytes = max(self.peak_data_bytes, memory.data)
          self.max_process_cpu_s = max(self.max_process_cpu_s, times.user + times.system)
        if rss > self.peak_tree_bytes:
          self.peak_tree_bytes, self.peak_tree = rss, seen
        self.peak_tasks = max(self.peak_tasks, tasks)
      self._stop.wait(self.interval_s)


def _identity(process: psutil.Process) -> tuple[int, float]:
  """A process as itself, not its pid alone (pids are reused)."""
  try:
    return process.pid, process.create_time()
  except psutil.Error:
    return process.pid, 0.0


class FileSampler:
  """The largest file seen under a folder (the builds' scratch folders), sampled; the shared
  header builds' folders (pch-*, env-*: their own bounds) left out."""

  def __init__(self, folder: pathlib.Path, interval_s: float = 0.05, shared: bool = False):
    self.folder = folder
    self.shared = shared  # measure the shared header builds' folders instead of skipping them
    self.largest = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self.interval_s = interval_s

  def __enter__(self) -> FileSampler:
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    while not self._stop.is_set():
      for root, dirs, files in os.walk(self.folder):
        if not self.shared:
          dirs[:] = [d for d in dirs if not d.startswith(("pch-", "env-"))]
        for name in files:
          try:
            self.largest = max(self.largest, os.path.getsize(os.path.join(root, name)))
          except OSError:
            pass
      self._stop.wait(self.interval_s)


def _cpu_children() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _candidates(path: str, count: int, ids: str = "", offset: int = 0) -> list[tuple[str, str]]:
  """(id, graded candidate) of DICE's phase-1 items the static checks accept, largest first,
  from `offset` (only `ids`, comma-separated, when given)."""
  from verifier_service.compile import checks  # pylint: disable=import-outside-toplevel
  items = json.loads(pathlib.Path(path).read_text())
  out = []
  wanted = set(filter(None, ids.split(",")))
  for item in items:
    if wanted and str(item["id"]) not in wanted:
      continue
    source = item["cuda_code"]  # prefix + middle + suffix
    if checks.check_sources(item["pytorch_code"], source).outcome is None:
      out.append((str(item["id"]), source))
  out.sort(key=lambda pair: -len(pair[1]))
  out = out[offset:]
  return out[:count] if count else out


def _largest_log(cache: pathlib.Path) -> int:
  sizes = [p.stat().st_size for p in cache.glob("obj/*/*/*.log")]
  return max(sizes, default=0)


async def _builds(args, toolchain, limits, rows: list[dict]) -> None:
  from verifier_service.compile import checks  # pylint: disable=import-outside-toplevel
  from verifier_service.compile import compiler as compile_lib  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tempfile.mkdtemp(prefix="dice-limits-"))
  shared = compile_lib.Compiler(toolchain, root / "shared",
                                compile_lib.CompilerOptions(max_jobs=args.jobs, limits=limits))
  try:
    t0 = time.monotonic()
    with TreeSampler() as sampler, FileSampler(root / "shared", shared=True) as files:
      await shared.warm_up()
      await shared.settle()
    rows.append(_row("shared headers", True, time.monotonic() - t0, 0.0, sampler, files, 0))
  finally:
    await shared.close()
  cache = root / "builds"
  cache.mkdir()
  for sub in ("pch", "headers"):
    os.symlink(root / "shared" / sub, cache / sub)
  compiler = compile_lib.Compiler(toolchain, cache,
                                  compile_lib.CompilerOptions(max_jobs=args.jobs, limits=limits,
                                                              light_headers=not args.original))
  skip = str(limits.shared().file_bytes)  # the shared builds' wrapper argument
  pairs = _candidates(args.problems, args.count, args.ids, args.offset)
  exts = [(ident, checks.check_candidate(c).extensions[0]) for ident, c in pairs]
  try:
    for ident, ext in exts:
      cpu0, t0 = _cpu_children(), time.monotonic()
      with TreeSampler(skip=skip) as sampler, FileSampler(cache / "tmp") as files:
        result = await compiler.build(ext, 3600)
      rows.append(_row(ident, result.ok, time.monotonic() - t0, _cpu_children() - cpu0, sampler,
                       files, max(len(result.log.encode()), _largest_log(cache))))
      if not result.ok:
        print(f"  {ident}: {result.log.splitlines()[0] if result.log else ''}", flush=True)
    if args.burst:
      changed = [(i, dataclasses.replace(e, cuda_sources=tuple(
          s + "\n// burst\n" for s in e.cuda_sources))) for i, e in exts]
      cpu0, t0 = _cpu_children(), time.monotonic()
      with TreeSampler(skip=skip) as sampler, FileSampler(cache / "tmp") as files:
        results = await asyncio.gather(*(compiler.build(e, 3600, problem=i) for i, e in changed))
      rows.append(_row(f"burst of {len(changed)}", all(r.ok for r in results),
                       time.monotonic() - t0, _cpu_children() - cpu0, sampler, files,
                       _largest_log(cache)))
      print(f"  batching: {compiler.batch_stats()}", flush=True)
  finally:
    await compiler.close()


def _row(name, ok, wall, cpu, sampler: TreeSampler, files: FileSampler, log_bytes: int) -> dict:
  row = {"build": name, "ok": ok, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
         "tree_peak_gib": round(sampler.peak_tree_bytes / 2**30, 3),
         "process_peak_gib": round(sampler.peak_process_bytes / 2**30, 3),
         "process_data_gib": round(sampler.peak_data_bytes / 2**30, 3),
         "process_cpu_s": round(sampler.max_process_cpu_s, 1),
         "largest_file_mib": round(files.largest / 2**20, 1),
         "log_kib": round(log_bytes / 1024, 1), "tasks": sampler.peak_tasks,
         "processes": len(sampler.processes)}
  print(f"{name:>16s} ok={ok!s:5s} wall {wall:6.1f} s  cpu {cpu:6.1f} s  tree {row['tree_peak_gib']:6.3f} "
        f"GiB  process {row['process_peak_gib']:6.3f} GiB (data {row['process_data_gib']:6.3f})  process cpu {row['process_cpu_s']:6.1f} s  "
        f"file {row['largest_file_mib']:7.1f} MiB  log {row['log_kib']:7.1f} KiB  "
        f"tasks {row['tasks']:3d}  processes {row['processes']:3d}", flush=True)
  return row


def _headroom(rows: list[dict], limits) -> None:
  honest = [r for r in rows if r["build"] != "shared headers"]
  if not honest:
    return
  peak = lambda key: max(r[key] for r in honest)
  checks = (("memory (process data)", peak("process_data_gib") * 2**30, limits.memory_bytes),
            ("memory (process RSS)", peak("process_peak_gib") * 2**30, limits.memory_bytes),
            ("memory (tree, cgroup)", peak("tree_peak_gib") * 2**30, limits.memory_bytes),
            ("CPU s (per process)", peak("process_cpu_s"), limits.cpu_s),
            ("file size", peak("largest_file_mib") * 2**20, limits.file_bytes),
            ("tasks (per tree)", peak("tasks"), limits.processes),
            ("output read back", peak("log_kib") * 1024, limits.output_bytes))
  print("limit / largest honest use:")
  for name, used, limit in checks:
    ratio = limit / used if used else float("inf")
    print(f"  {name:24s} largest {used:14.1f}  limit {limit:14.1f}  ratio {ratio:7.1f}x", flush=True)
  shared = next((r for r in rows if r["build"] == "shared headers"), None)
  if shared:
    print(f"  shared headers (their own bounds: {limits.shared()}): "
          f"largest file {shared['largest_file_mib']} MiB, process {shared['process_peak_gib']} GiB "
          f"(data {shared['process_data_gib']} GiB), "
          f"process cpu {shared['process_cpu_s']} s", flush=True)


def _overhead(toolchain, limits, n: int) -> None:
  """Per-process cost of the wrapper with every layer, against the same command run plainly."""
  from verifier_service.compile import confine  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(tempfile.mkdtemp(prefix="dice-confine-cost-"))
  confinement = confine.Confinement(root / "cache", toolchain.cuda_root, toolchain.cxx,
                                    toolchain.build_env(), limits)
  work = root / "work"
  work.mkdir()
  (work / "t.cpp").write_text("int add(int a, int b) { return a + b; }\n")
  commands = {"nvcc --version": [toolchain.nvcc, "--version"],
              "g++ -c (tiny)": [toolchain.cxx, "-c", "t.cpp", "-o", "t.o"],
              "/bin/true": ["/bin/true"]}
  try:
    for name, argv in commands.items():
      times = {"plain": [], "nice": [], "confined": []}
      for _ in range(n):
        for kind in times:
          full = {"plain": argv, "nice": ["nice", "-n", "10", *argv],
                  "confined": confinement.argv(argv, rw=work, nice=10)}[kind]
          t0 = time.perf_counter()
          subprocess.run(full, cwd=work, env=confinement.env, capture_output=True, check=True)
          times[kind].append(time.perf_counter() - t0)
      plain, nice, confined = (statistics.median(times[k]) * 1000 for k in times)
      print(f"overhead {name:16s} plain {plain:7.2f} ms  nice (the runner before) {nice:7.2f} ms  "
            f"confined {confined:7.2f} ms  +{confined - plain:5.2f} ms per process over plain "
            f"({confined / plain:4.2f}x), +{confined - nice:5.2f} ms over nice "
            f"({confined / nice:4.2f}x)  (medians of {n}, interleaved)", flush=True)
  finally:
    confinement.close()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--problems", default="../shared/data/dice/kernel_infilling_evaluation.json",
                      help="DICE phase-1 JSON (items with pytorch_code and cuda_code)")
  parser.add_argument("--count", type=int, default=10,
                      help="the N largest candidate sources (0: all; default %(default)s)")
  parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                      help="compiler processes at once (default: CPU count)")
  parser.add_argument("--burst", action="store_true",
                      help="also build them all at once (batched translation units)")
  parser.add_argument("--overhead", type=int, default=20, metavar="N",
                      help="repetitions of the per-process overhead measurement (0: skip)")
  parser.add_argument("--offset", type=int, default=0,
                      help="skip the OFFSET largest sources first (to split the set across runs)")
  parser.add_argument("--ids", default="", help="only these DICE item ids (comma-separated)")
  parser.add_argument("--original", action="store_true",
                      help="build every source as written (no light header tiers): the fallback "
                           "path, torch/extension.h parsed whole, the heaviest honest compile")
  parser.add_argument("--no-builds", action="store_true", help="only the overhead measurement")
  parser.add_argument("--json", default="", help="write the rows here")
  args = parser.parse_args()
  os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
  from verifier_service.compile import limits as limits_lib  # pylint: disable=import-outside-toplevel
  from verifier_service.compile import toolchain as toolchain_lib  # pylint: disable=import-outside-toplevel
  toolchain = toolchain_lib.discover()
  limits = limits_lib.Limits()
  print(f"limits: {limits}", flush=True)
  if args.overhead:
    _overhead(toolchain, limits, args.overhead)
  rows: list[dict] = []
  if not args.no_builds:
    asyncio.run(_builds(args, toolchain, limits, rows))
    _headroom(rows, limits)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
