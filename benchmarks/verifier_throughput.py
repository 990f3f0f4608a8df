"""Cold-cache verification throughput and latency on one box: the verifier service vs. the naive path.

Both paths verify distinct DICE infilling candidates (`cuda_code` against its `pytorch_code`) that
pass the static checks, each path with a cold cache:

(a) the service: a real gRPC server on loopback started in this process with an empty cache
    folder, `--compile-workers` compiler processes and `--slots-per-gpu` GPU worker slots. Its
    one-off start-up (worker processes, header tiers, main.cpp's precompiled header, the probe
    that warms nvcc's front ends) is timed. Then `--latency-candidates` candidates are verified
    one at a time (cold latency; each compile's processes are printed), then a burst
    of `--candidates` further candidates is submitted at once and the server's queue schedules
    them (throughput, and latency under that load: each verdict's time since the burst began).
(b) naive = what KernelBench does: a fresh Python process per candidate, `--naive-parallel` at a
    time, in which the candidate's own torch.utils.cpp_extension.load_inline builds its extension
    (ninja, both translation units in parallel, an empty extension folder) and the service's own
    static checks, correctness trials and timing run (`worker.run_job` with no prebuilt modules
    and no sandbox). It costs ~60 s of two cores per candidate, so it runs on the first
    `--naive-candidates` of the burst's candidates (default 16; 0: all).

Printed: start-up; median cold latency; verdicts per hour over the burst (and counting start-up);
latency under load (median, p90, max); the median compile, GPU-queue and run stages; compiler
CPU-seconds per verdict (children's user+sys; budget for 3,000/h = cores x 3600 / 3000) and the
machine's CPU use during the burst; the naive path's figures; the ratios; and every candidate
whose verdicts disagree (both paths finished).

  python benchmarks/verifier_throughput.py --data PATH/kernel_infilling_evaluation.json  # GPU
  python benchmarks/verifier_throughput.py --candidates 4 --latency-candidates 1 \\
      --naive-candidates 2 --naive-parallel 1 --no-gpu    # compile only, e.g. on a CPU VM
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc

from verifier_service.compile import checks
from verifier_service.compile import toolchain as toolchain_lib
from verifier_service.run import job as job_lib
from verifier_service.service import config as config_lib
from verifier_service.service import scheduler as scheduler_lib
from verifier_service.service import server as server_lib

# One candidate, KernelBench's way: in this fresh process torch's own load_inline builds the
# extension when the candidate is imported (empty extension folder), then the service's checks,
# correctness trials and timing run (worker.run_job: the judge and the candidate's process, no
# sandbox; its tripwire arms once load_inline has compiled). device "none": compile only.
_NAIVE = textwrap.dedent("""
    import json, sys
    import torch  # noqa: F401
    from verifier_service.compile import checks
    from verifier_service.run import envelope
    from verifier_service.run.job import JobOptions
    from verifier_service.worker import process as worker
    ref, cand, out, device, options = sys.argv[1:6]
    ref, cand = open(ref).read(), open(cand).read()
    report = checks.check_sources(ref, cand, allow_cpu_only=device == "cpu")  # cpu: tests only
    if report.outcome:
      result = {"outcome": report.outcome, "message": report.message}
    elif device == "none":
      try:
        exec(compile(cand, "candidate.py", "exec"), {"__name__": "candidate"})
        result = {"outcome": "NO_GPU", "message": "compiled"}
      except Exception as e:
        building = "Error building extension" in str(e)
        result = {"outcome": "COMPILE_ERROR" if building else "RUNTIME_ERROR",
                  "message": str(e)[-300:]}
    else:
      job = envelope.Job(job_id="naive", reference_source=ref, candidate_source=cand,
                         options=JobOptions.from_json(json.loads(options)), modules=None,
                         kernel_names=tuple(report.kernel_names))
      done = worker.run_job(job, device)
      result = done.get("result") or {"outcome": "INFRA_ERROR",
                                      "message": f"no verdict: {done.get('status')}"}
      if "Error building extension" in result.get("message", ""):
        result["outcome"] = "COMPILE_ERROR"
    json.dump({"outcome": result["outcome"], "message": result.get("message", "")},
              open(out, "w"))
