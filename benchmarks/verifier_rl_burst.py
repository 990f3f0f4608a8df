"""RL-shaped verifier load: consecutive steps of N problems x G samples, sent as `dice train` sends them.

Each step is one burst: the step's completions go through the trainer's own path
(`rewards.candidates.submit_completions`: extraction, phase-1 assembly, the gRPC client of
dice_jax/verifier/ with its training defaults) to a `dice-verifier` served on loopback from this
process (a real gRPC server on an empty cache folder), and the step ends with its last verdict. The
next step starts then (no overlap between steps: the conservative figure). Problems are DICE's
phase-1 items (`--data`, passed by path) and synthetic ones (`--synthetic`), drawn in turn from
one shuffled pool, so later steps meet problems again as an RL run does; each group's samples
follow `--mix` (rl_burst_mix.py: correct, wrong, non-compiling, crashing, hanging, duplicated
within the group, reformatted, repeated from an earlier step). `--phase 2` sends whole candidates.

Printed per step and overall, written to `--json` (default benchmarks/results/verifier_rl_burst.json):
verdicts/s (completions per second of the step's wall time), the step's time to its last verdict
(`cold_step_s`: the first step, on an empty cache; `step_p50_s`/`step_p90_s` over the later, warm
steps), compiler CPU-s per compile (this process's reaped children: the compile processes; and
the warm front ends' forked children), GPU-slot seconds per job (the workers' own account,
`dice_verifier_worker_seconds`; and its parts' means, worker/process.py _timings) and the CPU-s of the GPU workers with the job processes they reaped
per job (and per reaped job by process: judge, candidate, and the judge's CPU until its report and
after it, `dice_verifier_job_cpu_seconds`), the server's and client's own CPU, the median of each
stage, requests that reached the server, cache hits, outcomes per sample kind.

  python benchmarks/verifier_rl_burst.py --data PATH/kernel_infilling_evaluation.json   # GPU box
  python benchmarks/verifier_rl_burst.py --no-gpu --problems-per-step 2 --samples 3 --steps 2
  python benchmarks/verifier_rl_burst.py --dry --no-gpu --synthetic-share 1 ...   # plumbing (CI)

Targets (one 16-core H200 box): >= 10 verdicts/s sustained, step p50 <= 15 s, cold step <= 45 s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import random
import resource
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rl_burst_builds as builds_lib  # noqa: E402  (this folder)
import rl_burst_mix as mix_lib  # noqa: E402  (this folder)

from dice.verifier.v1 import verifier_pb2 as pb  # noqa: E402
from dice_jax.data import problems as problems_lib  # noqa: E402
from dice_jax.rewards import candidates  # noqa: E402
from dice_jax.verifier import client as client_lib  # noqa: E402
from dice_jax.verifier import connect as connect_lib  # noqa: E402
from dice_jax.verifier import defaults as verifier_defaults  # noqa: E402
from dice_jax.verifier import options as options_lib  # noqa: E402
from verifier_service.compile import toolchain as toolchain_lib  # noqa: E402
from verifier_service.service import config as config_lib  # noqa: E402
from verifier_service.service import scheduler as scheduler_lib  # noqa: E402
from verifier_service.service import server as server_lib  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "verifier_rl_burst.json"
_RUN_STAGES = (pb.STAGE_LOAD, pb.STAGE_CORRECTNESS, pb.STAGE_TIMING)
# dice_verifier_job_cpu_seconds's parts (worker/pair.Pair.cpu_report)
JOB_CPU_PARTS = ("judge", "candidate", "judge_until_report", "judge_after_report")


class Served:
  """`dice-verifier serve` in this process: the scheduler and gRPC server on their own loop."""

  def __init__(self, config: config_lib.ServerConfig, toolchain: toolchain_lib.Toolchain):
    self.loop = asyncio.new_event_loop()
    threading.Thread(target=self.loop.run_forever, daemon=True).start()
    self.scheduler = scheduler_lib.Scheduler.create(config, toolchain)
    self.builds: list[dict] = []  # every build the server ran (BuildResult fields), in order
    self._record_builds()
    self.port = self.call(self._start())
    # Every GPU job a slot ran, (start, end) by time.monotonic(), in the order they ended.
    self.jobs: list[tuple[float, float]] = []
    self._record_jobs()

  def _record_builds(self) -> None:
    """Keeps each build's result, its processes (BuildResult.steps) included: where a step's
    compile CPU-seconds went, read after the step."""
    compiler = self.scheduler.compiler
    build = compiler.build

    async def recorded(ext, timeout_s, problem=""):
      result = await build(ext, timeout_s, problem=problem)
      entry = dataclasses.asdict(result)
      entry.update(problem=problem[:12], log=result.log[:300], name=ext.name)
      self.builds.append(entry)
      return result
    compiler.build = recorded

  @property
  def slots(self) -> list:
    """The server's GPU slots (pool.WorkerSlot); none without a worker pool."""
    return self.scheduler.pool.slots if self.scheduler.pool is not None else []

  def _record_jobs(self) -> None:
    """Keeps when each slot's job began and ended (a slot's whole job, as WorkerSlot.run has it):
    how busy the GPU slots were over a step, and when its first job began."""
    for slot in self.slots:
      async def recorded(*args, _run=slot.run, **kwargs):
        start = time.monotonic()
        try:
          return await _run(*args, **kwargs)
        finally:
          self.jobs.append((start, time.monotonic()))
      slot.run = recorded

  async def _start(self) -> int:
    await self.scheduler.start()
    self.server, port, _ = await server_lib.start_server(self.scheduler)
    return port

  def call(self, coro, timeout: float = 900.0):
    return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

  def settle(self) -> None:
    """Waits for the start-up work a running server has behind it (header tiers, precompiled
    header, warm front ends), so the first step's time is the step's."""
    async def settle():
      await self.scheduler._warm_up  # pylint: disable=protected-access
      await self.scheduler.compiler.settle()
    self.call(settle())

  def counters(self) -> dict[str, float]:
    """Monotone counters of the server: compiles, job seconds, verdict- and program-cache hits."""
    metrics = self.scheduler.metrics.registry.get_sample_value
    out = {"compiles": metrics("dice_verifier_compile_cache_total", {"result": "miss"}) or 0.0,
           "compile_hits": metrics("dice_verifier_compile_cache_total", {"result": "hit"}) or 0.0,
           "jobs": metrics("dice_verifier_worker_seconds_count", {"part": "slot"}) or 0.0,
           "job_s": metrics("dice_verifier_worker_seconds_sum", {"part": "slot"}) or 0.0,
           "verdict_cache_hits": float(self.scheduler.verdict_cache_hits),
           "program_cache_hits": float(self.scheduler.program_cache_hits),
           "verdicts": float(self.scheduler.verdicts_total)}
    # The job processes' own CPU, by part, as their workers reaped them (a slot's last job's
    # arrives with its next job: a step's figures lag by up to one job per slot).
    for part in JOB_CPU_PARTS:
      out[f"job_cpu_{part}_s"] = metrics("dice_verifier_job_cpu_seconds_sum", {"part": part}) or 0.0
      out[f"job_cpu_{part}_n"] = metrics("dice_verifier_job_cpu_seconds_count",
                                         {"part": part}) or 0.0
    # Where the GPU slots' seconds went, part by part (worker/process.py _timings).
    for family in self.scheduler.metrics.worker_seconds.collect():
      for sample in family.samples:
        if sample.name.endswith(("_sum", "_count")) and sample.labels.get("part") != "slot":
          kind = "s" if sample.name.endswith("_sum") else "n"
          out[f"slot_part_{kind}:{sample.labels['part']}"] = sample.value
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Children of the warm front ends' fork servers are reaped by those servers, not by this
    # process: the compiler counts their CPU (wait4) itself.
    warm = self.scheduler.compiler.front_end_stats().get("warm_cpu_s", 0.0)
    out["children_cpu_s"] = usage.ru_utime + usage.ru_stime + warm
    # The GPU workers and the job processes they forked and reaped (a standby pair still alive
    # counts once it is reaped); this process: the server, the client and the benchmark.
    out["workers_cpu_s"] = sum(_cpu_with_reaped_s(slot.info.get("pid")) for slot in self.slots)
    own = resource.getrusage(resource.RUSAGE_SELF)
    out["server_cpu_s"] = own.ru_utime + own.ru_stime
    return out

  def stop(self) -> None:
    async def stop():
      await self.server.stop(grace=1)
      await self.scheduler.stop()
    self.call(stop(), timeout=120)
    self.loop.call_soon_threadsafe(self.loop.stop)


