"""`dice-verifier`: run the gRPC server, or check candidates locally or against a running server.

  dice-verifier serve --listen 127.0.0.1:50051 [--gpus 0,1] [--slots-per-gpu N] ...
  dice-verifier check REFERENCE.py CANDIDATE.py [CANDIDATE.py ...] [--json]
  dice-verifier check --server HOST:PORT [--auth-token-file F] [--tls-ca CA.pem] REFERENCE.py CANDIDATE.py

Exit codes of `check` (the worst verdict decides):
  0  every candidate OK
  1  at least one candidate failed (COMPILE_ERROR, INCORRECT, RUNTIME_ERROR, TIMEOUT, REJECTED)
  2  bad command line, unreadable reference, or an unreadable candidate file (that file gets its own
     row; the others are verified), unless 4 applies
  3  nothing failed, but at least one verdict is NO_GPU (compiled; not run: no GPU here)
  4  the reference is unusable (BAD_REFERENCE), the verifier failed (INFRA_ERROR), or the
     --server cannot be reached or refused the credentials
Exit codes of `serve`: 0 stopped (SIGINT/SIGTERM, or end of stdin with --stop-on-stdin-eof) after
draining; 2 bad command line, unreadable files, or a --listen/--metrics-port that cannot be bound
(one line on stderr, nothing started); 130 interrupted during start-up.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import sys
import time
import uuid

from google.protobuf import json_format

from dice.verifier.v1 import verifier_pb2 as pb

from verifier_service.compile import cache as compile_cache
from verifier_service.compile import confine as confine_lib
from verifier_service.compile import limits as limits_lib
from verifier_service.service import config as config_lib
from verifier_service.service import logs
from verifier_service.service import remote

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_INFRA, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
_CANDIDATE_FAILURES = (pb.COMPILE_ERROR, pb.INCORRECT, pb.RUNTIME_ERROR, pb.TIMEOUT, pb.REJECTED)


def _gpu_list(text: str) -> list[int]:
  try:
    return [int(x) for x in text.split(",") if x.strip()]
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"--gpus takes indices like 0,1 (got {text!r})") from e


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError("must be at least 1")
  return value


def _add_common(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:  # pylint: disable=protected-access
  defaults = config_lib.ServerConfig()
  parser.add_argument("--gpus", type=_gpu_list, default=None,
                      help="GPU indices to use, e.g. 0,1 (default: every GPU nvidia-smi lists)")
  parser.add_argument("--slots-per-gpu", type=_positive, default=defaults.slots_per_gpu,
                      help="worker processes per GPU, each running one candidate at a time "
                           "(default %(default)s)")
  parser.add_argument("--compile-workers", type=_positive, default=defaults.compile_workers,
                      help="concurrent compiler processes (default: CPU count, %(default)s)")
  parser.add_argument("--cache-dir", type=pathlib.Path, default=defaults.cache_dir,
                      help="compile cache and precompiled headers (default %(default)s; "
                           "$DICE_VERIFIER_CACHE overrides)")
  parser.add_argument("--cache-max-bytes", type=compile_cache.parse_size, metavar="SIZE",
                      default=defaults.cache_max_bytes,
                      help="prune the cache folder's least recently used entries beyond SIZE, "
                           "e.g. 4G (default 10G; 0: unbounded)")
  parser.add_argument("--compile-timeout", type=float, default=defaults.compile_timeout_s,
                      help="default compile-stage limit in seconds (default %(default)s)")
  parser.add_argument("--run-timeout", type=float, default=defaults.run_timeout_s,
                      help="default limit in seconds for load + correctness + timing "
                           "(default %(default)s)")
  parser.add_argument("--no-pch", action="store_true",
                      help="do not use precompiled torch headers for main.cpp")
  parser.add_argument("--no-light-headers", action="store_true",
                      help="compile sources with the torch headers as written (no lighter "
                           "header tiers)")
  parser.add_argument("--batch-members", type=int, default=defaults.batch_members,
                      help="cuda.cu sources compiled at once share one translation unit, up to "
                           "this many (0 or 1: each alone; default %(default)s)")
  parser.add_argument("--compile-split", action="store_true",
                      help="build cuda.cu in two halves where the cut accepts it and no batch "
                           "takes it (device code by nvcc without torch, host code by g++; the "
                           "usual path otherwise)")
  parser.add_argument("--cpu-test-mode", action="store_true",
                      help="DEVELOPMENT ONLY: run candidates whose load_inline has only C++ "
                           "sources on CPU workers (exercises the worker without a GPU; proves "
                           "nothing about CUDA kernels)")
  parser.add_argument("--no-sandbox", action="store_true",
                      help="DEBUGGING ONLY: run candidates without the sandbox (namespaces, "
                           "uid drop, Landlock, seccomp, rlimits)")
  parser.add_argument("--sandbox-strict", action="store_true",
                      help="refuse to run candidates when a sandbox layer is unavailable on "
                           "this host (default: run with the layers that work, and log the rest)")
  parser.add_argument("--sandbox-uid-base", type=int, default=defaults.sandbox_uid_base,
                      help="as root, worker slot k runs candidates as uid/gid BASE+k "
                           "(default %(default)s)")
  parser.add_argument("--sandbox-memory", type=int, default=0, metavar="BYTES",
                      help="host memory (RLIMIT_DATA) per candidate; default: physical memory / "
                           "(2 x slots), at most 32 GiB")
  parser.add_argument("--gpu-memory-fraction", type=float, default=0.0,
                      help="CUDA allocator cap per candidate process as a fraction of the GPU; "
                           "default 0.45 / --slots-per-gpu (each slot's judge process, which runs "
                           "the reference, gets 0.45 / --slots-per-gpu too)")
  parser.add_argument("--compile-unconfined", action="store_true",
                      help="compile without the compile stage's sandbox, on a host whose kernel "
                           "lacks Landlock, seccomp or namespaces (the server otherwise refuses to "
                           "start there): compilers then read any file this server can and reach "
                           "the network; the bounds below still apply")
  parser.add_argument("--compile-memory", type=compile_cache.parse_size, metavar="SIZE",
                      default=defaults.compile_limits.memory_bytes,
                      help="memory per compiler process (and per process tree where cgroup v2 "
                           "allows); a compile over it is the candidate's COMPILE_ERROR (default "
                           f"{compile_cache.format_size(defaults.compile_limits.memory_bytes)})")
  parser.add_argument("--compile-cpu", type=_positive, metavar="SECONDS",
                      default=defaults.compile_limits.cpu_s,
                      help="CPU seconds per compiler process; a compile over it is the "
                           "candidate's TIMEOUT (default %(default)s)")
  parser.add_argument("--no-timing-core", action="store_true",
                      help="time each side wherever the OS schedules it (default: both sides of a "
                           "job time on one CPU core per GPU, the last ones)")


def _add_logging(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--log-level", default="WARNING",
                      help="DEBUG, INFO, WARNING or ERROR (default %(default)s)")
  parser.add_argument("--plain-logs", action="store_true",
                      help="human-readable log lines (the same fields as key=value) instead of JSON lines")


def _config(args: argparse.Namespace, **extra) -> config_lib.ServerConfig:
  return config_lib.ServerConfig(
      gpus=args.gpus, slots_per_gpu=args.slots_per_gpu, compile_workers=args.compile_workers,
      cache_dir=args.cache_dir, cache_max_bytes=args.cache_max_bytes,
      compile_timeout_s=args.compile_timeout,
      run_timeout_s=args.run_timeout, use_pch=not args.no_pch,
      light_headers=not args.no_light_headers, batch_members=args.batch_members,
      compile_split=args.compile_split, cpu_test_mode=args.cpu_test_mode,
      sandbox=not args.no_sandbox, sandbox_strict=args.sandbox_strict,
      sandbox_uid_base=args.sandbox_uid_base, sandbox_memory_bytes=args.sandbox_memory,
      gpu_memory_fraction=args.gpu_memory_fraction, timing_core=not args.no_timing_core,
      compile_confine=not args.compile_unconfined, compile_limits=dataclasses.replace(
          limits_lib.Limits(), memory_bytes=args.compile_memory, cpu_s=args.compile_cpu),
      **extra)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="dice-verifier", description="Compile, check and time KernelBench-format CUDA "
      "candidates.", epilog=__doc__.split("\n\n", 2)[2],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)

  serve = sub.add_parser("serve", help="run the gRPC verifier server",
                         description="Serve dice.verifier.v1.Verifier with health checking, "
                         "reflection and Prometheus metrics.")
  serve.add_argument("--listen", default="127.0.0.1:50051",
                     help="HOST:PORT to bind (default %(default)s)")
  serve.add_argument("--queue-capacity", type=_positive, default=256,
                     help="requests waiting or running before RESOURCE_EXHAUSTED "
                          "(default %(default)s)")
  serve.add_argument("--auth-token-file", type=pathlib.Path, default=None,
                     help="file holding a bearer token clients must send as "
                          "'authorization: Bearer <token>'; required beyond loopback")
  serve.add_argument("--tls-cert", type=pathlib.Path, default=None,
                     help="PEM certificate chain the server presents (mTLS; with --tls-key and "
                          "--tls-client-ca)")
  serve.add_argument("--tls-key", type=pathlib.Path, default=None,
                     help="PEM private key of --tls-cert")
  serve.add_argument("--tls-client-ca", type=pathlib.Path, default=None,
                     help="PEM CA certificate(s); only clients with a certificate it signed may "
                          "connect")
  serve.add_argument("--insecure-public", "--insecure", dest="insecure", action="store_true",
                     help="allow listening beyond loopback with neither a token nor mTLS")
  serve.add_argument("--no-warm-front-ends", action="store_true",
                     help="do not start nvcc's front ends ahead of time on the shared headers "
                          "(on by default with GPUs: they cut a lone compile's latency; each "
                          "holds up to ~1.5 GB)")
  serve.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics over HTTP on this port")
  serve.add_argument("--policy", choices=sorted(config_lib.POLICIES), default="default",
                     help="partial-replacement policy for requests that do not name one: default (as "
                          "KernelBench and DICE: a kept torch matmul or conv beside the candidate's own "
                          "kernels is fine) or strict (torch compute in forward, or the candidate's kernels "
                          "under --strict-min-fraction of the GPU time, is TORCH_FALLBACK)")
  serve.add_argument("--strict-min-fraction", type=float, default=0.5,
                     help="strict policy: the least share of GPU time in the candidate's own kernels "
                          "(default %(default)s)")
  serve.add_argument("--stop-on-stdin-eof", action="store_true",
                     help="drain and exit when standard input reaches end of file: a parent that "
                          "holds the other end of a pipe ties the server's life to its own (the "
                          "loopback verifier of `dice train/eval/generate --verifier local` does)")
  defaults = config_lib.ServerConfig()
  serve.add_argument("--run-budget-floor", type=float, default=defaults.run_budget_floor_s,
                     help="seconds every stretch of a job's run stage may take at least; the rest "
                          "of its budget is scaled to the reference's measured time, then to the "
                          "candidate's own pace, never past --run-timeout (default %(default)s)")
  serve.add_argument("--run-budget-slowdown", type=float, default=defaults.run_budget_slowdown,
                     help="a candidate call may take this many times the reference's before its "
                          "own pace is known; 0: no scaled budget, --run-timeout alone "
                          "(default %(default)s)")
  serve.add_argument("--no-standby", action="store_true",
                     help="fork each job's processes when the job comes and wait for their exits "
                          "before its verdict (default: the next job's are forked and set up while "
                          "a job runs, and exits come after the verdict)")
  serve.add_argument("--standby-pairs", type=int, default=1,
                     help="pairs of job processes each GPU worker keeps forked ahead (2: each "
                          "has two jobs' time to make its CUDA contexts; experimental: not yet "
                          "measured on a GPU)")
  serve.add_argument("--judge-jobs", type=int, default=defaults.judge_jobs,
                     help="jobs one judge process may serve: above 1, a slot keeps its judge "
                          "after a job it ran cleanly, and such a job makes one CUDA context, "
                          "not two (each candidate still gets a process of its own); 1: a judge "
                          "per job; ignored with --no-standby (default %(default)s)")
  serve.add_argument("--cuda-device-max-connections", type=int,
                     default=defaults.cuda_device_max_connections,
                     help="CUDA_DEVICE_MAX_CONNECTIONS for every job process: 1 makes CUDA "
                          "contexts about twice as fast (streams then share one work queue); "
                          "0: CUDA's default (default %(default)s)")
  serve.add_argument("--standby-setup-at-fork", action="store_true",
                     help="the next job's processes make their CUDA contexts as soon as they are "
                          "forked, not once the running job's timing is over (experimental: "
                          "not yet measured on a GPU)")
  serve.add_argument("--warmup-together", action="store_true",
                     help="both sides of a job warm up at once under the GPU's timing lock, not "
                          "one after the other (experimental: not yet measured on a GPU)")
  serve.add_argument("--cuda-blocking-sync", action="store_true",
                     help="job processes block while they wait for the GPU instead of spinning a "
                          "core (experimental: the median speedup moved 9%% in one H100 round)")
  serve.add_argument("--program-cache-size", type=int, default=defaults.program_cache_size,
                     help="verdicts kept by program, so the same candidate for the same problem, "
                          "comments and layout aside, is answered without running again "
                          "(0: off; default %(default)s)")
  _add_common(serve)
  _add_logging(serve)

  check = sub.add_parser("check", help="verify candidates locally (no server), or on a running server",
                         description="One verdict per candidate against one reference: verified here "
                         "(this machine's GPUs, or compile-only without one), or by a running "
                         "`dice-verifier serve` with --server.")
  check.add_argument("reference", type=pathlib.Path, help="reference problem (Model, "
                     "get_inputs, get_init_inputs)")
  check.add_argument("candidates", type=pathlib.Path, nargs="+",
                     help="candidate files (ModelNew + load_inline)")
  check.add_argument("--json", action="store_true",
                     help="print verdicts as JSON (one object, or a list for several); each carries "
                          "the Verdict fields plus 'candidate', the file as given")
  check.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32",
                     help="floating precision of inputs and modules (default %(default)s)")
  check.add_argument("--trials", type=_positive, default=5,
                     help="correctness trials with fresh seeds (default %(default)s)")
  check.add_argument("--timing-trials", type=_positive, default=100,
                     help="timed calls per side (default %(default)s)")
  check.add_argument("--skip-timing", action="store_true", help="correctness only")
  check.add_argument("--atol", type=float, default=0.0,
                     help="absolute tolerance (default: 1e-4 fp32, 1e-2 fp16/bf16)")
  check.add_argument("--rtol", type=float, default=0.0,
                     help="relative tolerance (default: as --atol)")
  check.add_argument("--seed", type=int, default=42, help="base seed (default %(default)s)")
  check.add_argument("--policy", choices=sorted(config_lib.POLICIES), default=None,
                     help="partial-replacement policy: default or strict (see `serve --help`); "
                          "unset: the server's (a local check's: default)")
  check.add_argument("--strict-min-fraction", type=float, default=0.0,
                     help="strict policy: the least share of GPU time in the candidate's own kernels "
                          "(0: the server's, 0.5 for a local check)")
  _add_logging(check)
  on = check.add_argument_group("verifying on a running server")
  on.add_argument("--server", metavar="HOST:PORT",
                  help="send the candidates to this `dice-verifier serve` (or any gRPC target, e.g. "
                       "dns:///verifier.example:50051) instead of verifying here")
  on.add_argument("--auth-token-file", type=pathlib.Path, default=None,
                  help="file holding the server's bearer token (its `serve --auth-token-file`)")
  on.add_argument("--tls", action="store_true",
                  help="speak TLS, checking the server's certificate against the system's roots")
  on.add_argument("--tls-ca", type=pathlib.Path, default=None, metavar="PEM",
                  help="TLS, checking the server's certificate against this CA (implies --tls)")
  on.add_argument("--tls-cert", type=pathlib.Path, default=None, metavar="PEM",
                  help="mTLS: our client certificate chain (with --tls-key; implies --tls)")
  on.add_argument("--tls-key", type=pathlib.Path, default=None, metavar="PEM",
                  help="mTLS: the private key of --tls-cert")
  on.add_argument("--tls-server-name", default=None, metavar="NAME",
                  help="the name expected in the server's certificate (default: the host of --server)")
  on.add_argument("--connect-timeout", type=float, default=10.0,
                  help="seconds to reach the server and get its info (default %(default)s)")
  on.add_argument("--timeout", type=float, default=1800.0,
                  help="seconds from sending a candidate to its verdict (default %(default)s)")
  _add_common(check.add_argument_group("verifying here (not with --server)"))
  compile_cache.add_parser(sub, config_lib.ServerConfig().cache_dir)
  return parser


_REMOTE_ONLY = ("auth_token_file", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name")
_LOCAL_ONLY = ("gpus", "slots_per_gpu", "compile_workers", "cache_dir", "cache_max_bytes",
               "compile_timeout", "run_timeout", "no_pch", "no_light_headers", "batch_members",
               "compile_split", "cpu_test_mode", "no_sandbox", "sandbox_strict",
               "sandbox_uid_base", "sandbox_memory", "gpu_memory_fraction",
               "compile_unconfined", "compile_memory", "compile_cpu")


def _misplaced(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
  """Why the chosen `check` flags do not fit together ("" when they do)."""
  sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # pylint: disable=protected-access
  check = sub.choices["check"]
  flags = {a.dest: a.option_strings[0] for a in check._actions if a.option_strings}  # pylint: disable=protected-access
  changed = lambda names: [flags[n] for n in names if getattr(args, n) != check.get_default(n)]
  if args.server:
    wrong = changed(_LOCAL_ONLY)
    return f"{', '.join(wrong)}: options of a local check; with --server the server's own apply" if wrong else ""
  wrong = changed(_REMOTE_ONLY)
  return f"{', '.join(wrong)}: only with --server HOST:PORT" if wrong else ""


def _read(path: pathlib.Path) -> str:
  try:
    return path.read_bytes().decode("utf-8")
  except OSError as e:
    raise SystemExit(_usage_error(f"cannot read {path}: {e.strerror}")) from None
  except UnicodeDecodeError as e:
    raise SystemExit(_usage_error(f"{path} is not UTF-8 text: {e}")) from None


def _read_candidate(path: pathlib.Path) -> tuple[str | None, str]:
  """(text, "") or (None, why it cannot be verified): one bad file does not stop the others."""
  try:
    return path.read_bytes().decode("utf-8"), ""
  except OSError as e:
    return None, f"cannot read {path}: {e.strerror}"
  except UnicodeDecodeError as e:
    return None, f"{path} is not UTF-8 text: {e}"


def _usage_error(message: str) -> int:
  print(f"dice-verifier: error: {message}", file=sys.stderr)
  return EXIT_USAGE


def exit_code(verdicts: list[pb.Verdict]) -> int:
  outcomes = {v.outcome for v in verdicts}
  if outcomes & {pb.BAD_REFERENCE, pb.INFRA_ERROR}:
    return EXIT_INFRA
  if outcomes & set(_CANDIDATE_FAILURES):
    return EXIT_FAILED
  if pb.NO_GPU in outcomes:
    return EXIT_NO_GPU
  return EXIT_OK


def _precheck(request: pb.VerifyRequest, config: config_lib.ServerConfig) -> pb.Verdict | None:
  """The verdict of a request no verifier would take (empty or oversized source), worded as the
  trainer's client words it (dice_jax.verifier.client), so `check` and the client agree."""
  from verifier_service.service import server as server_lib  # pylint: disable=import-outside-toplevel
  error = server_lib.validate(request, config)
  if not error:
    return None
  outcome = pb.BAD_REFERENCE if error.startswith("reference_source") else pb.REJECTED
  return pb.Verdict(request_id=request.request_id, outcome=outcome, stage=pb.STAGE_PARSE, message=error)