""")


def _median(values: list[float]) -> float:
  return statistics.median(values) if values else float("nan")


def _quantile(values: list[float], q: float) -> float:
  if not values:
    return float("nan")
  ordered = sorted(values)
  return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_children() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _busy_jiffies() -> tuple[int, int]:
  """(busy, total) CPU jiffies of the whole machine, from /proc/stat."""
  try:
    fields = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
  except (OSError, ValueError):
    return 0, 0
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
  return sum(fields) - idle, sum(fields)


def load_items(path: str, count: int, skip: int = 0) -> list[dict]:
  """Distinct infilling items whose candidates pass the static checks (both paths compile)."""
  items = json.loads(pathlib.Path(path).read_text())
  usable = [i for i in items if checks.check_sources(i["pytorch_code"], i["cuda_code"]).outcome
            is None]
  chosen = usable[skip:skip + count]
  if len(chosen) < count:
    raise SystemExit(f"only {len(chosen)} usable candidates after skipping {skip} "
                     f"({len(usable)} of {len(items)} in {path} pass the static checks)")
  return chosen


def _naive_one(item: dict, root: pathlib.Path, device: str, options: job_lib.JobOptions,
               toolchain: toolchain_lib.Toolchain) -> tuple[str, str, float, float]:
  """(outcome, message, latency, CPU seconds) of one candidate on the naive path."""
  work = root / str(item["id"])
  work.mkdir()
  (work / "ref.py").write_text(item["pytorch_code"])
  (work / "cand.py").write_text(item["cuda_code"])
  env = toolchain.build_env()
  env["TORCH_EXTENSIONS_DIR"] = str(work / "ext")
  start, cpu0 = time.monotonic(), _cpu_children()
  proc = subprocess.run([sys.executable, "-c", _NAIVE, str(work / "ref.py"), str(work / "cand.py"),
                         str(work / "out.json"), device, json.dumps(options.to_json())], env=env,
                        capture_output=True, text=True, check=False, cwd=work)
  latency, cpu = time.monotonic() - start, _cpu_children() - cpu0
  try:
    result = json.loads((work / "out.json").read_text())
    return result["outcome"], result["message"], latency, cpu
  except (OSError, ValueError, KeyError):
    return f"CRASHED(rc={proc.returncode})", proc.stderr[-300:], latency, cpu


def run_naive(items: list[dict], parallel: int, device: str, options: job_lib.JobOptions,
              toolchain: toolchain_lib.Toolchain) -> dict:
  root = pathlib.Path(tempfile.mkdtemp(prefix="naive-"))
  start = time.monotonic()
  def one(item: dict) -> tuple[str, str, float, float]:
    result = _naive_one(item, root, device, options, toolchain)
    print(f"  naive {item['id']}: {result[2]:.1f} s {result[0]}", flush=True)
    return result

  with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
    results = list(pool.map(one, items))
  wall = time.monotonic() - start
  return {"outcomes": {i["id"]: r[0] for i, r in zip(items, results)},
          "messages": {i["id"]: r[1] for i, r in zip(items, results)},
          "latencies": [r[2] for r in results], "cpu_s": sum(r[3] for r in results),
          "wall": wall}


def _stage(verdict: pb.Verdict, *stages: int) -> float:
  return sum(t.duration_s for t in verdict.stage_timings if t.stage in stages)


async def run_service(items: list[dict], latency_items: list[dict], args: argparse.Namespace,
                      toolchain: toolchain_lib.Toolchain, options: pb.VerifyOptions) -> dict:
  cache = pathlib.Path(tempfile.mkdtemp(prefix="service-cache-"))
  config = config_lib.ServerConfig(
      listen="127.0.0.1:0", cache_dir=cache, compile_workers=args.compile_workers,
      slots_per_gpu=args.slots_per_gpu, queue_capacity=4096,
      gpus=[] if args.no_gpu else ([int(g) for g in args.gpus.split(",")] if args.gpus else None),
      run_timeout_s=600.0, compile_timeout_s=900.0, batch_members=args.batch_members,
      warm_front_ends=not args.no_warm_front_ends, compile_split=args.compile_split)
  started = time.monotonic()
  scheduler = scheduler_lib.Scheduler.create(config, toolchain)
  await scheduler.start()
  server, port, _ = await server_lib.start_server(scheduler)
  await scheduler._warm_up  # pylint: disable=protected-access  # header tiers, precompiled header
  serving = time.monotonic() - started
  # The start-up probe (warm front ends, host code's header) and, with --compile-split, the split
  # path's names and host header.
  await scheduler.compiler.settle()
  if args.compile_split:  # settled: answers at once
    print(f"  split path ready: {await scheduler.compiler.split_ready()}", flush=True)
  startup = time.monotonic() - started
  print(f"  serving after {serving:.1f} s; front ends warm and host code's header built after "
        f"{startup:.1f} s", flush=True)
  builds: list = []  # every build's result, in order: a cold candidate's compile steps
  began: list = []  # when each of them was asked for (time.monotonic())
  build = scheduler.compiler.build

  async def recorded(ext, timeout_s, problem=""):
    asked = time.monotonic()
    result = await build(ext, timeout_s, problem)
    builds.append(result)
    began.append(asked)
    return result
  scheduler.compiler.build = recorded
  print(f"service start-up (workers, header tiers, precompiled header): {startup:.1f} s",
        flush=True)
  channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
      ("grpc.max_receive_message_length", 64 << 20)])
  stub = verifier_pb2_grpc.VerifierStub(channel)

  async def one(item: dict, tag: str, t0: float) -> tuple[pb.Verdict, float]:
    verdict = await stub.Verify(pb.VerifyRequest(
        request_id=f"{tag}-{item['id']}", reference_source=item["pytorch_code"],
        candidate_source=item["cuda_code"], options=options), timeout=3600)
    return verdict, time.monotonic() - t0

  try:
    latencies = []
    for item in latency_items:
      before = len(builds)
      verdict, seconds = await one(item, "latency", time.monotonic())
      latencies.append(seconds)
      stages = ", ".join(f"{pb.Stage.Name(t.stage).removeprefix('STAGE_').lower()} "
                         f"{t.duration_s:.2f}" for t in verdict.stage_timings)
      print(f"  cold, one at a time: {item['id']}: {seconds:.1f} s "
            f"{pb.Outcome.Name(verdict.outcome)} (stages, s: {stages})", flush=True)
      for result in builds[before:]:  # the compile's processes: start +wall
        print("    compile steps: " + ", ".join(
            f"{s['step']} {s['start_s']:.1f}+{s['wall_s']:.1f}"
            for s in sorted(result.steps, key=lambda s: s["start_s"])), flush=True)
    parts0 = _worker_parts(scheduler)
    cpu0, (busy0, total0) = _cpu_children(), _busy_jiffies()
    first_build = len(builds)
    start = time.monotonic()
    results = await asyncio.gather(*(one(item, "throughput", start) for item in items))
    wall = time.monotonic() - start
    compile_cpu = _cpu_children() - cpu0
    busy1, total1 = _busy_jiffies()
    parts1 = _worker_parts(scheduler)
    burst_parts = {part: (total - parts0.get(part, (0.0, 0))[0], jobs - parts0.get(part, (0, 0))[1])
                   for part, (total, jobs) in parts1.items()}
    batching = scheduler.compiler.batch_stats()
    print(f"  cuda.cu batching during the burst and before: {batching}", flush=True)
    print(f"  warm front ends (compile/front_ends.py): {scheduler.compiler.front_end_stats()}",
          flush=True)
    if args.compile_split:
      print(f"  split path (compile/device_split.py): {scheduler.compiler.split_stats()}",
            flush=True)
  finally:
    await channel.close()
    await server.stop(grace=1)
    await scheduler.stop()
  verdicts = [v for v, _ in results]
  run_stages = (pb.STAGE_LOAD, pb.STAGE_CORRECTNESS, pb.STAGE_TIMING)
  return {"outcomes": {i["id"]: pb.Outcome.Name(v.outcome) for i, v in zip(items, verdicts)},
          "messages": {i["id"]: v.message for i, v in zip(items, verdicts)},
          "latencies": latencies, "loaded_latencies": [s for _, s in results], "wall": wall,
          "startup": startup, "compile_s": [_stage(v, pb.STAGE_COMPILE) for v in verdicts],
          "queue_s": [_stage(v, pb.STAGE_QUEUE) for v in verdicts],
          "run_s": [_stage(v, *run_stages) for v in verdicts], "compile_cpu_s": compile_cpu,
          # time in a GPU slot, process start-up included: what the stages leave of the latency
          "slot_s": [seconds - _stage(v, pb.STAGE_STATIC_CHECK, pb.STAGE_COMPILE, pb.STAGE_QUEUE)
                     for v, seconds in results],
          "batching": batching,
          # the burst's compiles, as they ran: asked (s after the burst began), and each process
          "burst_builds": [{"asked_s": round(t - start, 3), "duration_s": round(b.duration_s, 3),
                            "batch_size": b.batch_size, "tier": b.header_tier,
                            "batch_note": b.batch_note[:80], "steps": b.steps}
                           for t, b in zip(began[first_build:], builds[first_build:])],
          "worker_parts_s": {part: round(seconds / max(1, jobs), 3)
                             for part, (seconds, jobs) in burst_parts.items()},
          # seconds the judges held the GPU's timing lock during the burst (their parts under it)
          "lock_held_s": sum(burst_parts.get(part, (0.0, 0))[0] for part in _UNDER_LOCK),
          "timing_s": [_stage(v, pb.STAGE_TIMING) for v in verdicts],
          "lock_wait_s": [_lock_wait(v) for v in verdicts],
          "machine_busy": (busy1 - busy0) / max(1, total1 - total0)}


_UNDER_LOCK = ("timing_setup", "timing_warmup", "timing_calls", "timing_keep",
               "timing_verify_batch")


def _worker_parts(scheduler: scheduler_lib.Scheduler) -> dict[str, tuple[float, int]]:
  """(seconds, jobs) so far per part of a GPU slot's job (the dice_verifier_worker_seconds
  histogram: worker/process.py `_timings`)."""
  parts = {}
  for metric in scheduler.metrics.worker_seconds.collect():
    sums = {s.labels["part"]: s.value for s in metric.samples if s.name.endswith("_sum")}
    counts = {s.labels["part"]: int(s.value) for s in metric.samples if s.name.endswith("_count")}
    parts.update({part: (sums[part], counts.get(part, 0)) for part in sums})
  return parts


def _lock_wait(verdict: pb.Verdict) -> float:
  """Seconds the judge waited for the GPU's timing lock ("held (waited 1.23 s); on cpu 15")."""
  text = verdict.environment.timing_lock
  if "waited " not in text:
    return 0.0
  try:
    return float(text.split("waited ", 1)[1].split(" ", 1)[0])
  except ValueError:
    return 0.0