def load_pool(args: argparse.Namespace) -> list[mix_lib.Problem]:
  """DICE items and synthetic problems with a scaffold, shuffled (seeded), `--synthetic-share`
  of every window of a step's size synthetic where both kinds are available."""
  rng = random.Random(args.seed)

  def phase1(spec: str) -> list[mix_lib.Problem]:
    found = [mix_lib.Problem(p.id, p.reference_source, p.prefix, p.middle, p.suffix)
             for p in problems_lib.load_problems(spec) if p.has_scaffold]
    usable = []
    for p in found:  # the mix edits the first kernel of the middle: it must have one
      try:
        mix_lib.mutate(p.middle, "compile_error", "probe")
        usable.append(p)
      except ValueError:
        pass
    rng.shuffle(usable)
    return usable

  dice = phase1(args.data) if args.synthetic_share < 1 else []
  synthetic = phase1(args.synthetic) if args.synthetic_share > 0 else []
  pool, n = [], args.problems_per_step
  k_syn = round(n * args.synthetic_share) if dice and synthetic else (n if synthetic else 0)
  while dice or synthetic:
    take = [synthetic.pop() for _ in range(min(k_syn, len(synthetic)))]
    take += [dice.pop() for _ in range(min(n - len(take), len(dice)))]
    take += [synthetic.pop() for _ in range(min(n - len(take), len(synthetic)))]
    pool += take
  if len(pool) < n:
    raise SystemExit(f"only {len(pool)} usable problems for steps of {n}")
  return pool