async def _verify_all(paths: list[pathlib.Path], requests: list[pb.VerifyRequest], verify,
                      limits: config_lib.ServerConfig, compiler=None) -> list[pb.Verdict]:
  """Every request through `verify` (a coroutine function), concurrently, with a progress bar;
  a local `compiler`'s steps show in it (first runs build headers: minutes)."""
  from rich.console import Console  # pylint: disable=import-outside-toplevel
  from rich.progress import (BarColumn, Progress, SpinnerColumn,  # pylint: disable=import-outside-toplevel
                             TextColumn, TimeElapsedColumn)
  console, started = Console(stderr=True), time.monotonic()
  with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                console=console, transient=len(requests) == 1) as progress:
    bar = progress.add_task("verifying", total=len(requests))

    def show(event) -> None:
      progress.update(bar, description=event.text)
      if not console.is_terminal:  # a pipe or a log: a line per step instead of a live bar
        console.print(f"[{time.monotonic() - started:6.1f} s] {event.text}", markup=False,
                      highlight=False, soft_wrap=True)

    if compiler is not None:
      compiler.on_progress = show

    async def one(path: pathlib.Path, request: pb.VerifyRequest) -> pb.Verdict:
      verdict = _precheck(request, limits) or await verify(request)
      progress.advance(bar)
      progress.update(bar, description=f"{path.name}: {pb.Outcome.Name(verdict.outcome)}")
      return verdict

    return list(await asyncio.gather(*(one(p, r) for p, r in zip(paths, requests))))


