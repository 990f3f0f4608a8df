"""Where a GPU job's processes spend their CPU: py-spy samples of the run stage, per role.

Reads py-spy's raw (collapsed) output of a served verifier recorded with `--subprocesses`
(benchmarks/gpu_rl_speed.sh's `profile` part records benchmarks/verifier_run_stage.py so) and
sorts each sample by the process it came from: the worker, a job's judge (a forked child whose
stack reaches worker/job_process.py and trusted/judge.py), a job's candidate process
(untrusted/child.py), or a job process still in its set-up. For each role it prints the CPU
seconds sampled (samples / rate) and, per job, the functions with the most inclusive time (each
sample counts once for every distinct function on its stack, so a caller holds its callees;
functions on every sample of the role, the process's entry, are left out) and those with the
most self time (the sample's innermost frame). Without py-spy's --native only Python frames are
seen: time in the CUDA driver or torch's C++ shows as the Python call that entered it. Idle
threads are not sampled (py-spy's default), so these are CPU seconds, not wall seconds.

  python benchmarks/profile_jobs.py SPY.txt --rate 100 --jobs 40 [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import re

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def role(frames: list[str]) -> str:
  """The process a sample's stack (process frames removed) belongs to."""
  text = ";".join(frames)
  if "worker/job_process.py" not in text:
    return "worker" if "verifier_service/worker/" in text else "other"
  if "trusted/judge.py" in text and "untrusted/" not in text:
    return "judge"
  if "untrusted/child.py" in text:
    return "candidate"
  return "job set-up"


def function(frame: str) -> str:
  """`function (path/to/file.py)`, the line number dropped and site-packages' prefix cut."""
  match = _FRAME.match(frame)
  if match is None:
    return frame
  path = re.sub(r"^.*?/site-packages/", "", match.group("file"))
  return f"{match.group('function')} ({path})"


def read(path: str) -> tuple[collections.Counter, dict[str, collections.Counter],
                             dict[str, collections.Counter]]:
  """Samples per role, and per role the samples of every function on their stacks and of their
  innermost frames."""
  totals: collections.Counter = collections.Counter()
  by_function: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  by_leaf: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      stack, _, count = line.rstrip("\n").rpartition(" ")
      if not count.isdigit():
        continue
      frames = [s for s in stack.split(";") if not s.startswith("process ")]
      who = role(frames)
      totals[who] += int(count)
      for name in {function(frame) for frame in frames}:
        by_function[who][name] += int(count)
      if frames:
        by_leaf[who][function(frames[-1])] += int(count)
  return totals, by_function, by_leaf


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("raw", help="py-spy record --format raw output")
  parser.add_argument("--rate", type=float, default=100.0, help="py-spy's --rate")
  parser.add_argument("--jobs", type=int, default=1, help="jobs the recording ran (per-job s)")
  parser.add_argument("--top", type=int, default=25)
  args = parser.parse_args(argv)
  totals, by_function, by_leaf = read(args.raw)
  per_job = lambda samples: samples / args.rate / max(1, args.jobs)
  print(f"CPU-s sampled per job, by role ({args.jobs} jobs, {args.rate:g} Hz): " + ", ".join(
      f"{who} {per_job(n):.3f}" for who, n in totals.most_common()))
  for who in ("judge", "candidate", "job set-up", "worker"):
    if not totals[who]:
      continue
    print(f"--- {who}: {per_job(totals[who]):.3f} CPU-s a job; inclusive, per job")
    inclusive = [(n, c) for n, c in by_function[who].most_common() if c < totals[who]]
    for name, samples in inclusive[:args.top]:
      print(f"  {per_job(samples):7.3f}  {samples / totals[who]:5.1%}  {name}")
    print(f"--- {who}: self, per job")
    for name, samples in by_leaf[who].most_common(args.top // 2):
      print(f"  {per_job(samples):7.3f}  {samples / totals[who]:5.1%}  {name}")


if __name__ == "__main__":
  main()