def _median(values: list[float]) -> float:
  return statistics.median(values) if values else float("nan")


def _quantile(values: list[float], q: float) -> float:
  ordered = sorted(values)
  return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _stage(verdict: pb.Verdict, *stages: int) -> float:
  return sum(t.duration_s for t in verdict.stage_timings if t.stage in stages)


def run_step(conn: connect_lib.Connection, served: Served, samples: list[mix_lib.Sample],
             phase: int, options: pb.VerifyOptions) -> dict:
  """Sends one step's completions as `dice train` does and waits for the last verdict."""
  stats0, counters0 = conn.client.stats(), served.counters()
  first_build, first_job = len(served.builds), len(served.jobs)
  cores_busy0 = _busy_jiffies()
  start = time.monotonic()
  future = candidates.submit_completions(
      conn.client, [s.completion for s in samples], phase=[phase] * len(samples),
      reference_source=[s.problem.reference for s in samples],
      prefix=[s.problem.prefix for s in samples], suffix=[s.problem.suffix for s in samples],
      options=options)
  verdicts = future.result()
  wall = time.monotonic() - start
  stats1, counters1 = conn.client.stats(), served.counters()
  delta = {k: counters1[k] - counters0.get(k, 0.0) for k in counters1}
  busy1 = _busy_jiffies()
  sent = [v for v in verdicts if v.request_id]
  outcomes = collections.Counter(pb.Outcome.Name(v.outcome) for v in verdicts)
  by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for sample, verdict in zip(samples, verdicts):
    by_kind[sample.kind][pb.Outcome.Name(verdict.outcome)] += 1
  fresh = [v for v in sent if v.total_s > 0]
  return {
      "wall_s": wall, "completions": len(samples), "verdicts_per_s": len(samples) / wall,
      "requests_sent": stats1.get("sent", 0) - stats0.get("sent", 0),
      "client_cache_hits": (stats1.get("cache_hits", 0) - stats0.get("cache_hits", 0)
                            + stats1.get("deduplicated", 0) - stats0.get("deduplicated", 0)),
      "server_verdicts": delta["verdicts"], "server_verdict_cache_hits": delta["verdict_cache_hits"],
      "server_program_cache_hits": delta["program_cache_hits"],
      "compiles": delta["compiles"], "compile_cache_hits": delta["compile_hits"],
      "compile_cpu_s": delta["children_cpu_s"],
      "cpu_s_per_compile": delta["children_cpu_s"] / delta["compiles"] if delta["compiles"] else 0,
      "jobs": delta["jobs"], "gpu_s_per_job": delta["job_s"] / delta["jobs"] if delta["jobs"] else 0,
      "workers_cpu_s": delta["workers_cpu_s"],
      "cpu_s_per_job": delta["workers_cpu_s"] / delta["jobs"] if delta["jobs"] else 0,
      "server_cpu_s": delta["server_cpu_s"],
      "job_cpu_s_per_job": {part: delta[f"job_cpu_{part}_s"] / delta[f"job_cpu_{part}_n"]
                            for part in JOB_CPU_PARTS if delta[f"job_cpu_{part}_n"]},
      "slot_parts_s_per_job": _slot_parts(delta),
      "machine_cpu_busy": (busy1[0] - cores_busy0[0]) / max(1, busy1[1] - cores_busy0[1]),
      "stage_median_s": {
          "compile": _median([_stage(v, pb.STAGE_COMPILE) for v in fresh]),
          "gpu_queue": _median([_stage(v, pb.STAGE_QUEUE) for v in fresh]),
          "run": _median([_stage(v, *_RUN_STAGES) for v in fresh if _stage(v, *_RUN_STAGES)])},
      "verdict_total_p50_s": _median([v.total_s for v in fresh]),
      "verdict_total_p90_s": _quantile([v.total_s for v in fresh], 0.9),
      "outcomes": dict(outcomes), "outcomes_by_kind": {k: dict(c) for k, c in by_kind.items()},
      "gpu_slots": occupancy([(a - start, b - start) for a, b in served.jobs[first_job:]], wall,
                             len(served.slots)),
      "builds": builds_lib.summarise(served.builds[first_build:])}