def _remote_settings(args: argparse.Namespace) -> remote.RemoteSettings:
  return remote.RemoteSettings(
      target=args.server, auth_token_file=args.auth_token_file, tls=args.tls, tls_ca=args.tls_ca,
      tls_cert=args.tls_cert, tls_key=args.tls_key, tls_server_name=args.tls_server_name,
      connect_timeout_s=args.connect_timeout, request_timeout_s=args.timeout)


async def _check(args: argparse.Namespace) -> list[pb.Verdict | str]:
  """One result per candidate file, in order: its verdict, or why the file could not be read."""
  reference = _read(args.reference)
  read = [_read_candidate(path) for path in args.candidates]
  for (_, error) in read:
    if error:
      print(f"dice-verifier: error: {error}", file=sys.stderr)
  readable = [(path, text) for path, (text, _) in zip(args.candidates, read) if text is not None]
  verdicts = iter(await _check_readable(args, reference, readable) if readable else [])
  return [error or next(verdicts) for _, error in read]


async def _check_readable(args: argparse.Namespace, reference: str,
                          candidates: list[tuple[pathlib.Path, str]]) -> list[pb.Verdict]:
  paths = [path for path, _ in candidates]
  options = pb.VerifyOptions(
      precision=pb.Precision.Value(args.precision.upper()), num_correctness_trials=args.trials,
      atol=args.atol, rtol=args.rtol, skip_timing=args.skip_timing,
      num_timing_trials=args.timing_trials, seed=args.seed,
      policy=config_lib.POLICIES[args.policy] if args.policy else pb.POLICY_UNSPECIFIED,
      min_custom_kernel_fraction=args.strict_min_fraction)
  run_id = uuid.uuid4().hex[:12]  # a fresh verdict every run, never one stored by an earlier check
  requests = [pb.VerifyRequest(request_id=f"check:{run_id}:{i}", candidate_source=source,
                               reference_source=reference, options=options)
              for i, (_, source) in enumerate(candidates)]
  if args.server:
    async with remote.RemoteVerifier(_remote_settings(args)) as server:
      print(remote.describe(args.server, server.info), file=sys.stderr)
      limits = config_lib.ServerConfig(max_source_bytes=server.info.max_source_bytes or (1 << 20))
      return await _verify_all(paths, requests, server.verify, limits)
  from verifier_service.service import scheduler as scheduler_lib  # pylint: disable=import-outside-toplevel
  config = _config(args, warm_front_ends=False)  # one-off: nothing to start ahead for
  scheduler = scheduler_lib.Scheduler.create(config)
  await scheduler.start()
  try:
    return await _verify_all(paths, requests, scheduler.verify, config, scheduler.compiler)
  finally:
    await scheduler.stop()


