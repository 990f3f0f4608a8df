"""Prometheus metrics, one registry per server so tests can run several servers in a process."""

from __future__ import annotations

import prometheus_client as prom


class Metrics:
  """Counters and histograms the scheduler updates; exported over HTTP by `serve`."""

  def __init__(self) -> None:
    self.registry = prom.CollectorRegistry()
    self.verdicts = prom.Counter("dice_verifier_verdicts", "Verdicts returned, by outcome.",
                                 ["outcome"], registry=self.registry)
    self.stage_seconds = prom.Histogram(
        "dice_verifier_stage_seconds", "Time spent per pipeline stage.", ["stage"],
        buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640),
        registry=self.registry)
    self.worker_seconds = prom.Histogram(
        "dice_verifier_worker_seconds",
        "Where a GPU slot's time per job went (worker/process.py _timings; slot: the whole job as the "
        "server saw it).", ["part"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40),
        registry=self.registry)
    self.verdict_seconds = prom.Histogram(
        "dice_verifier_verdict_seconds", "Receipt to verdict.",
        buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640), registry=self.registry)
    self.compile_cache = prom.Counter("dice_verifier_compile_cache", "Compile cache lookups.",
                                      ["result"], registry=self.registry)
    self.rejected_full = prom.Counter("dice_verifier_queue_full",
                                      "Requests refused because the queue was full.",
                                      registry=self.registry)
    self.infra_retries = prom.Counter("dice_verifier_infra_retries",
                                      "Runs retried after an infrastructure failure.",
                                      registry=self.registry)
    self.memory_retries = prom.Counter(
        "dice_verifier_memory_retries", "Runs retried alone on their GPU because the candidate's "
        "process ran out of memory on a problem large for one slot's share.",
        registry=self.registry)
    self.alone_at_once = prom.Counter(
        "dice_verifier_alone_at_once", "Runs started alone on their GPU because an earlier "
        "candidate of their problem ran out of memory at one slot's share.",
        registry=self.registry)
    self.program_cache_hits = prom.Counter(
        "dice_verifier_program_cache_hits", "Requests answered with the verdict of the same "
        "program (comments and layout aside) for the same problem, given or in flight.",
        registry=self.registry)
    self.job_cpu_seconds = prom.Histogram(
        "dice_verifier_job_cpu_seconds",
        "CPU seconds of a GPU job's processes from fork to exit, by part: judge, candidate (the "
        "kernel's count at their exits), judge_until_report and judge_after_report (the judge's "
        "split at its report: its run, then its exit).", ["part"],
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40), registry=self.registry)
    self.judged_jobs = prom.Counter(
        "dice_verifier_judged_jobs", "GPU jobs by their judge process: new (its first job) or "
        "kept (one it served before, worker/process.py judge_jobs).", ["judge"],
        registry=self.registry)
    self.queue_depth = prom.Gauge("dice_verifier_queue_depth", "Requests waiting or running.",
                                  registry=self.registry)
    self.running = prom.Gauge("dice_verifier_running", "Jobs on GPU workers now.",
                              registry=self.registry)

  def serve_http(self, port: int, addr: str = "0.0.0.0") -> None:
    prom.start_http_server(port, addr=addr, registry=self.registry)