def occupancy(jobs: list[tuple[float, float]], wall: float, slots: int) -> dict[str, float | None]:
  """How a step's GPU slots were used: `jobs` are (start, end) seconds from the step's start.
  first_job_s: when the first began; busy: the slots' job seconds over slots x wall; idle_s: the
  step's seconds with no job running; all_busy_s: those with every slot running one."""
  if not jobs or not slots or wall <= 0:
    return {"first_job_s": None, "busy": 0.0, "idle_s": wall, "all_busy_s": 0.0}
  events = sorted([(a, 1) for a, _ in jobs] + [(b, -1) for _, b in jobs])
  running, last, idle, full = 0, 0.0, 0.0, 0.0
  for at, change in events + [(max(wall, events[-1][0]), 0)]:
    if running == 0:
      idle += at - last
    elif running >= slots:
      full += at - last
    running, last = running + change, at
  return {"first_job_s": min(a for a, _ in jobs),
          "busy": sum(b - a for a, b in jobs) / (slots * wall), "idle_s": idle, "all_busy_s": full}


def _slot_parts(delta: dict[str, float]) -> dict[str, float]:
  """Mean seconds per job of each part of a GPU slot's time that this step's jobs had, largest
  first."""
  names = [key.split(":", 1)[1] for key in delta if key.startswith("slot_part_s:")]
  parts = {name: delta["slot_part_s:" + name] / delta["slot_part_n:" + name]
           for name in names if delta.get("slot_part_n:" + name)}
  return dict(sorted(parts.items(), key=lambda kv: -kv[1]))


def _cpu_with_reaped_s(pid: int | None) -> float:
  """User+system CPU seconds of `pid` and of the children it has reaped; 0 when it is gone."""
  try:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return 0.0


def _busy_jiffies() -> tuple[int, int]:
  try:
    fields = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
  except (OSError, ValueError):
    return 0, 0
  return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0), sum(fields)


def _print_step(index: int, step: dict) -> None:
  stages = ", ".join(f"{k} {v:.2f}" for k, v in step["stage_median_s"].items())
  print(f"step {index}: {step['completions']} completions in {step['wall_s']:.1f} s = "
        f"{step['verdicts_per_s']:.2f} verdicts/s; {step['requests_sent']} reached the server "
        f"({step['client_cache_hits']} answered by the client's cache, "
        f"{step['server_verdict_cache_hits']:.0f} by the server's verdict cache, "
        f"{step['server_program_cache_hits']:.0f} by its program cache); "
        f"{step['compiles']:.0f} compiles "
        f"at {step['cpu_s_per_compile']:.1f} CPU-s each; {step['jobs']:.0f} GPU jobs at "
        f"{step['gpu_s_per_job']:.2f} s each; stage medians (s): {stages}; machine CPU "
        f"{100 * step['machine_cpu_busy']:.0f}%", flush=True)
  print(f"  CPU-s: compilers {step['compile_cpu_s']:.0f}, GPU workers and their jobs "
        f"{step['workers_cpu_s']:.0f} ({step['cpu_s_per_job']:.2f} per job; per reaped job "
        + ", ".join(f"{k} {v:.2f}" for k, v in step["job_cpu_s_per_job"].items())
        + f"), server and client {step['server_cpu_s']:.0f}", flush=True)
  slots = step["gpu_slots"]
  if slots["first_job_s"] is not None:
    print(f"  GPU slots: first job began at {slots['first_job_s']:.1f} s; busy "
          f"{100 * slots['busy']:.0f}% of slots x wall; no job running {slots['idle_s']:.1f} s, "
          f"every slot running one {slots['all_busy_s']:.1f} s", flush=True)
  print("  GPU slot per job, by part (mean s): " + ", ".join(
      f"{k} {v:.3f}" for k, v in step["slot_parts_s_per_job"].items()), flush=True)
  print(f"  outcomes {step['outcomes']}; by kind: " + "; ".join(
      f"{k} {v}" for k, v in sorted(step["outcomes_by_kind"].items())), flush=True)
  print(builds_lib.line(step["builds"]), flush=True)