def _rate(n: int, seconds: float) -> float:
  return n / seconds * 3600 if seconds > 0 else float("nan")


def _service_report(items: list[dict], service: dict) -> dict:
  cores = os.cpu_count() or 1
  per_verdict_cpu = service["compile_cpu_s"] / len(items)
  s = {"median_cold_latency_s": _median(service["latencies"]),
       "cold_latencies_s": service["latencies"],
       "median_latency_under_load_s": _median(service["loaded_latencies"]),
       "p90_latency_under_load_s": _quantile(service["loaded_latencies"], 0.9),
       "max_latency_under_load_s": max(service["loaded_latencies"]),
       "median_compile_stage_s": _median(service["compile_s"]),
       "median_gpu_queue_s": _median(service["queue_s"]),
       "median_run_stage_s": _median(service["run_s"]),
       "median_slot_s": _median(service["slot_s"]),
       "first_verdict_s": min(service["loaded_latencies"]),
       "worker_parts_mean_s": service["worker_parts_s"],
       # the GPU's timing lock: held by one job's timing at a time
       "timing_lock_busy": service["lock_held_s"] / service["wall"] if service["wall"] else 0.0,
       "median_timing_stage_s": _median(service["timing_s"]),
       "median_lock_wait_s": _median(service["lock_wait_s"]),
       "per_verdict": [{"id": i["id"], "latency_s": round(t, 2), "compile_s": round(c, 2),
                        "queue_s": round(q, 2), "run_s": round(r, 2), "slot_s": round(o, 2)}
                       for i, t, c, q, r, o in zip(
                           items, service["loaded_latencies"], service["compile_s"],
                           service["queue_s"], service["run_s"], service["slot_s"])],
       "burst_builds": service["burst_builds"],
       "verdicts_per_hour": _rate(len(items), service["wall"]),
       "verdicts_per_hour_with_startup": _rate(len(items), service["wall"] + service["startup"]),
       "compile_cpu_s_per_verdict": per_verdict_cpu,
       "compile_bound_verdicts_per_hour": _rate(1, per_verdict_cpu / cores),
       "machine_cpu_busy": service["machine_busy"], "cores": cores,
       "startup_s": service["startup"], "wall_s": service["wall"],
       "outcomes": service["outcomes"], "messages": service["messages"],
       "batching": service["batching"]}
  counts = {}
  for outcome in s["outcomes"].values():
    counts[outcome] = counts.get(outcome, 0) + 1
  print("\n== service ==")
  print(f"start-up {s['startup_s']:.1f} s; cold latency one at a time: median "
        f"{s['median_cold_latency_s']:.1f} s over {len(service['latencies'])} candidates")
  print(f"{len(items)} candidates at once: {s['verdicts_per_hour']:.0f} verdicts/hour "
        f"({s['wall_s']:.1f} s); counting start-up {s['verdicts_per_hour_with_startup']:.0f}/hour")
  print(f"latency under that load: median {s['median_latency_under_load_s']:.1f} s, "
        f"p90 {s['p90_latency_under_load_s']:.1f} s, max {s['max_latency_under_load_s']:.1f} s; "
        f"stages (median): compile {s['median_compile_stage_s']:.1f} s, GPU queue "
        f"{s['median_gpu_queue_s']:.1f} s, run {s['median_run_stage_s']:.1f} s (in a GPU slot, "
        f"process start-up included: {s['median_slot_s']:.1f} s); first verdict after "
        f"{s['first_verdict_s']:.1f} s")
  print("a GPU slot's job, mean seconds per part over the burst: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(s["worker_parts_mean_s"].items())))
  print(f"timing stage: median {s['median_timing_stage_s']:.2f} s, the GPU's timing lock held "
        f"{100 * s['timing_lock_busy']:.0f}% of the burst (the judges' parts under it); median "
        f"wait for it "
        f"{s['median_lock_wait_s']:.2f} s")
  print(f"compiler CPU {per_verdict_cpu:.1f} s/verdict (compile-bound at "
        f"{s['compile_bound_verdicts_per_hour']:.0f}/hour on {cores} cores); machine CPU "
        f"{100 * s['machine_cpu_busy']:.0f}% busy during the burst")
  print(f"outcomes: {counts}")
  print(f"cuda.cu batching (compile/batch.py): {s['batching']}")
  met = lambda ok: "met" if ok else "NOT met"
  print(f"targets: >= 3,000 verdicts/hour: {met(s['verdicts_per_hour'] >= 3000)} "
        f"({met(s['verdicts_per_hour_with_startup'] >= 3000)} counting start-up); median cold "
        f"verdict <= 10 s: {met(s['median_cold_latency_s'] <= 10)}", flush=True)
  return s


def _naive_report(args: argparse.Namespace, naive_items: list[dict], s: dict,
                  naive: dict) -> dict:
  """The naive path's figures, the ratios, and verdicts compared where both paths finished."""
  unfinished = lambda outcome: outcome == "INFRA_ERROR" or outcome.startswith("CRASHED")
  n = {"median_cold_latency_s": _median(naive["latencies"]),
       "verdicts_per_hour": _rate(len(naive_items), naive["wall"]), "wall_s": naive["wall"],
       "cpu_s_per_verdict": naive["cpu_s"] / len(naive_items), "outcomes": naive["outcomes"]}
  both = [k for k, v in naive["outcomes"].items()
          if not unfinished(v) and not unfinished(s["outcomes"][k])]
  n["disagreements"] = {k: (naive["outcomes"][k], s["outcomes"][k]) for k in both
                        if naive["outcomes"][k] != s["outcomes"][k]}
  n["unfinished"] = {k: (v, s["outcomes"][k]) for k, v in naive["outcomes"].items()
                     if k not in both}
  n["throughput_ratio"] = s["verdicts_per_hour"] / n["verdicts_per_hour"]
  n["latency_ratio"] = n["median_cold_latency_s"] / s["median_cold_latency_s"]
  print("\n== naive path ==")
  print(f"{len(naive_items)} candidates, {args.naive_parallel} processes at a time: "
        f"{n['verdicts_per_hour']:.0f} verdicts/hour ({n['wall_s']:.1f} s); median latency "
        f"{n['median_cold_latency_s']:.1f} s per candidate; {n['cpu_s_per_verdict']:.1f} CPU "
        "s/verdict (build and run)")
  print(f"service / naive: throughput {n['throughput_ratio']:.1f}x, cold latency "
        f"{n['latency_ratio']:.1f}x")
  print(f"verdicts agree on {len(both) - len(n['disagreements'])}/{len(both)} candidates both "
        f"paths finished ({len(n['unfinished'])} did not finish on one path)")
  for key, (theirs, ours) in {**n["disagreements"], **n["unfinished"]}.items():
    print(f"  {key}: naive {theirs} ({naive['messages'][key][:120]}) vs service {ours} "
          f"({s['messages'][key][:120]})", flush=True)
  return n


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data", default="../shared/data/dice/kernel_infilling_evaluation.json",
                      help="DICE infilling JSON (default %(default)s)")
  parser.add_argument("--candidates", type=int, default=64,
                      help="distinct candidates submitted at once (default %(default)s)")
  parser.add_argument("--latency-candidates", type=int, default=8,
                      help="further distinct candidates verified one at a time first, for the "
                           "cold latency (default %(default)s)")
  parser.add_argument("--naive-candidates", type=int, default=16,
                      help="run the naive path on the first N of the burst's candidates (0: all; "
                           "default %(default)s)")
  cpus = os.cpu_count() or 2
  parser.add_argument("--naive-parallel", type=int, default=max(1, cpus // 2),
                      help="naive candidates at a time (each compiles 2 translation units in "
                           "parallel; default CPUs/2 = %(default)s)")
  parser.add_argument("--compile-workers", type=int, default=cpus,
                      help="service compiler processes (default CPUs = %(default)s)")
  parser.add_argument("--slots-per-gpu", type=int, default=4,
                      help="service GPU worker slots per GPU (default %(default)s)")
  parser.add_argument("--timing-trials", type=int, default=100,
                      help="timed calls per side, both paths (default %(default)s)")
  parser.add_argument("--no-gpu", action="store_true",
                      help="compile-only comparison (no GPU here): verdicts are NO_GPU")
  parser.add_argument("--skip-naive", action="store_true", help="only the service")
  parser.add_argument("--batch-members", type=int,
                      default=config_lib.ServerConfig().batch_members,
                      help="cuda.cu sources one translation unit holds at most (compile/batch.py; "
                           "1: each alone; default %(default)s)")
  parser.add_argument("--no-warm-front-ends", action="store_true",
                      help="do not start nvcc's front ends ahead of time (compile/front_ends.py)")
  parser.add_argument("--compile-split", action="store_true",
                      help="cuda.cu in two halves where the cut accepts it (compile/device_split.py)")
  parser.add_argument("--gpus", default="", help="GPU indices the service uses, e.g. 0 (default: all)")
  parser.add_argument("--json", default="", help="write every number to this file")
  args = parser.parse_args()

  began = time.monotonic()
  toolchain = toolchain_lib.discover()
  latency_items = load_items(args.data, args.latency_candidates)
  items = load_items(args.data, args.candidates, skip=args.latency_candidates)
  options = pb.VerifyOptions(num_timing_trials=args.timing_trials)
  naive_items = items[:args.naive_candidates] if args.naive_candidates else items
  print(f"{len(items)} candidates at once + {len(latency_items)} one at a time; service: "
        f"{args.compile_workers} compiler processes, {args.slots_per_gpu} slots/GPU; naive: "
        f"{len(naive_items)} candidates, {args.naive_parallel} at a time; "
        f"{'no GPU (compile only)' if args.no_gpu else 'GPU'}", flush=True)
  service = asyncio.run(run_service(items, latency_items, args, toolchain, options))
  report = {"service": _service_report(items, service)}

  def write() -> None:  # after each phase: the service's figures stand if the naive path is cut
    if args.json:
      pathlib.Path(args.json).write_text(json.dumps(report, indent=1, default=str))
  write()
  print(f"[{time.monotonic() - began:.0f} s]", flush=True)
  if not args.skip_naive:
    naive_options = config_lib.resolve_options(options, config_lib.ServerConfig())  # as served
    print(f"naive path on {len(naive_items)} candidates ...", flush=True)
    naive = run_naive(naive_items, args.naive_parallel, "none" if args.no_gpu else "cuda",
                      naive_options, toolchain)
    report["naive"] = _naive_report(args, naive_items, report["service"], naive)
    write()
  print(f"benchmark wall time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
  main()
