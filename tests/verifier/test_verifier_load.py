"""Bounded load on loopback (the CI version of benchmarks/verifier_load.py): many concurrent
streaming clients, every request answered exactly once, memory not growing with the burst."""

from __future__ import annotations

import importlib.util
import pathlib

import psutil

_BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "verifier_load.py"
_spec = importlib.util.spec_from_file_location("verifier_load", _BENCH)
verifier_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verifier_load)


def test_streaming_clients_get_exactly_one_verdict_each(server):
  rss_before = psutil.Process().memory_info().rss
  result = verifier_load.run_load(server.stub(), clients=16, per_client=12,
                                  make=verifier_load.cpu_requests(cached=False), prefix="ci-load")
  print(f"\nload: {result['requests']} requests, {result['throughput_per_s']:.0f}/s, "
        f"p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms, {result['outcomes']}")
  assert result["errors"] == []
  assert result["requests"] == result["verdicts"] == 16 * 12
  assert result["missing"] == [] and result["duplicates"] == 0 and result["unknown"] == []
  assert set(result["outcomes"]) <= {"REJECTED", "BAD_REFERENCE", "INFRA_ERROR"}
  assert psutil.Process().memory_info().rss - rss_before < 200 << 20