def _summary(paths: list[pathlib.Path], verdicts: list[pb.Verdict | str]) -> None:
  from rich.console import Console  # pylint: disable=import-outside-toplevel
  from rich.table import Table  # pylint: disable=import-outside-toplevel
  table = Table(title="dice-verifier check")
  for column in ("candidate", "outcome", "stage", "compile s", "speedup"):
    table.add_column(column, no_wrap=True)
  table.add_column("message", overflow="fold")
  for path, v in zip(paths, verdicts):
    if isinstance(v, str):  # the file could not be read
      table.add_row(path.name, "UNREADABLE", "-", "-", "-", v[:160])
      continue
    compile_s = next((t.duration_s for t in v.stage_timings if t.stage == pb.STAGE_COMPILE), 0.0)
    speedup = f"{v.timing.speedup:.2f}x" if v.HasField("timing") else "-"
    table.add_row(path.name, pb.Outcome.Name(v.outcome), pb.Stage.Name(v.stage).removeprefix(
        "STAGE_"), f"{compile_s:.1f}" + (" (cached)" if v.compile.cache_hit else ""), speedup,
                  v.message[:160])
  console = Console()
  if not console.is_terminal:
    console = Console(width=160)  # a pipe or a log file: do not fold at 80 columns
  console.print(table)


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command == "cache":
    return compile_cache.run(args)
  logs.setup(args.log_level.upper(), json_lines=not args.plain_logs)
  if args.command == "serve":
    from verifier_service.service import server  # pylint: disable=import-outside-toplevel
    token = None
    if args.auth_token_file is not None:
      token = _read(args.auth_token_file).strip()
      if not token:
        return _usage_error(f"{args.auth_token_file} is empty")
    config = _config(args, listen=args.listen, queue_capacity=args.queue_capacity,
                     auth_token=token, metrics_port=args.metrics_port, tls_cert=args.tls_cert,
                     tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, policy=args.policy,
                     strict_min_fraction=args.strict_min_fraction,
                     warm_front_ends=not args.no_warm_front_ends,
                     run_budget_floor_s=args.run_budget_floor,
                     run_budget_slowdown=args.run_budget_slowdown,
                     standby_processes=not args.no_standby,
                     standby_setup_at_fork=args.standby_setup_at_fork,
                     standby_pairs=args.standby_pairs, judge_jobs=args.judge_jobs,
                     cuda_device_max_connections=args.cuda_device_max_connections,
                     warmup_together=args.warmup_together,
                     cuda_blocking_sync=args.cuda_blocking_sync,
                     program_cache_size=args.program_cache_size)
    try:
      asyncio.run(server.serve(config, insecure=args.insecure, stop_on_stdin_eof=args.stop_on_stdin_eof))
    except (ValueError, server.BindError, confine_lib.ConfinementError) as e:
      return _usage_error(str(e))
    except KeyboardInterrupt:  # Ctrl-C during start-up, before the signal handlers are installed
      return EXIT_INTERRUPTED
    return EXIT_OK
  misplaced = _misplaced(parser, args)
  if misplaced:
    return _usage_error(misplaced)
  try:
    results = asyncio.run(_check(args))
  except ValueError as e:  # unreadable credentials, an empty token
    return _usage_error(str(e))
  except confine_lib.ConfinementError as e:  # this host cannot confine the compile stage
    print(f"dice-verifier: {e}", file=sys.stderr)
    return EXIT_INFRA
  except remote.RemoteError as e:
    print(f"dice-verifier: {e}", file=sys.stderr)
    return EXIT_INFRA
  if args.json:
    dicts = [{"candidate": str(path), "error": v} if isinstance(v, str) else
             {"candidate": str(path), **json_format.MessageToDict(v, preserving_proto_field_name=True)}
             for path, v in zip(args.candidates, results)]
    print(json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=1))
  else:
    _summary(args.candidates, results)
  verdicts = [v for v in results if not isinstance(v, str)]
  code = exit_code(verdicts)
  return EXIT_USAGE if len(verdicts) < len(results) and code != EXIT_INFRA else code


if __name__ == "__main__":
  sys.exit(main())
