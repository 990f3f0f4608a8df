"""Cold-cache verification throughput and latency: the verifier service vs. the naive path.

Both paths verify the same distinct DICE infilling candidates (`cuda_code` against its
`pytorch_code`), each with a cold cache, on this machine:

(a) naive = what KernelBench does: a fresh Python process per candidate, plain
    `torch.utils.cpp_extension.load_inline` (ninja, both translation units in parallel) into an
    empty extension folder, then the same static checks, correctness trials and timing as the
    service (`runner.run_job` with torch's own load_inline left in place). P processes at a time.
(b) the service: a real gRPC server on loopback started in this process with an empty cache
    folder, `compile_workers` compiler processes and `slots_per_gpu` GPU worker slots; every
    candidate is submitted at once and the server's queue schedules them. Its one-off start-up
    (worker processes, precompiled header) is reported separately and also folded into a second
    throughput figure. Latency: further distinct candidates, one at a time, cold.

Prints median cold latency per verdict and verdicts per hour for each path, the ratios, and every
candidate whose verdicts disagree.

  python benchmarks/verifier_throughput.py                            # on the GPU machine
  python benchmarks/verifier_throughput.py --candidates 4 --latency-candidates 1 --no-gpu
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc

from verifier_service import checks
from verifier_service import config as config_lib
from verifier_service import scheduler as scheduler_lib
from verifier_service import server as server_lib
from verifier_service import toolchain as toolchain_lib

_NAIVE = textwrap.dedent("""
    import json, sys
    import torch  # noqa: F401
    from verifier_service import checks, runner
    ref, cand, out, device, options = sys.argv[1:6]
    ref, cand = open(ref).read(), open(cand).read()
    report = checks.check_sources(ref, cand)
    if report.outcome:
      result = {"outcome": report.outcome, "message": report.message}
    elif device == "none":
      try:
        exec(compile(cand, "candidate.py", "exec"), {"__name__": "candidate"})
        result = {"outcome": "NO_GPU", "message": "compiled"}
      except Exception as e:
        building = "Error building extension" in str(e)
        result = {"outcome": "COMPILE_ERROR" if building else "RUNTIME_ERROR",
                  "message": str(e)[:300]}
    else:
      job = {"reference_source": ref, "candidate_source": cand, "modules": None,
             "kernel_names": report.kernel_names, "options": json.loads(options),
             "device": device}
      result = runner.run_job(job, lambda message: None)
      if "Error building extension" in result.get("message", ""):
        result["outcome"] = "COMPILE_ERROR"
    json.dump({"outcome": result["outcome"], "message": result.get("message", "")},
              open(out, "w"))
