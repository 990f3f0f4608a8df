"""What the job processes' sandbox costs a call's host side (CPU; issue 16, timing).

A small kernel's timed call is mostly host work: Python, torch's dispatcher, the launch. This
times that work without a GPU: a small torch module's forward on CPU tensors, in fresh processes
that differ in one respect each, in turn for several rounds, so the ratio to `plain` says what a
layer costs (the GPU box runs the same Firecracker kernel family as the CPU VMs):

  plain                 torch imported, the module built, timed
  seccomp               plus the verifier's seccomp filter alone (sandbox._seccomp)
  sandboxed             every sandbox layer (sandbox.lock_down), as the judge runs
  tripwire              plain plus the armed audit hook (guards.Tripwire), as the candidate runs
  sandboxed_tripwire    both, as the candidate's process runs

Each process prints its median microseconds per call over 30 batches of 1,000 calls, after 2,000
warm-up calls. Needs Linux (the sandbox); run as root for every layer.

  python benchmarks/verifier_sandbox_host_cost.py [--rounds 4]   # CPU, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONDITIONS = ("plain", "seccomp", "sandboxed", "tripwire", "sandboxed_tripwire")


def child(condition: str) -> float:
  """Median microseconds per forward call under `condition` (in this fresh process)."""
  import torch  # pylint: disable=import-outside-toplevel
  from verifier_service.run import problem, sandbox  # pylint: disable=import-outside-toplevel
  from verifier_service.untrusted import guards  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(1)  # as both job processes run
  job_dir = tempfile.mkdtemp(prefix="host-cost-")
  locked = condition.startswith("sandboxed")
  netns = sandbox.enter_namespaces() if locked else ""
  model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
  x = torch.randn(8, 64)
  if condition == "seccomp":
    sandbox._seccomp(None)  # pylint: disable=protected-access
  if locked:
    os.chdir(job_dir)
    sandbox.lock_down(sandbox.Policy(job_dir=job_dir, read_only=sandbox.default_read_only([]),
                                     memory_bytes=8 << 30), netns, None)
  if condition.endswith("tripwire"):
    wire = guards.Tripwire({problem.CANDIDATE_FILE}, job_dir, sandbox.default_read_only([]))
    wire.install()
    wire.armed = True
  batches = []
  with torch.no_grad():
    for _ in range(2000):
      model(x)
    for _ in range(30):
      start = time.perf_counter()
      for _ in range(1000):
        model(x)
      batches.append((time.perf_counter() - start) * 1e3)  # microseconds per call
  return statistics.median(batches)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=4, help="rounds of every condition")
  parser.add_argument("--child", choices=CONDITIONS, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print("RESULT " + json.dumps(child(args.child)), flush=True)
    return
  per_call: dict[str, list[float]] = {c: [] for c in CONDITIONS}
  for _ in range(args.rounds):
    for condition in CONDITIONS:
      proc = subprocess.run([sys.executable, __file__, "--child", condition], capture_output=True,
                            text=True, timeout=300, check=False)
      lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
      if not lines:
        print(f"{condition}: failed (exit {proc.returncode}): {proc.stderr[-800:]}", flush=True)
        continue
      per_call[condition].append(json.loads(lines[-1][len("RESULT "):]))
  if not per_call["plain"]:
    sys.exit("the plain condition failed; nothing to compare")
  base = statistics.median(per_call["plain"])
  print(f"{'condition':20} {'us per call, each round':36} x plain (medians)")
  for condition, values in per_call.items():
    if values:
      rounds = ", ".join(f"{v:.2f}" for v in values)
      print(f"{condition:20} {rounds:36} {statistics.median(values) / base:.3f}")


if __name__ == "__main__":
  main()
