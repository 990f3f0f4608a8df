"""Server settings and the resolution of per-request options against them.

A request's zero values mean "server default" (the proto says so); non-zero values are clamped to
the server's maxima so one client cannot hold a GPU slot for an hour.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service import toolchain


@dataclasses.dataclass
class ServerConfig:
  """Everything `dice-verifier serve` and `check` can set."""
  listen: str = "127.0.0.1:50051"
  gpus: list[int] | None = None  # None: every GPU nvidia-smi lists
  slots_per_gpu: int = 1
  compile_workers: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
  queue_capacity: int = 256  # requests waiting or running before RESOURCE_EXHAUSTED
  cache_dir: pathlib.Path = dataclasses.field(default_factory=toolchain.default_cache_dir)
  max_source_bytes: int = 1 << 20  # per source field
  max_request_id_bytes: int = 128
  max_log_bytes: int = 64 << 10
  compile_timeout_s: float = 300.0
  run_timeout_s: float = 180.0
  max_compile_timeout_s: float = 900.0
  max_run_timeout_s: float = 900.0
  correctness_trials: int = 5
  max_correctness_trials: int = 100
  timing_trials: int = 100
  max_timing_trials: int = 1000
  seed: int = 42
  plausible_speedup: float = 100.0
  verdict_cache_size: int = 10_000
  use_pch: bool = True
  light_headers: bool = True
  cpu_test_mode: bool = False  # development only: run C++-only candidates on CPU workers
  auth_token: str | None = None
  metrics_port: int | None = None


def _precision_name(value: int) -> str:
  return "FP32" if value in (pb.PRECISION_UNSPECIFIED, pb.FP32) else pb.Precision.Name(value)


def resolve_options(options: pb.VerifyOptions, config: ServerConfig) -> dict[str, Any]:
  """The job options a worker runs with: request values, defaults for zeros, clamped."""
  pick = lambda value, default, cap: min(value, cap) if value > 0 else default
  return {
      "precision": _precision_name(options.precision),
      "num_correctness_trials": pick(options.num_correctness_trials, config.correctness_trials,
                                     config.max_correctness_trials),
      "atol": options.atol if options.atol > 0 else 0.0,
      "rtol": options.rtol if options.rtol > 0 else 0.0,
      "skip_timing": options.skip_timing,
      "num_timing_trials": pick(options.num_timing_trials, config.timing_trials,
                                config.max_timing_trials),
      "compile_timeout_s": pick(options.compile_timeout_s, config.compile_timeout_s,
                                config.max_compile_timeout_s),
      "run_timeout_s": pick(options.run_timeout_s, config.run_timeout_s,
                            config.max_run_timeout_s),
      "seed": options.seed or config.seed,
      "plausible_speedup": config.plausible_speedup,
  }