""")


def _median(values: list[float]) -> float:
  return statistics.median(values) if values else float("nan")


def load_items(path: str, count: int, skip: int = 0) -> list[dict]:
  """Distinct infilling items whose candidates pass the static checks (both paths compile)."""
  items = json.loads(pathlib.Path(path).read_text())
  usable = [i for i in items if checks.check_sources(i["pytorch_code"], i["cuda_code"]).outcome
            is None]
  chosen = usable[skip:skip + count]
  if len(chosen) < count:
    raise SystemExit(f"only {len(chosen)} usable candidates after skipping {skip}")
  return chosen


def run_naive(items: list[dict], parallel: int, device: str, options: dict,
              toolchain: toolchain_lib.Toolchain) -> tuple[dict, list[float], float]:
  """One fresh process per candidate, `parallel` at a time. Returns outcomes, latencies, wall."""
  root = pathlib.Path(tempfile.mkdtemp(prefix="naive-"))

  def one(item: dict) -> tuple[str, float]:
    work = root / str(item["id"])
    work.mkdir()
    (work / "ref.py").write_text(item["pytorch_code"])
    (work / "cand.py").write_text(item["cuda_code"])
    env = toolchain.build_env()
    env["TORCH_EXTENSIONS_DIR"] = str(work / "ext")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _NAIVE, str(work / "ref.py"), str(work / "cand.py"),
         str(work / "out.json"), device, json.dumps(options)], env=env, capture_output=True,
        text=True, check=False, cwd=work)
    latency = time.monotonic() - start
    try:
      outcome = json.loads((work / "out.json").read_text())["outcome"]
    except (OSError, ValueError):
      outcome = f"CRASHED(rc={proc.returncode})"
    return outcome, latency

  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
    results = list(pool.map(one, items))
  wall = time.monotonic() - start
  outcomes = {item["id"]: r[0] for item, r in zip(items, results)}
  return outcomes, [r[1] for r in results], wall


async def run_service(items: list[dict], latency_items: list[dict], args: argparse.Namespace,
                      toolchain: toolchain_lib.Toolchain, options: pb.VerifyOptions) -> dict:
  cache = pathlib.Path(tempfile.mkdtemp(prefix="service-cache-"))
  config = config_lib.ServerConfig(
      listen="127.0.0.1:0", cache_dir=cache, compile_workers=args.compile_workers,
      slots_per_gpu=args.slots_per_gpu, queue_capacity=4096,
      gpus=[] if args.no_gpu else None, run_timeout_s=600.0, compile_timeout_s=900.0)
  started = time.monotonic()
  scheduler = scheduler_lib.Scheduler.create(config, toolchain)
  await scheduler.start()
  server, port, _ = await server_lib.start_server(scheduler)
  await scheduler._warm_up  # pylint: disable=protected-access  # the precompiled header
  startup = time.monotonic() - started
  print(f"service start-up (workers + precompiled header): {startup:.1f} s", flush=True)
  channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
      ("grpc.max_receive_message_length", 64 << 20)])
  stub = verifier_pb2_grpc.VerifierStub(channel)

  async def one(item: dict, tag: str) -> tuple[pb.Verdict, float]:
    t0 = time.monotonic()
    verdict = await stub.Verify(pb.VerifyRequest(
        request_id=f"{tag}-{item['id']}", reference_source=item["pytorch_code"],
        candidate_source=item["cuda_code"], options=options), timeout=3600)
    return verdict, time.monotonic() - t0

  try:
    latencies = []
    for item in latency_items:
      verdict, seconds = await one(item, "latency")
      latencies.append(seconds)
      print(f"  latency {item['id']}: {seconds:.1f} s {pb.Outcome.Name(verdict.outcome)}",
            flush=True)
    start = time.monotonic()
    results = await asyncio.gather(*(one(item, "throughput") for item in items))
    wall = time.monotonic() - start
  finally:
    await channel.close()
    await server.stop(grace=1)
    await scheduler.stop()
  verdicts = [v for v, _ in results]
  compile_s = [next((t.duration_s for t in v.stage_timings if t.stage == pb.STAGE_COMPILE), 0.0)
               for v in verdicts]
  return {"outcomes": {i["id"]: pb.Outcome.Name(v.outcome) for i, v in zip(items, verdicts)},
          "messages": {i["id"]: v.message for i, v in zip(items, verdicts)},
          "latencies": latencies, "loaded_latencies": [s for _, s in results], "wall": wall,
          "startup": startup, "compile_s": compile_s}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data", default="../shared/data/dice/kernel_infilling_evaluation.json",
                      help="DICE infilling JSON")
  parser.add_argument("--candidates", type=int, default=32,
                      help="distinct candidates for the throughput runs (default %(default)s)")
  parser.add_argument("--naive-candidates", type=int, default=0,
                      help="run the naive path on only the first N of them (0: all)")
  parser.add_argument("--latency-candidates", type=int, default=8,
                      help="further distinct candidates verified one at a time by the service "
                           "for its cold latency (default %(default)s)")
  cpus = os.cpu_count() or 2
  parser.add_argument("--naive-parallel", type=int, default=max(1, cpus // 2),
                      help="naive processes at a time (each compiles 2 translation units in "
                           "parallel; default CPUs/2 = %(default)s)")
  parser.add_argument("--compile-workers", type=int, default=cpus,
                      help="service compiler processes (default CPUs = %(default)s)")
  parser.add_argument("--slots-per-gpu", type=int, default=2,
                      help="service GPU worker slots per GPU (default %(default)s)")
  parser.add_argument("--timing-trials", type=int, default=100,
                      help="timed calls per side, both paths (default %(default)s)")
  parser.add_argument("--no-gpu", action="store_true",
                      help="compile-only comparison (no GPU here): verdicts are NO_GPU")
  parser.add_argument("--skip-naive", action="store_true", help="only the service")
  parser.add_argument("--json", default="", help="write every number to this file")
  args = parser.parse_args()

  toolchain = toolchain_lib.discover()
  items = load_items(args.data, args.candidates)
  latency_items = load_items(args.data, args.latency_candidates, skip=args.candidates)
  options = pb.VerifyOptions(num_timing_trials=args.timing_trials)
  naive_items = items[:args.naive_candidates] if args.naive_candidates else items
  print(f"{len(items)} candidates; service: {args.compile_workers} compiler processes, "
        f"{args.slots_per_gpu} slots/GPU; naive: {args.naive_parallel} processes at a time on "
        f"{len(naive_items)} candidates; {'no GPU (compile only)' if args.no_gpu else 'GPU'}",
        flush=True)

  service = asyncio.run(run_service(items, latency_items, args, toolchain, options))
  rate = lambda n, seconds: n / seconds * 3600 if seconds > 0 else float("nan")
  report = {
      "service": {"median_cold_latency_s": _median(service["latencies"]),
                  "median_latency_under_load_s": _median(service["loaded_latencies"]),
                  "median_compile_stage_s": _median(service["compile_s"]),
                  "verdicts_per_hour": rate(len(items), service["wall"]),
                  "verdicts_per_hour_with_startup": rate(len(items),
                                                         service["wall"] + service["startup"]),
                  "startup_s": service["startup"], "wall_s": service["wall"],
                  "outcomes": service["outcomes"]}}
  if not args.skip_naive:
    naive_options = {
        "precision": "FP32", "num_correctness_trials": 5, "atol": 0.0, "rtol": 0.0,
        "skip_timing": False, "num_timing_trials": args.timing_trials, "seed": 42}
    outcomes, latencies, wall = run_naive(naive_items, args.naive_parallel,
                                          "none" if args.no_gpu else "cuda", naive_options,
                                          toolchain)
    report["naive"] = {"median_cold_latency_s": _median(latencies),
                       "verdicts_per_hour": rate(len(naive_items), wall), "wall_s": wall,
                       "outcomes": outcomes}
    disagree = {k: (v, service["outcomes"][k]) for k, v in outcomes.items()
                if v != service["outcomes"][k]}
    report["disagreements"] = disagree
    report["throughput_ratio"] = (report["service"]["verdicts_per_hour"] /
                                  report["naive"]["verdicts_per_hour"])
    report["latency_ratio"] = (report["naive"]["median_cold_latency_s"] /
                               report["service"]["median_cold_latency_s"])

  s = report["service"]
  print("\n== results ==")
  print(f"service: median cold latency {s['median_cold_latency_s']:.1f} s (one at a time, "
        f"{len(latency_items)} candidates); under load {s['median_latency_under_load_s']:.1f} s; "
        f"median compile stage {s['median_compile_stage_s']:.1f} s")
  print(f"service: {s['verdicts_per_hour']:.0f} verdicts/hour ({len(items)} in "
        f"{s['wall_s']:.1f} s); with start-up {s['verdicts_per_hour_with_startup']:.0f}/hour")
  if "naive" in report:
    n = report["naive"]
    print(f"naive:   median cold latency {n['median_cold_latency_s']:.1f} s (per process, "
          f"{args.naive_parallel} at a time)")
    print(f"naive:   {n['verdicts_per_hour']:.0f} verdicts/hour ({len(naive_items)} in "
          f"{n['wall_s']:.1f} s)")
    print(f"ratio:   throughput {report['throughput_ratio']:.1f}x, latency "
          f"{report['latency_ratio']:.1f}x")
    agree = len(naive_items) - len(report["disagreements"])
    print(f"verdicts agree on {agree}/{len(naive_items)}")
    for key, (naive, ours) in report["disagreements"].items():
      print(f"  {key}: naive {naive} vs service {ours}: {service['messages'][key][:150]}")
  outcome_counts = {}
  for outcome in s["outcomes"].values():
    outcome_counts[outcome] = outcome_counts.get(outcome, 0) + 1
  print(f"service outcomes: {outcome_counts}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
  main()
