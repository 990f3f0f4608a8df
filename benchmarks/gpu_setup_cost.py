"""What a job process's set-up costs on a GPU, step by step, one at a time and many at once.

A GPU slot forks a pair of processes per job from its worker (torch imported, no CUDA) and each
makes its CUDA context before its job comes (worker/pair.py; untrusted/child.trusted_setup,
trusted/judge.setup). In the H100 RL burst of 2026-12-06 a job waited 0.47 s (mean) for that
set-up to finish after it came (`judge_setup_left`). This forks `--processes` children at once
from a parent prepared as the worker is (child.prepare_worker), `--rounds` times, each child
running the candidate side's set-up steps in order and timing each (wall and its own CPU):

  import cpp_extension   `from torch.utils import cpp_extension`
  cuda.init             torch.cuda.init()
  first tensor          torch.zeros(1, device="cuda") (the context, the caching allocator)
  memory fraction       torch.cuda.set_per_process_memory_fraction(0.45)
  properties            torch.cuda.get_device_properties
  import profiler       importlib.import_module("torch.profiler")

  wait for the GPU     torch.cuda._sleep for 0.2 s of the GPU's clock, then synchronize: the
                        CPU a process spends waiting on its GPU (CUDA spins a core by default)

and prints each step's median and p90 over every child of every round, per concurrency level.
`--blocking-sync` first sets the context's blocking-synchronisation flag as a job process does
with ServerConfig.cuda_blocking_sync (run/timing.block_on_sync), and says whether it took.

`--churn K ...` asks how many CUDA contexts one GPU makes and tears down a second: for `--churn-s`
seconds it keeps K children alive, each forked as above, making its context (first tensor), doing
`--churn-work-s` of GPU work, and exiting; a child that ends is reaped and replaced at once. Per
K it prints children a second, and the medians of a child's life (fork to reaped), its context
and its exit (its last line to reaped). A job forks two such processes (worker/pair.py), and the
run stage gave ~1.9 jobs/s at 4 slots and at 8 on an H100 (2026-12-06, runs 18 and 20-23)
whatever each variant took off a slot's job: if children a second stop growing with K near
twice that, making and tearing down contexts is what bounds the run stage.

  python benchmarks/gpu_setup_cost.py --processes 1 8 --rounds 3 [--blocking-sync]
  python benchmarks/gpu_setup_cost.py --processes --churn 1 2 4 8 --churn-s 15
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import time


def _steps() -> list[tuple[str, object]]:
  import torch  # pylint: disable=import-outside-toplevel

  def cpp() -> None:
    from torch.utils import cpp_extension  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import

  return [("import cpp_extension", cpp), ("cuda.init", torch.cuda.init),
          ("first tensor", lambda: torch.zeros(1, device="cuda")),
          ("memory fraction", lambda: torch.cuda.set_per_process_memory_fraction(0.45, 0)),
          ("properties", lambda: torch.cuda.get_device_properties(0)),
          ("import profiler", lambda: importlib.import_module("torch.profiler")),
          ("wait for the GPU", _wait)]


def _wait() -> None:
  import torch  # pylint: disable=import-outside-toplevel
  clock_hz = torch.cuda.get_device_properties(0).clock_rate * 1000  # kHz
  torch.cuda._sleep(int(0.2 * clock_hz))  # pylint: disable=protected-access
  torch.cuda.synchronize()


def _child(write_fd: int, start_fd: int, blocking: bool) -> None:
  from verifier_service.run import timing  # pylint: disable=import-outside-toplevel
  os.read(start_fd, 1)  # all children start together
  if blocking:
    timing.block_on_sync("cuda")
  out: dict = {}
  for name, step in _steps():
    wall, cpu = time.monotonic(), time.process_time()
    step()
    out[name] = (time.monotonic() - wall, time.process_time() - cpu)
  out["blocks on sync"] = timing.context_blocks_on_sync()
  os.write(write_fd, json.dumps(out).encode())


def round_of(processes: int, blocking: bool) -> list[dict]:
  start_r, start_w = os.pipe()
  children = []
  for _ in range(processes):
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
      code = 0
      try:
        os.close(read_fd)
        _child(write_fd, start_r, blocking)
      except BaseException:  # pylint: disable=broad-except
        code = 1
      os._exit(code)  # pylint: disable=protected-access
    os.close(write_fd)
    children.append((pid, read_fd))
  time.sleep(0.5)  # every child forked and waiting
  os.write(start_w, b"x" * processes)
  results = []
  for pid, read_fd in children:
    with os.fdopen(read_fd, "rb") as f:
      data = f.read()
    os.waitpid(pid, 0)
    if data:
      results.append(json.loads(data))
  os.close(start_r)
  os.close(start_w)
  return results


def _churn_child(write_fd: int, work_s: float) -> None:
  import torch  # pylint: disable=import-outside-toplevel
  mark = time.monotonic()
  torch.zeros(1, device="cuda")
  context_s = time.monotonic() - mark
  if work_s > 0:
    clock_hz = torch.cuda.get_device_properties(0).clock_rate * 1000  # kHz
    torch.cuda._sleep(int(work_s * clock_hz))  # pylint: disable=protected-access
  torch.cuda.synchronize()
  os.write(write_fd, json.dumps({"context_s": context_s, "done_at": time.monotonic()}).encode())


def churn(concurrency: int, seconds: float, work_s: float) -> dict[str, float]:
  """K children alive at a time for `seconds`, each forked, making its context and exiting; what
  they took (wall s) and how many ended a second."""
  live: dict[int, tuple[float, int]] = {}  # pid: (forked at, read end)
  lives, contexts, exits, failed = [], [], [], 0
  start = time.monotonic()
  while live or time.monotonic() - start < seconds:
    while len(live) < concurrency and time.monotonic() - start < seconds:
      read_fd, write_fd = os.pipe()
      forked_at = time.monotonic()
      pid = os.fork()
      if pid == 0:
        code = 0
        try:
          os.close(read_fd)
          _churn_child(write_fd, work_s)
        except BaseException:  # pylint: disable=broad-except
          code = 1
        os._exit(code)  # pylint: disable=protected-access
      os.close(write_fd)
      live[pid] = (forked_at, read_fd)
    pid, wait_status = os.wait()
    reaped_at = time.monotonic()
    forked_at, read_fd = live.pop(pid)
    with os.fdopen(read_fd, "rb") as f:
      data = f.read()
    if wait_status != 0 or not data:
      failed += 1
      continue
    report = json.loads(data)
    lives.append(reaped_at - forked_at)
    contexts.append(report["context_s"])
    exits.append(reaped_at - report["done_at"])
  wall = time.monotonic() - start
  med = lambda xs: statistics.median(xs) if xs else float("nan")
  return {"children": len(lives), "failed": failed, "per_s": len(lives) / wall,
          "life_s": med(lives), "context_s": med(contexts), "exit_s": med(exits)}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--processes", type=int, nargs="*", default=[1, 8])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--blocking-sync", action="store_true")
  parser.add_argument("--churn", type=int, nargs="*", default=[],
                      help="children alive at once, one line per figure (see above)")
  parser.add_argument("--churn-s", type=float, default=15.0)
  parser.add_argument("--churn-work-s", type=float, default=0.0)
  args = parser.parse_args(argv)
  import torch  # pylint: disable=import-outside-toplevel
  from verifier_service.untrusted import child  # pylint: disable=import-outside-toplevel
  child.prepare_worker()  # as the worker does before it forks
  print(f"torch {torch.__version__}; {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.2f}")
  for processes in args.processes:
    rows = [r for _ in range(args.rounds) for r in round_of(processes, args.blocking_sync)]
    print(f"--- {processes} at once, {len(rows)} children: step, wall median / p90 s, "
          "CPU median s")
    if not rows:
      print("  no child finished its set-up (no GPU here?)")
      continue
    flags = [r.pop("blocks on sync") for r in rows]
    print(f"  contexts that block on sync: {sum(flags)} of {len(flags)}")
    names = list(rows[0])
    for name in names + ["total"]:
      wall = sorted(sum(v[0] for v in r.values()) if name == "total" else r[name][0] for r in rows)
      cpu = [sum(v[1] for v in r.values()) if name == "total" else r[name][1] for r in rows]
      p90 = wall[min(len(wall) - 1, int(0.9 * len(wall)))]
      print(f"  {name:22s} {statistics.median(wall):7.3f} / {p90:7.3f}   "
            f"{statistics.median(cpu):7.3f}")
  base = None
  for concurrency in args.churn:
    row = churn(concurrency, args.churn_s, args.churn_work_s)
    if not row["children"]:
      print(f"churn {concurrency} alive: no child made a context ({row['failed']} failed; "
            "no GPU here?)")
      continue
    base = base or row["per_s"]
    print(f"churn {concurrency} alive: {row['children']} children ({row['failed']} failed) "
          f"= {row['per_s']:.2f}/s ({row['per_s'] / base:.2f}x 1st); medians: life "
          f"{row['life_s']:.3f} s, context {row['context_s']:.3f} s, exit {row['exit_s']:.3f} s")


if __name__ == "__main__":
  main()