def summarise(steps: list[dict], startup_s: float, args: argparse.Namespace, hardware: str,
              quiet: bool = False) -> dict:
  warm = steps[1:]
  warm_wall = sum(s["wall_s"] for s in warm)
  total = lambda key: sum(s[key] for s in steps)
  report = {
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
      "hardware": hardware, "mode": "dry" if args.dry else ("compile-only" if args.no_gpu else "gpu"),
      "phase": args.phase, "problems_per_step": args.problems_per_step, "samples": args.samples,
      "steps_run": len(steps), "startup_s": startup_s,
      "verdicts_per_s": sum(s["completions"] for s in warm) / warm_wall if warm else float("nan"),
      "step_p50_s": _median([s["wall_s"] for s in warm]),
      "step_p90_s": _quantile([s["wall_s"] for s in warm], 0.9),
      "cold_step_s": steps[0]["wall_s"],
      "cpu_s_per_compile": total("compile_cpu_s") / max(1, total("compiles")),
      "gpu_s_per_job": (sum(s["gpu_s_per_job"] * s["jobs"] for s in steps) / total("jobs")
                        if total("jobs") else 0.0),
      "cpu_s_per_job": total("workers_cpu_s") / total("jobs") if total("jobs") else 0.0,
      "outcomes": dict(sum((collections.Counter(s["outcomes"]) for s in steps),
                           collections.Counter())),
      "settings": {k: v for k, v in vars(args).items() if k != "json"}, "steps": steps}
  if quiet:
    return report
  met = lambda ok: "met" if ok else "NOT met"
  print(f"\n== {len(steps)} steps of {args.problems_per_step} x {args.samples} (phase "
        f"{args.phase}, {report['mode']}) on {hardware} ==")
  print(f"server start-up {startup_s:.1f} s; cold first step {report['cold_step_s']:.1f} s; warm "
        f"steps: p50 {report['step_p50_s']:.1f} s, p90 {report['step_p90_s']:.1f} s, "
        f"{report['verdicts_per_s']:.2f} verdicts/s")
  print(f"compiler CPU {report['cpu_s_per_compile']:.1f} s per compile; GPU slot "
        f"{report['gpu_s_per_job']:.2f} s per job, its processes' CPU {report['cpu_s_per_job']:.2f} "
        f"s; outcomes {report['outcomes']}")
  print(f"targets (one 16-core H200 box): >= 10 verdicts/s {met(report['verdicts_per_s'] >= 10)}; "
        f"step p50 <= 15 s {met(report['step_p50_s'] <= 15)}; cold step <= 45 s "
        f"{met(report['cold_step_s'] <= 45)}", flush=True)
  return report


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=__doc__.split("\n\n", 1)[1])
  parser.add_argument("--data", default="../shared/data/dice/kernel_infilling_evaluation.json",
                      help="DICE phase-1 items (JSON; default %(default)s)")
  parser.add_argument("--synthetic", default="synthetic:all?split=train",
                      help="synthetic problems (a dice_jax.data spec; default %(default)s)")
  parser.add_argument("--synthetic-share", type=float, default=0.25,
                      help="share of a step's problems that are synthetic (1: no --data needed)")
  parser.add_argument("--problems-per-step", type=int, default=16)
  parser.add_argument("--samples", type=int, default=8, help="samples per problem (G)")
  parser.add_argument("--steps", type=int, default=4, help="steps, the first one cold")
  parser.add_argument("--budget-s", type=float, default=0.0,
                      help="start no step after this many seconds of steps (0: no limit)")
  parser.add_argument("--phase", type=int, choices=(1, 2), default=1)
  parser.add_argument("--mix", default=",".join(f"{k}={v}" for k, v in mix_lib.DEFAULT_MIX.items()),
                      help="sample kinds and weights (default %(default)s)")
  parser.add_argument("--seed", type=int, default=0)
  cpus = os.cpu_count() or 2
  parser.add_argument("--compile-workers", type=int, default=cpus)
  parser.add_argument("--slots-per-gpu", type=int, default=4)
  parser.add_argument("--no-gpu", action="store_true", help="compile only: verdicts are NO_GPU")
  parser.add_argument("--dry", action="store_true",
                      help="kernel launches cut: every candidate ends at the static checks")
  parser.add_argument("--server-set", action="append", default=[], metavar="FIELD=VALUE",
                      help="a ServerConfig field for the served verifier (repeatable)")
  parser.add_argument("--max-in-flight", type=int, default=0,
                      help="the client's requests outstanding per stream (0: `dice train`'s, "
                           f"{verifier_defaults.TRAINING.max_in_flight_per_stream})")
  parser.add_argument("--item-order", action="store_true",
                      help="the client sends a step's requests in item order, problem by problem "
                           "(as before client.interleaved), for comparison")
  parser.add_argument("--json", default=str(RESULTS), help="where to write the figures")
  args = parser.parse_args(argv)
  if args.item_order:
    client_lib.interleaved = lambda items: list(range(len(items)))

  toolchain = toolchain_lib.discover()
  pool = load_pool(args)
  mix = mix_lib.parse_mix(args.mix)
  overrides = {}
  for item in args.server_set:
    key, _, value = item.partition("=")
    overrides[key] = type(getattr(config_lib.ServerConfig(), key))(
        json.loads(value) if value in ("true", "false") else value)
  config = config_lib.ServerConfig(
      listen="127.0.0.1:0", cache_dir=pathlib.Path(tempfile.mkdtemp(prefix="rl-burst-cache-")),
      compile_workers=args.compile_workers, slots_per_gpu=args.slots_per_gpu, queue_capacity=4096,
      gpus=[] if args.no_gpu else None, **overrides)
  started = time.monotonic()
  served = Served(config, toolchain)
  if not args.dry:
    served.settle()
  startup = time.monotonic() - started
  gpus = ", ".join(f"{g.name}" for g in toolchain.gpus) if not args.no_gpu else ""
  hardware = f"{gpus or 'no GPU'}; {cpus} CPU cores ({platform.machine()})"
  print(f"served verifier ready after {startup:.1f} s ({hardware}); {len(pool)} problems in the "
        f"pool", flush=True)
  window = {"max_in_flight_per_stream": args.max_in_flight} if args.max_in_flight else {}
  conn = connect_lib.connect(f"127.0.0.1:{served.port}", use=verifier_defaults.TRAINING, **window)
  rng, history, steps = random.Random(args.seed), {}, []
  began = time.monotonic()
  try:
    for index in range(args.steps):
      if args.budget_s and index and time.monotonic() - began > args.budget_s:
        print(f"budget of {args.budget_s:.0f} s spent: stopping after {index} steps", flush=True)
        break
      chosen = [pool[(index * args.problems_per_step + i) % len(pool)]
                for i in range(args.problems_per_step)]
      samples = mix_lib.plan_step(chosen, args.samples, args.phase, mix, rng, index, history,
                                  dry=args.dry)
      steps.append(run_step(conn, served, samples, args.phase, options_lib.verify_options()))
      _print_step(index, steps[-1])
      _write(args.json, summarise(steps, startup, args, hardware, quiet=True))  # if cut short
  finally:
    conn.close()
    split = served.scheduler.compiler.split_stats()  # empty unless --server-set compile_split=true
    served.stop()
    if args.json:  # every build with its processes, for reading where the CPU went
      with open(args.json + ".builds.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(b, default=str) + "\n" for b in served.builds)
  report = summarise(steps, startup, args, hardware)
  if split:
    print(f"split path (compile/device_split.py), cuda.cu builds: {split}")
  _write(args.json, dict(report, split=split))
  if args.json:
    print(f"wrote {args.json}")


def _write(where: str, report: dict) -> None:
  if where:
    path = pathlib.Path(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
  main()
