"""The verifier client's defaults per use, stated once, with the reasons; the option names users write.

Every command's flags and config keys take their defaults from here: `dice train` and `dice
rewards check` (`verifier.*` keys) and ClientConfig() from TRAINING; `dice eval`, `dice generate`
(`--connect-timeout`, `--request-timeout`) and KernelGenerator from EVALUATION. No gRPC or proto
import, so the command-line parsers can read it and `dice --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal


@dataclasses.dataclass(frozen=True)
class UseDefaults:
  """How long the client waits, and how much it keeps in flight, for one kind of use."""

  connect_timeout_s: float       # per connection try, and the preflight's wait for ServerInfo
  request_timeout_s: float       # per send, from write to verdict; then the request is re-sent
  max_in_flight_per_stream: int  # requests outstanding on one stream (the server queues them)


# `dice train`, `dice rewards check` and ClientConfig(). A farm of GPU boxes (16 compile workers
# each) takes a step's rows in waves; 64 per stream keep every worker of a box busy. A rollout
# waits for its slowest verdict, so a request with no verdict after 15 minutes is presumed lost and
# re-sent (a cold compile takes 11-55 s, 44 s median with 99 candidates queued on one H200 box:
# BENCHMARKS.md). 10 s to connect covers a loopback verifier that has just started and a farm
# across a data centre.
TRAINING = UseDefaults(connect_timeout_s=10.0, request_timeout_s=900.0, max_in_flight_per_stream=64)
# `dice eval`, `dice generate` and `KernelGenerator`: often a `--verifier local` server with 2
# compile workers (a laptop, CI) sent every candidate of a benchmark at once. The deadline runs
# from the send, so it must cover the last of the in-flight candidates queuing behind those
# workers: 32 x ~60 s / 2 = ~16 min, inside 30. The smaller window keeps that bound.
EVALUATION = UseDefaults(connect_timeout_s=10.0, request_timeout_s=1800.0, max_in_flight_per_stream=32)


# The names a user gives for VerifyOptions fields (options.py maps them to the proto's enums).
PrecisionName = Literal["fp32", "fp16", "bf16"]
PRECISION_NAMES: tuple[PrecisionName, ...] = typing.get_args(PrecisionName)
POLICY_NAMES = ("default", "strict")  # partial replacement: KernelBench/DICE's, or torch only for glue
