"""Load test: many concurrent streaming clients against one verifier server on loopback.

Every request must get exactly one verdict (matched by request id), and a full queue must answer
at once (an INFRA_ERROR verdict at STAGE_QUEUE on the stream, RESOURCE_EXHAUSTED on Verify) rather
than growing the server's memory. Prints throughput, p50/p99 latency (send to verdict), how many
requests were turned away by a full queue, and the server's resident memory before and after.

CPU (default): verdicts that need no GPU and no compiler, so the figure is the server's own cost
(gRPC, admission, dedup, static checks, verdict store): static rejections and bad references,
plus (with --cached) a candidate whose build is in the compile cache (NO_GPU).
GPU (--gpu): real verdicts (compile once, then correctness and timing of a small honest kernel
on the GPU workers), so the figure is the farm's end-to-end throughput.

  python benchmarks/verifier_load.py [--clients 64] [--requests 20] [--queue 256] [--cached]
  python benchmarks/verifier_load.py --gpu --clients 16 --requests 8

The ratio printed at the end compares throughput against one client sending one request at a
time (the same server, the same requests), i.e. what concurrency buys.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable

import psutil

from dice.verifier.v1 import verifier_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "verifier"))

import verifier_harness  # noqa: E402  pylint: disable=wrong-import-position
import verifier_kernels as kernels  # noqa: E402  pylint: disable=wrong-import-position


def cpu_requests(cached: bool) -> Callable[[str, int], pb.VerifyRequest]:
  """Request i of client c: a rotation of verdicts that need no compiler (or only the cache)."""
  kinds = [("import torch\n", kernels.REFERENCE),  # REJECTED: no ModelNew
           (kernels.cuda_candidate().replace("__global__", "__device__"), kernels.REFERENCE),
           (kernels.cuda_candidate(), kernels.REFERENCE.replace("def get_inputs", "def nope"))]
  if cached:
    kinds.append((kernels.cuda_candidate(), kernels.REFERENCE))  # NO_GPU from the cache

  def make(request_id: str, i: int) -> pb.VerifyRequest:
    candidate, reference = kinds[i % len(kinds)]
    return pb.VerifyRequest(request_id=request_id, reference_source=reference,
                            candidate_source=candidate)
  return make


def gpu_requests() -> Callable[[str, int], pb.VerifyRequest]:
  def make(request_id: str, i: int) -> pb.VerifyRequest:
    del i
    return pb.VerifyRequest(request_id=request_id, reference_source=kernels.REFERENCE,
                            candidate_source=kernels.cuda_candidate(),
                            options=pb.VerifyOptions(num_timing_trials=20))
  return make


def run_load(stub, clients: int, per_client: int, make: Callable[[str, int], pb.VerifyRequest],
             prefix: str, timeout_s: float = 600.0) -> dict:
  """Each client streams `per_client` requests; returns counts and latencies."""
  sent: dict[str, float] = {}
  got: dict[str, list[tuple[float, pb.Verdict]]] = {}
  lock = threading.Lock()
  errors: list[str] = []

  def client(c: int) -> None:
    def requests():
      for i in range(per_client):
        request = make(f"{prefix}-{c}-{i}", c * per_client + i)
        with lock:
          sent[request.request_id] = time.monotonic()
        yield request
    try:
      for verdict in stub.VerifyStream(requests(), timeout=timeout_s):
        with lock:
          got.setdefault(verdict.request_id, []).append((time.monotonic(), verdict))
    except Exception as e:  # pylint: disable=broad-except
      with lock:
        errors.append(f"client {c}: {e}")

  start = time.monotonic()
  threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  wall = time.monotonic() - start
  latencies = sorted(got[r][0][0] - sent[r] for r in got if r in sent)
  outcomes: dict[str, int] = {}
  full = 0
  for answers in got.values():
    verdict = answers[0][1]
    if verdict.outcome == pb.INFRA_ERROR and verdict.stage == pb.STAGE_QUEUE:
      full += 1
    name = pb.Outcome.Name(verdict.outcome)
    outcomes[name] = outcomes.get(name, 0) + 1
  pct = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else 0.0
  return {"requests": len(sent), "verdicts": sum(len(v) for v in got.values()),
          "duplicates": sum(len(v) - 1 for v in got.values()),
          "missing": sorted(set(sent) - set(got))[:10], "unknown": sorted(set(got) - set(sent))[:10],
          "queue_full": full, "outcomes": outcomes, "errors": errors[:5], "wall_s": wall,
          "throughput_per_s": len(got) / wall if wall else 0.0,
          "p50_ms": 1000 * pct(0.50), "p99_ms": 1000 * pct(0.99),
          "mean_ms": 1000 * statistics.fmean(latencies) if latencies else 0.0}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, default=64, help="concurrent streaming clients")
  parser.add_argument("--requests", type=int, default=20, help="requests per client")
  parser.add_argument("--queue", type=int, default=256, help="server queue capacity")
  parser.add_argument("--cached", action="store_true",
                      help="also send a candidate whose build is cached (compiles it once first)")
  parser.add_argument("--gpu", action="store_true", help="real verdicts on this host's GPUs")
  parser.add_argument("--slots-per-gpu", type=int, default=2)
  parser.add_argument("--cache-dir", type=pathlib.Path, default=None)
  parser.add_argument("--json", type=pathlib.Path, default=None, help="write the figures here")
  args = parser.parse_args(argv)

  cache_dir = args.cache_dir or pathlib.Path(tempfile.mkdtemp(prefix="dice-load-"))
  config = verifier_harness.make_config(cache_dir, queue_capacity=args.queue,
                                        slots_per_gpu=args.slots_per_gpu,
                                        compile_workers=os.cpu_count() or 2)
  from verifier_service.compile import toolchain as toolchain_lib  # pylint: disable=import-outside-toplevel
  srv = verifier_harness.ServerThread(config, toolchain_lib.discover())
  try:
    stub = srv.stub()
    make = gpu_requests() if args.gpu else cpu_requests(args.cached)
    if args.gpu or args.cached:
      print("compiling the candidate once ...", flush=True)
      stub.Verify(make("warm-up", 0), timeout=1800)
    process = psutil.Process()
    rss_before = process.memory_info().rss
    serial = run_load(stub, 1, min(args.requests, 10), make, "serial")
    load = run_load(stub, args.clients, args.requests, make, "load")
    rss_after = process.memory_info().rss
  finally:
    srv.stop()
  load.update(mode="gpu" if args.gpu else "cpu", clients=args.clients,
              per_client=args.requests, queue_capacity=args.queue,
              serial_throughput_per_s=serial["throughput_per_s"],
              rss_growth_mib=(rss_after - rss_before) / 2**20)
  print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in load.items()},
                   indent=1))
  ratio = load["throughput_per_s"] / max(serial["throughput_per_s"], 1e-9)
  print(f"throughput {load['throughput_per_s']:.1f}/s with {args.clients} streaming clients vs "
        f"{serial['throughput_per_s']:.1f}/s serial: {ratio:.2f}x; p50 {load['p50_ms']:.1f} ms, "
        f"p99 {load['p99_ms']:.1f} ms; queue-full answers {load['queue_full']}")
  if args.json:
    args.json.write_text(json.dumps(load, indent=1))
  exactly_once = not load["missing"] and not load["duplicates"] and not load["errors"]
  return 0 if exactly_once else 1


if __name__ == "__main__":
  sys.exit(main())
