"""The pipeline for one request, and the bookkeeping around many: admission, dedup, caching.

Stages, each with its own limit (ARCHITECTURE.md, "The verifier's trust boundary"): static
checks (milliseconds, inline), compile (the compile pool, `compile_timeout_s`), run (a GPU worker
slot, `run_timeout_s` covering load, correctness, launch check and timing). A run that ends in
INFRA_ERROR is retried once, alone on its GPU with every slot's share of its memory
(pool.WorkerPool.run, exclusive); a candidate's failure never is, except the one that may be our
share's: a candidate process that ran out of GPU memory on a problem large for a slot's share
(trusted/verdict.short_of_memory) gets that one run alone too, when the GPU has several slots.
The retry's verdict stands. Such a problem is remembered (`LARGE_PROBLEMS` of them, by reference
text), as is one whose timing copies the judge found larger than a slot's share (an INFRA_ERROR
before timing, judge.timing_plan): its later candidates run alone from their first attempt,
since at a slot's share the judge's own timed outputs would run out again (DICE 3497 on the
H200, 2026-12-04: each of six runs, seeds 1-4, ran out at 2 slots, then took 93-94 s alone; an
RL step sends G samples of a problem, and each first attempt held a slot for nothing).

Admission is bounded: at most `queue_capacity` distinct requests are in flight (waiting for the
compile pool, compiling, waiting for a slot, or running); beyond that `QueueFull` is raised and the
server answers RESOURCE_EXHAUSTED, so memory never grows with load. Requests are deduplicated by
request id: a resent id joins the run in flight or gets the cached verdict (INFRA_ERROR verdicts
are not cached, so a retry really retries). Verdicts are also kept on disk (verdict_store.py), so a
resend after a server restart gets the same verdict, not a second one; a cached verdict is only
returned for a request with the same content. A request whose candidate is the same program as
one already verified for the same problem and options (text_key.py: comments and layout aside)
is answered with that verdict under its own id (`attempts` 0: this server did not run it), and
one that arrives while that program is in flight joins the run. The scheduler itself never
executes candidate code.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import math
import pathlib
import re
import time
from typing import Any

from google.protobuf import json_format

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service import __version__
from verifier_service import enums
from verifier_service import singleflight
from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import toolchain as toolchain_lib
from verifier_service.run import envelope
from verifier_service.run import job as job_lib
from verifier_service.service import config as config_lib
from verifier_service.service import metrics as metrics_lib
from verifier_service.service import pool as pool_lib
from verifier_service.service import text_key
from verifier_service.service import verdict_store
from verifier_service.trusted import verdict as verdict_lib

log = logging.getLogger(__name__)


class QueueFull(Exception):
  """More requests in flight than the server's queue capacity."""


def _first_error_line(text: str) -> str:
  for line in text.splitlines():
    if re.search(r"\berror\b", line, re.IGNORECASE) and not line.startswith("$ "):
      return line.strip()[:300]
  return "compilation failed"


