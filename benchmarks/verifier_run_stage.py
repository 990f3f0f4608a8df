"""A GPU slot's fixed cost per job: many runs of one compiled candidate, server settings against each other.

The run stage alone: one candidate is compiled once, then `--jobs` verifications of it with
distinct seeds (so no verdict is answered from a cache) are sent at once to a served verifier with
`--slots-per-gpu` slots, and the burst's wall time, jobs per second and a slot's time per job are
measured, with the workers' own account of where it went (`dice_verifier_worker_seconds`: fork,
the judge's start and run, the exits, clean-up; the judge's timing parts). Each `--variant` is a
ServerConfig override set (`name:field=value+field=value`; `base` is the defaults); the variants
run in turn `--rounds` times, alternating, each on a freshly started server, and every figure is
printed with its ratio to the first variant's.

On a GPU the candidate is a synthetic problem's known-good CUDA answer; with `--cpu-test-mode` a
C++-only candidate runs on CPU workers (the same processes, sandbox and protocol, no CUDA: what
the CPU VM can show of the process structure). Requests leave the number of timing trials to the
server unless `--timing-trials` says otherwise, so a variant may set `timing_trials`.

  python benchmarks/verifier_run_stage.py --jobs 64 --variant old:standby_processes=false
  python benchmarks/verifier_run_stage.py --cpu-test-mode --jobs 16 --slots-per-gpu 2 \\
      --variant old:standby_processes=false
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import tempfile
import time

import grpc

from dice.verifier.v1 import verifier_pb2 as pb
from dice.verifier.v1 import verifier_pb2_grpc
from dice_jax.data import problems as problems_lib
from verifier_service.compile import toolchain as toolchain_lib
from verifier_service.service import config as config_lib
from verifier_service.service import scheduler as scheduler_lib
from verifier_service.service import server as server_lib

_CPU_REFERENCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return a * self.scale + b

def get_inputs():
    return [torch.randn(64, 33), torch.randn(64, 33)]

def get_init_inputs():
    return [1.5]
"""
_CPU_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  auto out = torch::empty_like(a);
  const float* x = a.data_ptr<float>();
  const float* y = b.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) o[i] = x[i] * static_cast<float>(s) + y[i];
  return out;
}
"""
ext = load_inline(name="run_stage_bench", cpp_sources=cpp_source, functions=["scaled_add"],
                  with_cuda=True, verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return ext.scaled_add(a, b, self.scale)
'''
# dice_verifier_job_cpu_seconds's parts (Pair.cpu_report); a kept judge's job reports only
# judge_until_report (its run up to the report), the judge's exit comes with its last job
_CPU_ROLES = ("judge", "candidate", "judge_until_report")
_PARTS = ("slot", "total", "fork", "judge_start", "judge_setup_left", "judge_run", "exit",
          "candidate_after_finish", "report_read_lag", "cleanup", "standby_wait", "lock_down", "load_reference", "load_candidate", "correctness", "probes", "timing_lock_wait",
          "timing_setup", "timing_warmup", "timing_calls", "timing_keep", "timing_verify_batch",
          "timing_verify", "profile")


def _variant(text: str) -> tuple[str, dict]:
  name, _, settings = text.partition(":")
  fields = {}
  defaults = config_lib.ServerConfig()
  for item in filter(None, settings.split("+")):
    key, _, value = item.partition("=")
    kind = type(getattr(defaults, key))
    fields[key] = json.loads(value) if kind is bool else kind(value)
  return name, fields


async def _burst(args: argparse.Namespace, fields: dict, reference: str, candidate: str,
                 cache: pathlib.Path, toolchain: toolchain_lib.Toolchain, seed0: int) -> dict:
  config = config_lib.ServerConfig(
      listen="127.0.0.1:0", cache_dir=cache, compile_workers=2, slots_per_gpu=args.slots_per_gpu,
      cpu_test_mode=args.cpu_test_mode, gpus=[] if args.cpu_test_mode else None,
      queue_capacity=4096, verdict_cache_size=0, verdict_store_size=0, **fields)
  scheduler = scheduler_lib.Scheduler.create(config, toolchain)
  await scheduler.start()
  server, port, _ = await server_lib.start_server(scheduler)
  channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
  stub = verifier_pb2_grpc.VerifierStub(channel)
  options = lambda seed: pb.VerifyOptions(seed=seed, num_timing_trials=args.timing_trials)
  try:
    first = await stub.Verify(pb.VerifyRequest(request_id="warm", reference_source=reference,
                                               candidate_source=candidate,
                                               options=options(seed0)), timeout=3600)
    if first.outcome != pb.OK:
      raise SystemExit(f"the candidate is not OK here: {pb.Outcome.Name(first.outcome)} "
                       f"{first.message[:300]}")
    metrics = scheduler.metrics.registry.get_sample_value
    part = lambda p, what: metrics(f"dice_verifier_worker_seconds_{what}", {"part": p}) or 0.0
    before = {p: (part(p, "sum"), part(p, "count")) for p in _PARTS}
    job_cpu = lambda role, what: metrics(f"dice_verifier_job_cpu_seconds_{what}",
                                         {"part": role}) or 0.0
    cpu_before = {r: (job_cpu(r, "sum"), job_cpu(r, "count")) for r in _CPU_ROLES}
    judged = lambda: {k: metrics("dice_verifier_judged_jobs_total", {"judge": k}) or 0.0
                      for k in ("new", "kept")}
    judged_before = judged()
    start = time.monotonic()
    verdicts = await asyncio.gather(*(stub.Verify(pb.VerifyRequest(
        request_id=f"job-{seed0}-{i}", reference_source=reference, candidate_source=candidate,
        options=options(seed0 + 1 + i)), timeout=3600) for i in range(args.jobs)))
    wall = time.monotonic() - start
    judges = {k: int(v - judged_before[k]) for k, v in judged().items()}
    parts = {}
    for p in _PARTS:
      n = part(p, "count") - before[p][1]
      if n:
        parts[p] = (part(p, "sum") - before[p][0]) / n
    await asyncio.sleep(1.0)  # the last jobs' processes exit after their verdicts and are reaped
    cpu = {}
    for r in _CPU_ROLES:
      n = job_cpu(r, "count") - cpu_before[r][1]
      if n:
        cpu[r] = (job_cpu(r, "sum") - cpu_before[r][0]) / n
  finally:
    await channel.close()
    await server.stop(grace=1)
    await scheduler.stop()
  outcomes = sorted({pb.Outcome.Name(v.outcome) for v in verdicts})
  return {"wall_s": wall, "jobs_per_s": args.jobs / wall, "parts_s": parts, "cpu_s": cpu,
          "outcomes": outcomes, "judges": judges,
          "speedups": [v.timing.speedup for v in verdicts if v.HasField("timing")]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=__doc__.split("\n\n", 1)[1])
  parser.add_argument("--jobs", type=int, default=64)
  parser.add_argument("--slots-per-gpu", type=int, default=4)
  parser.add_argument("--timing-trials", type=int, default=0,
                      help="timed calls per side and condition a job asks for (0: the server's "
                      "timing_trials, which a variant may set)")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--cpu-test-mode", action="store_true")
  parser.add_argument("--variant", action="append", default=[],
                      help="NAME:FIELD=VALUE+FIELD=VALUE (ServerConfig fields); repeatable")
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  variants = [("base", {})] + [_variant(v) for v in args.variant]
  if args.cpu_test_mode:
    reference, candidate = _CPU_REFERENCE, _CPU_CANDIDATE
  else:
    problem = problems_lib.load_problems("synthetic:elementwise?split=train&limit=1")[0]
    reference, candidate = problem.reference_source, problem.known_good
  toolchain = toolchain_lib.discover()
  cache = pathlib.Path(tempfile.mkdtemp(prefix="run-stage-cache-"))
  runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
  for r in range(args.rounds):
    for v, (name, fields) in enumerate(variants):
      result = asyncio.run(_burst(args, fields, reference, candidate, cache, toolchain,
                                  1000 * (r * len(variants) + v)))
      runs[name].append(result)
      print(f"round {r} {name}: {args.jobs} jobs in {result['wall_s']:.2f} s = "
            f"{result['jobs_per_s']:.2f} jobs/s; {result['outcomes']}; judges {result['judges']}; "
            "a job's processes' CPU "
            "(mean s): " + ", ".join(f"{k} {v:.3f}" for k, v in result["cpu_s"].items())
            + "; a slot's job (mean s): "
            + ", ".join(f"{k} {v:.3f}" for k, v in result["parts_s"].items()), flush=True)
  base = statistics.median(r["jobs_per_s"] for r in runs["base"])
  summary = {}
  for name, results in runs.items():
    rate = statistics.median(r["jobs_per_s"] for r in results)
    slot = statistics.median(r["parts_s"].get("slot", float("nan")) for r in results)
    cpu = statistics.median(sum(r["cpu_s"].get(role, 0.0) for role in ("judge", "candidate"))
                            for r in results)
    speedups = [s for r in results for s in r["speedups"]]
    summary[name] = {"jobs_per_s": rate, "ratio_to_base": rate / base, "slot_s": slot,
                     "job_cpu_s": cpu,
                     "median_speedup": statistics.median(speedups) if speedups else None,
                     "runs": results}
    print(f"{name}: median {rate:.2f} jobs/s ({rate / base:.2f}x base), a slot's job "
          f"{slot:.3f} s, a job's processes {cpu:.3f} CPU-s, median speedup "
          f"{summary[name]['median_speedup']}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
  main()
