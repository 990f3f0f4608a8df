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

from verifier_service import enums
from verifier_service.compile import batch as batch_lib
from verifier_service.compile import cache as compile_cache
from verifier_service.compile import limits as compile_limits_lib
from verifier_service.compile import options as compile_options_lib
from verifier_service.compile import toolchain
from verifier_service.run import job as job_lib

POLICIES = {"default": pb.POLICY_DEFAULT, "strict": pb.POLICY_STRICT}


@dataclasses.dataclass
class ServerConfig:
  """Everything `dice-verifier serve` and `check` can set."""
  listen: str = "127.0.0.1:50051"
  gpus: list[int] | None = None  # None: every GPU nvidia-smi lists
  slots_per_gpu: int = 1
  compile_workers: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
  queue_capacity: int = 256  # requests waiting or running before RESOURCE_EXHAUSTED
  cache_dir: pathlib.Path = dataclasses.field(default_factory=toolchain.default_cache_dir)
  cache_max_bytes: int = compile_cache.DEFAULT_MAX_BYTES  # LRU-pruned beyond this; 0: unbounded
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
  # Partial-replacement policy for requests that leave VerifyOptions.policy unset: "default"
  # (KernelBench/DICE: a torch matmul or conv may stay) or "strict" (torch only for glue, and the
  # candidate's kernels take at least `strict_min_fraction` of the kernel time). See run/policy.py.
  policy: str = "default"
  strict_min_fraction: float = 0.5
  verdict_cache_size: int = 10_000
  use_pch: bool = True
  light_headers: bool = True
  # cuda.cu sources compiling at the same time share one translation unit, this many at most
  # (compile/batch.py); 0 or 1: each alone.
  batch_members: int = batch_lib.MAX_MEMBERS
  # cuda.cu in two halves where the cut accepts it and no batch takes it (batches come first):
  # device code by nvcc without torch, host code by g++ against a precompiled lite header
  # (compile/device_split.py); every source it refuses, and every half that fails, takes the
  # usual path. Off by default: it paid on DICE-sized kernels on an H200 box (BENCHMARKS.md),
  # which is the only workload it has been measured on there.
  compile_split: bool = False
  # With compile_split: the device halves' two preprocessing passes run on the candidate's code
  # after a snapshot of their headers' macros, checked against the usual pass (rest_preprocess.py).
  compile_split_preprocess: bool = True
  # nvcc's front ends started ahead of time on the shared headers (compile/front_ends.py), for
  # a lone compile's latency; only on a server with GPUs, never in cpu_test_mode.
  warm_front_ends: bool = True
  cpu_test_mode: bool = False  # development only: run C++-only candidates on CPU workers
  auth_token: str | None = None
  metrics_port: int | None = None
  # mTLS: the server's certificate chain and key (PEM), and the CA that signs client certificates.
  tls_cert: pathlib.Path | None = None
  tls_key: pathlib.Path | None = None
  tls_client_ca: pathlib.Path | None = None
  # Sandbox of the job children (run/sandbox.py).
  sandbox: bool = True  # False only for debugging the verifier itself (--no-sandbox)
  sandbox_strict: bool = False  # refuse to run candidates when a layer is unavailable
  sandbox_uid_base: int = 61000  # as root, slot k's children run as uid/gid base + k
  sandbox_memory_bytes: int = 0  # RLIMIT_DATA; 0: physical memory / (2 x slots), <= 32 GiB
  sandbox_file_bytes: int = 256 << 20  # RLIMIT_FSIZE
  # CUDA allocator cap of each candidate process; 0: 0.45 / slots_per_gpu. The judge process of
  # each slot (the reference's side of the trust boundary) gets the same cap: it holds the reference,
  # its inputs and outputs and the candidate's outputs it compares, and at 0.3 / 4 slots (10.5 GiB)
  # it ran out of memory on a DICE item on an H200.
  gpu_memory_fraction: float = 0.0
  # Both sides of a job time on one CPU core (run/timing.py, `timing_core`); False: wherever the
  # scheduler puts them.
  timing_core: bool = True
  verdict_store_size: int = 100_000  # verdicts kept on disk (by request id) across restarts
  # Compile stage (compile/confine.py, compile/limits.py): every compiler process sandboxed (files,
  # network, other processes) and bounded (memory, CPU time, file size, processes, output). False:
  # compilers run unconfined, for a host whose kernel cannot confine them (the server otherwise
  # refuses to start there); loudly logged, and the bounds still apply.
  compile_confine: bool = True
  compile_limits: compile_limits_lib.Limits = dataclasses.field(
      default_factory=compile_limits_lib.Limits)
  # --- the run stage at RL speed (run/budget.py, worker/process.py, service/text_key.py) ---
  # The run stage's budget scaled to the reference's measured time: at least run_budget_floor_s
  # per stretch of a job, a candidate call allowed run_budget_slowdown x the reference's until its
  # own pace is known; run_timeout_s stays the ceiling. 0: run_timeout_s alone.
  run_budget_floor_s: float = 5.0
  run_budget_slowdown: float = 20.0
  # Each worker forks the next job's pair of processes while a job runs, and lets it make its CUDA
  # contexts once that job's timing is over; a finished job's processes exit after its verdict is
  # sent (worker/pair.py). False: fork per job, reap before the verdict.
  standby_processes: bool = True
  # True: the next job's pair makes its CUDA contexts as soon as it is forked (while the running
  # job loads, checks and times), not once that job's timing is over. Off until measured on the
  # H200: the set-up left after a job is handed over (`judge_start`) was 0.49-0.50 s of a slot's
  # 2.6-2.8 s per job (BENCHMARKS.md, runs 9-12), and a context made while the slot's own judge
  # times may move that timing (other slots' jobs already overlap it).
  standby_setup_at_fork: bool = False
  # Pairs of processes each worker keeps forked ahead (each set up as above). 2: a pair has two
  # jobs' time to make its CUDA contexts, not one. Why: on an H100 (2026-12-06, BENCHMARKS.md
  # runs 17-19) a job still waited 0.47-0.52 s for its pair's set-up at 4 slots (1.68 s at 8),
  # making a context took 0.96 s with eight made at once, and a job 2.2-2.8 s. Costs two more
  # CUDA contexts per slot (GPU memory) and two more processes. Off (1) until measured on a GPU.
  standby_pairs: int = 1
  # Jobs one judge process may serve (worker/process.py): above 1, a slot keeps its judge after a
  # job the judge ran cleanly to its end (trusted/judge.py `reusable`: in step with the
  # candidate's side, device healthy, torch's globals unchanged; the candidate's process
  # reported on its own and ended OK, INCORRECT, RUNTIME_ERROR or REJECTED), so such a job makes
  # one CUDA context (the candidate's process's, which every job still gets) instead of two. Why:
  # one GPU makes ~5 contexts a second however many processes ask (H100, BENCHMARKS.md run 24),
  # which bounds pairs at ~2.6 jobs/s per GPU; kept judges ran the run stage at 2.63 jobs/s
  # against 1.73 (H100, run 25), DICE's 99 and the GPU hostile suite with unchanged outcomes.
  # A kept judge's CPU limit covers all its jobs (job_process.judge_cpu_limit). 1: a judge per
  # job (as before 2026-12-06); ignored without standby processes.
  judge_jobs: int = 64
  # True: both sides of a job warm up at once under the GPU's timing lock (the judge the
  # reference while the candidate's process the candidate), not one after the other. Neither is
  # timed then; the lock, which every job's timing queues for, is held for one warm-up instead of
  # two (0.22-0.27 s of a job's 0.5-0.6 s under it, H200 RL bursts, BENCHMARKS.md runs 9-12). Off
  # until measured on the H200 (jobs/s and DICE-99's speedups, `gpu_rl_speed.sh ... suites`).
  warmup_together: bool = False
  # True: each job process's CUDA context blocks its thread while it waits for the GPU
  # (CU_CTX_SCHED_BLOCKING_SYNC) instead of spinning a core, which CUDA does by default for a
  # process with fewer contexts than the machine has cores: every sync of both sides (the
  # correctness trials' comparisons, the timing, the profile) then leaves its core to the
  # compilers. Off until measured on a GPU (CPU per job, jobs/s, speedups: verifier_run_stage.py's
  # `blocking` variant, gpu_rl_speed.sh).
  cuda_blocking_sync: bool = False
  # CUDA_DEVICE_MAX_CONNECTIONS for every job process (0: CUDA's default, 8 work queues a
  # context). 1: a context has one hardware work queue, and the GPU makes contexts about twice as
  # fast (H100, BENCHMARKS.md run 25: 8.59 against 4.38 contexts/s with 2 made at once, 12.57
  # against 5.01 with 4; the run stage 2.85 against 1.73 jobs/s, 3.66 with kept judges). Kernels
  # a candidate launches on several streams then share one queue (a multi-stream candidate may
  # time slower than under KernelBench's harness). Off until DICE's 99 are compared with it.
  cuda_device_max_connections: int = 0
  # Verdicts kept by program (service/text_key.py: the same problem, options and candidate but
  # for comments and layout); 0: only exact resends of a request id are answered from a cache.
  program_cache_size: int = 10_000

  def __post_init__(self) -> None:
    if self.policy not in POLICIES:
      raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
    if self.standby_pairs < 1:
      raise ValueError(f"standby_pairs must be at least 1, got {self.standby_pairs}")
    if self.cuda_device_max_connections < 0:
      raise ValueError("cuda_device_max_connections must be 0 (CUDA's default) or more, got "
                       f"{self.cuda_device_max_connections}")
    if self.judge_jobs < 1:
      raise ValueError(f"judge_jobs must be at least 1, got {self.judge_jobs}")
    if not 0.0 < self.strict_min_fraction <= 1.0:
      raise ValueError(f"strict_min_fraction must be in (0, 1], got {self.strict_min_fraction}")
    self.compiler_options(gpus=False)  # the compile stage's settings are consistent

  def compiler_options(self, gpus: bool) -> compile_options_lib.CompilerOptions:
    """The compile stage's settings (raises ValueError for a contradiction, e.g. compile_split
    without light_headers). Warm front ends serve a GPU verifier's latency: a compile-only or
    cpu_test_mode server (CI, development) would only pay their start-up probe; they are also off
    where what they keep warm is (light_headers)."""
    return compile_options_lib.CompilerOptions(
        max_jobs=self.compile_workers, max_log_bytes=self.max_log_bytes, use_pch=self.use_pch,
        light_headers=self.light_headers, cache_max_bytes=self.cache_max_bytes,
        batch_members=self.batch_members, split=self.compile_split,
        split_preprocess=self.compile_split_preprocess,
        warm_front_ends=(self.warm_front_ends and gpus and not self.cpu_test_mode
                         and self.light_headers),
        limits=self.compile_limits, confine=self.compile_confine)

  @property
  def tls(self) -> bool:
    return self.tls_cert is not None

  def sandbox_spec(self, cuda_root: str) -> dict[str, Any]:
    """What each worker passes to `sandbox.Policy` (plus the CUDA allocator cap)."""
    slots = max(1, self.slots_per_gpu)
    memory = self.sandbox_memory_bytes
    if memory <= 0:
      physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
      memory = min(32 << 30, max(2 << 30, physical // (2 * slots)))
    return {"enabled": self.sandbox, "strict": self.sandbox_strict,
            "uid_base": self.sandbox_uid_base, "memory_bytes": memory,
            "cpu_s": int(2 * self.max_run_timeout_s + 60), "file_bytes": self.sandbox_file_bytes,
            "gpu_memory_fraction": self.gpu_memory_fraction or 0.45 / slots,
            "judge_gpu_memory_fraction": 0.45 / slots, "timing_core": self.timing_core,
            "standby": self.standby_processes,
            "standby_setup": "fork" if self.standby_setup_at_fork else "timed",
            "standby_pairs": self.standby_pairs, "judge_jobs": self.judge_jobs,
            "warmup_together": self.warmup_together,
            "blocking_sync": self.cuda_blocking_sync,
            "read_only": [cuda_root] if cuda_root else []}


def _precision_name(value: int) -> str:
  return enums.FP32 if value in (pb.PRECISION_UNSPECIFIED, pb.FP32) else pb.Precision.Name(value)


def resolve_options(options: pb.VerifyOptions, config: ServerConfig) -> job_lib.JobOptions:
  """The job options a worker runs with: request values, defaults for zeros, clamped."""
  pick = lambda value, default, cap: min(value, cap) if value > 0 else default
  return job_lib.JobOptions(
      precision=_precision_name(options.precision),
      num_correctness_trials=pick(options.num_correctness_trials, config.correctness_trials,
                                  config.max_correctness_trials),
      atol=options.atol if options.atol > 0 else 0.0,
      rtol=options.rtol if options.rtol > 0 else 0.0,
      skip_timing=options.skip_timing,
      num_timing_trials=pick(options.num_timing_trials, config.timing_trials,
                             config.max_timing_trials),
      compile_timeout_s=pick(options.compile_timeout_s, config.compile_timeout_s,
                             config.max_compile_timeout_s),
      run_timeout_s=pick(options.run_timeout_s, config.run_timeout_s, config.max_run_timeout_s),
      seed=options.seed or config.seed,
      plausible_speedup=config.plausible_speedup,
      policy=pb.Policy.Name(options.policy or POLICIES[config.policy]),
      min_custom_kernel_fraction=(min(options.min_custom_kernel_fraction, 1.0)
                                  if options.min_custom_kernel_fraction > 0
                                  else config.strict_min_fraction),
      budget_floor_s=config.run_budget_floor_s,
      budget_slowdown=max(0.0, config.run_budget_slowdown),
  )