def _proto_json(value: Any) -> Any:
  """JSON for ParseDict: non-finite floats as the strings proto3 JSON uses for them."""
  if isinstance(value, float) and not math.isfinite(value):
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
  if isinstance(value, dict):
    return {k: _proto_json(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_proto_json(v) for v in value]
  return value


# Problems (sha256 of the reference text) whose candidates ran short of memory at a slot's share;
# their candidates run alone on their GPU from the first attempt. Least recently seen dropped.
LARGE_PROBLEMS = 4096


class Scheduler:
  """Runs requests through the stages; shared by the gRPC server and `dice-verifier check`."""

  def __init__(self, config: config_lib.ServerConfig, toolchain: toolchain_lib.Toolchain,
               compiler: compile_lib.Compiler, pool: pool_lib.WorkerPool | None,
               metrics: metrics_lib.Metrics | None = None):
    self.config = config
    self.toolchain = toolchain
    self.compiler = compiler
    self.pool = pool
    self.metrics = metrics or metrics_lib.Metrics()
    for slot in pool.slots if pool is not None else []:
      slot.on_reaped = self._reaped
    self._inflight: singleflight.SingleFlight[pb.Verdict] = singleflight.SingleFlight()
    self._verdicts: collections.OrderedDict[str, tuple[str, bytes]] = collections.OrderedDict()
    self._store = verdict_store.VerdictStore(
        pathlib.Path(config.cache_dir) / "verdicts.sqlite",
        config.verdict_store_size) if config.verdict_store_size > 0 else None
    self.verdicts_total = 0
    self.verdict_cache_hits = 0
    self.verdict_cache_misses = 0
    # Verdicts by program (text_key.candidate_key), and the runs in flight by the same key.
    self._programs: collections.OrderedDict[str, bytes] = collections.OrderedDict()
    self._by_program: singleflight.SingleFlight[pb.Verdict] = singleflight.SingleFlight()
    self.program_cache_hits = 0
    self._large_problems: collections.OrderedDict[str, None] = collections.OrderedDict()
    self._warm_up: asyncio.Task | None = None

  @classmethod
  def create(cls, config: config_lib.ServerConfig,
             toolchain: toolchain_lib.Toolchain | None = None) -> Scheduler:
    """Discovers the toolchain and GPUs and wires compiler and worker pool for `config`."""
    toolchain = toolchain or toolchain_lib.discover()
    gpus = config.gpus if config.gpus is not None else [g.index for g in toolchain.gpus]
    compiler = compile_lib.Compiler(toolchain, config.cache_dir,
                                    config.compiler_options(gpus=bool(gpus)))
    pool = None
    spec = config.sandbox_spec(toolchain.cuda_root)
    env = toolchain.build_env()
    if config.cuda_device_max_connections:  # read by each job process's context as it is made
      env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(config.cuda_device_max_connections)
    if config.cpu_test_mode:
      pool = pool_lib.WorkerPool.for_devices([], config.slots_per_gpu, env, cpu_test_mode=True,
                                             sandbox=spec)
    elif gpus:
      pool = pool_lib.WorkerPool.for_devices(gpus, config.slots_per_gpu, env, sandbox=spec)
    return cls(config, toolchain, compiler, pool)

  async def start(self) -> None:
    """Starts worker processes and builds the precompiled header in the background."""
    self._warm_up = asyncio.ensure_future(self.compiler.warm_up())
    if self.pool is not None:
      await self.pool.start()

  async def stop(self) -> None:
    if self._warm_up is not None:
      self._warm_up.cancel()
      await asyncio.gather(self._warm_up, return_exceptions=True)
    await self.compiler.close()
    if self.pool is not None:
      await self.pool.stop()
    if self._store is not None:
      self._store.close()

  # ------------------------------------------------------------------ requests

  @property
  def queue_depth(self) -> int:
    return len(self._inflight)

  def cached(self, request_id: str, digest: str) -> pb.Verdict | None:
    """The verdict already given for this id and content (memory, then disk), or None."""
    entry = self._verdicts.get(request_id)
    blob = entry[1] if entry is not None and entry[0] == digest else None
    if blob is None and self._store is not None:
      blob = self._store.get(request_id, digest)
      if blob is not None:
        self._verdicts[request_id] = (digest, blob)
    if blob is None:
      return None
    self._verdicts.move_to_end(request_id)
    return pb.Verdict.FromString(blob)

  async def verify(self, request: pb.VerifyRequest) -> pb.Verdict:
    """One verdict for `request`; raises QueueFull when the server is at capacity."""
    digest = verdict_store.request_digest(request)
    hit = self.cached(request.request_id, digest)
    if hit is not None:
      self.verdict_cache_hits += 1
      return hit
    if request.request_id not in self._inflight:
      if len(self._inflight) >= self.config.queue_capacity:
        self.metrics.rejected_full.inc()
        raise QueueFull(f"{len(self._inflight)} requests in flight (capacity "
                        f"{self.config.queue_capacity})")
      self.verdict_cache_misses += 1
    self.metrics.queue_depth.set(len(self._inflight) + 1)
    try:
      return await self._inflight.run(request.request_id,
                                      lambda: self._same_program(request, digest))
    finally:
      self.metrics.queue_depth.set(len(self._inflight))

  async def _same_program(self, request: pb.VerifyRequest, digest: str) -> pb.Verdict:
    """The verdict of the program `request` holds: given before, joined in flight, or run now."""
    start = time.monotonic()
    key = self._program_key(request) if self.config.program_cache_size > 0 else None
    if key is None:
      return await self._pipeline(request)
    blob = self._programs.get(key)
    if blob is None:
      while True:
        verdict = await self._by_program.run(key, lambda: self._pipeline(request))
        if verdict.request_id == request.request_id or verdict.outcome != pb.INFRA_ERROR:
          break
        # Another request's run ended in our fault: that answers nothing about the program, and
        # INFRA_ERROR is never cached, so this request runs as a later one would (leading the
        # key's next run or joining it). Each pass ends one run, so duplicates end in turn.
      if verdict.outcome != pb.INFRA_ERROR:
        self._programs[key] = verdict.SerializeToString()
        while len(self._programs) > self.config.program_cache_size:
          self._programs.popitem(last=False)
      if verdict.request_id == request.request_id:
        return verdict
    else:
      self._programs.move_to_end(key)
      verdict = pb.Verdict.FromString(blob)
    self.program_cache_hits += 1
    self.metrics.program_cache_hits.inc()
    answer = pb.Verdict()
    answer.CopyFrom(verdict)
    answer.request_id, answer.attempts = request.request_id, 0
    del answer.stage_timings[:]  # nothing ran for this request
    answer.total_s = time.monotonic() - start
    self._remember(answer, digest)
    return answer

  @staticmethod
  def _program_key(request: pb.VerifyRequest) -> str | None:
    """The program cache's key, or None: the request then runs as it is. The key only saves
    work, so a fault in computing it costs the request nothing but the cache (logged)."""
    try:
      return text_key.candidate_key(request.reference_source, request.candidate_source,
                                    request.options.SerializeToString(deterministic=True))
    except Exception:  # pylint: disable=broad-except
      log.exception("program key failed for %s; verified without the program cache",
                    request.request_id)
      return None

  def _remember(self, verdict: pb.Verdict, digest: str) -> None:
    if verdict.outcome == pb.INFRA_ERROR:
      return
    blob = verdict.SerializeToString()
    self._verdicts[verdict.request_id] = (digest, blob)
    self._verdicts.move_to_end(verdict.request_id)
    if self._store is not None:
      self._store.put(verdict.request_id, digest, blob)
    while len(self._verdicts) > self.config.verdict_cache_size:
      self._verdicts.popitem(last=False)

  # ------------------------------------------------------------------ pipeline

  async def _pipeline(self, request: pb.VerifyRequest) -> pb.Verdict:
    start = time.monotonic()
    verdict = pb.Verdict(request_id=request.request_id)
    verdict.environment.CopyFrom(pb.Environment(**self.toolchain.environment()))
    options = config_lib.resolve_options(request.options, self.config)
    verdict.policy = pb.Policy.Value(options.policy)
    try:
      await self._stages(request, options, verdict)
    except Exception as e:  # pylint: disable=broad-except
      log.exception("pipeline failed for %s", request.request_id)
      verdict.outcome, verdict.message = pb.INFRA_ERROR, f"verifier error: {type(e).__name__}: {e}"
    verdict.total_s = time.monotonic() - start
    self.verdicts_total += 1
    self.metrics.verdicts.labels(pb.Outcome.Name(verdict.outcome)).inc()
    self.metrics.verdict_seconds.observe(verdict.total_s)
    for timing in verdict.stage_timings:
      self.metrics.stage_seconds.labels(pb.Stage.Name(timing.stage)).observe(timing.duration_s)
    self._remember(verdict, verdict_store.request_digest(request))
    log.info("verdict", extra={"fields": {
        "request_id": verdict.request_id, "outcome": pb.Outcome.Name(verdict.outcome),
        "stage": pb.Stage.Name(verdict.stage), "total_s": round(verdict.total_s, 3),
        "cache_hit": verdict.compile.cache_hit, "message": verdict.message[:200]}})
    return verdict

  def _end(self, verdict: pb.Verdict, outcome: pb.Outcome, stage: pb.Stage, message: str) -> None:
    verdict.outcome, verdict.stage, verdict.message = outcome, stage, message

  async def _stages(self, request: pb.VerifyRequest, options: job_lib.JobOptions,
                    verdict: pb.Verdict) -> None:
    t = time.monotonic()
    report = checks.check_sources(request.reference_source, request.candidate_source,
                                  allow_cpu_only=self.config.cpu_test_mode)
    verdict.stage_timings.add(stage=pb.STAGE_STATIC_CHECK, duration_s=time.monotonic() - t)
    verdict.compile.kernel_names.extend(report.kernel_names)
    verdict.compile.exported_functions.extend(report.exported_functions)
    for kind, evidence in report.exploits:
      verdict.exploits.add(kind=pb.Exploit.Value(kind), evidence=evidence)
    if report.outcome is not None:
      self._end(verdict, pb.Outcome.Value(report.outcome), pb.Stage.Value(report.stage),
                report.message)
      return

    t = time.monotonic()
    problem = hashlib.sha256(request.reference_source.encode()).hexdigest()
    builds = await asyncio.gather(*(
        self.compiler.build(ext, options.compile_timeout_s, problem=problem)
        for ext in report.extensions))
    verdict.stage_timings.add(stage=pb.STAGE_COMPILE, duration_s=time.monotonic() - t)
    self._fill_compile(verdict, builds)
    failed = next((b for b in builds if not b.ok), None)
    if failed is not None:
      if failed.timed_out:
        self._end(verdict, pb.TIMEOUT, pb.STAGE_COMPILE, failed.log)
      else:
        self._end(verdict, pb.COMPILE_ERROR, pb.STAGE_COMPILE, _first_error_line(failed.log))
      return

    needs_gpu = any(ext.cuda_sources for ext in report.extensions)
    if self.pool is None or (needs_gpu and self.config.cpu_test_mode):
      self._end(verdict, pb.NO_GPU, pb.STAGE_LOAD,
                "compiled; this server has no GPU, so load, correctness and timing were not run")
      return

    job = envelope.Job(
        job_id="", reference_source=request.reference_source,
        candidate_source=request.candidate_source, options=options,
        modules={ext.fingerprint: b.so_path for ext, b in zip(report.extensions, builds)},
        kernel_names=tuple(report.kernel_names),
        kernel_namespaces=tuple(b.namespace for b in builds if b.namespace))
    alone = problem in self._large_problems and self.config.slots_per_gpu > 1
    if alone:
      self._large_problems.move_to_end(problem)
      self.metrics.alone_at_once.inc()
    for attempt in (1, 2):
      verdict.attempts = attempt
      t = time.monotonic()
      # The retry runs alone on its GPU, with every slot's share of its memory: the failures
      # seen were a reference that needs more than one slot's share (DICE 3497, 6995 at 2-4
      # slots per GPU), a candidate process out of memory on such a problem (3497 at 2 and 4
      # slots), and a GPU crowded by its neighbours.
      result = await self.pool.run(job, options.run_timeout_s, exclusive=alone)
      short = (result.pop(verdict_lib.SHORT_OF_MEMORY, False) and self.config.slots_per_gpu > 1
               and not alone)
      if attempt == 2 or not (short or result.get("outcome") == enums.INFRA_ERROR):
        break
      alone = True
      if short:
        self._large_problems[problem] = None
        self._large_problems.move_to_end(problem)
        while len(self._large_problems) > LARGE_PROBLEMS:
          self._large_problems.popitem(last=False)
        self.metrics.memory_retries.inc()
        log.warning("retrying %s alone on its GPU: the candidate's process ran out of memory on "
                    "a problem large for a slot's share: %s", request.request_id,
                    result.get("message", "")[:300])
      else:
        self.metrics.infra_retries.inc()
        log.warning("retrying %s after infrastructure failure: %s", request.request_id,
                    result.get("message"))
    self._merge(verdict, result, time.monotonic() - t)

  def _reaped(self, message: dict[str, Any]) -> None:
    """A finished job's processes' CPU (the worker's "reaped" message) into the metrics."""
    parts = message.get("cpu_s")
    for part, seconds in parts.items() if isinstance(parts, dict) else ():
      if isinstance(seconds, (int, float)) and seconds >= 0:
        self.metrics.job_cpu_seconds.labels(str(part)).observe(seconds)

  def _fill_compile(self, verdict: pb.Verdict, builds: list[compile_lib.BuildResult]) -> None:
    compiled = all(b.ok for b in builds)
    verdict.compile.compiled = compiled
    verdict.compile.cache_hit = bool(builds) and all(b.cache_hit for b in builds)
    logs = [b.log for b in builds if b.log]
    verdict.compile.log, verdict.compile.log_truncated = compile_lib.bound_log(
        "\n".join(logs), self.config.max_log_bytes)
    verdict.compile.log_truncated |= any(b.log_truncated for b in builds)
    keys = [b.cache_key for b in builds]
    verdict.compile.cache_key = keys[0] if len(keys) == 1 else hashlib.sha256(
        "".join(keys).encode()).hexdigest()
    for b in builds:
      self.metrics.compile_cache.labels("hit" if b.cache_hit else "miss").inc()

  def _merge(self, verdict: pb.Verdict, result: dict[str, Any], run_s: float) -> None:
    """Copies a worker's Verdict-shaped dict into `verdict`."""
    environment = result.pop("environment", {})
    for part, seconds in result.pop("worker_timings", {}).items():
      self.metrics.worker_seconds.labels(part).observe(seconds)
    judge_job = result.pop("judge_job", None)
    if isinstance(judge_job, int) and judge_job > 0:
      self.metrics.judged_jobs.labels("new" if judge_job == 1 else "kept").inc()
    partial = pb.Verdict()
    json_format.ParseDict(_proto_json(result), partial, ignore_unknown_fields=True)
    if not partial.stage_timings:
      partial.stage_timings.add(stage=pb.STAGE_LOAD, duration_s=run_s)
    verdict.MergeFrom(partial)
    for key, value in environment.items():
      setattr(verdict.environment, key, value)

  # ------------------------------------------------------------------ info

  def info(self) -> pb.ServerInfo:
    info = pb.ServerInfo(server_version=__version__, queue_depth=self.queue_depth,
                         queue_capacity=self.config.queue_capacity,
                         running=self.pool.running if self.pool else 0,
                         compile_workers=self.config.compile_workers,
                         max_source_bytes=self.config.max_source_bytes,
                         verdicts_total=self.verdicts_total)
    info.environment.CopyFrom(pb.Environment(**self.toolchain.environment()))
    slots = collections.Counter()
    if self.pool is not None:
      for slot in self.pool.slots:
        slots[slot.unit] += 1
    for gpu in self.toolchain.gpus:
      if self.config.gpus is None or gpu.index in self.config.gpus:
        info.gpus.add(index=gpu.index, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes,
                      arch=gpu.arch, slots=slots.get(f"gpu{gpu.index}", 0))
    stats = self.compiler.stats()
    info.compile_cache.CopyFrom(pb.CacheStats(**stats))
    info.verdict_cache.CopyFrom(pb.CacheStats(
        entries=len(self._verdicts), hits=self.verdict_cache_hits + self.program_cache_hits,
        misses=self.verdict_cache_misses - self.program_cache_hits))
    return info

