"""The body of `dice eval` once its arguments are checked (the parser is dice_jax/cli/eval.py, which
imports this only when the command runs, so `dice --help` stays fast)."""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.cli import sampling
from dice_jax.cli.exit_codes import Exit
from dice_jax.data import prompts
from dice_jax.data.problems import ProblemLoadError, load_problems
from dice_jax.eval import compare as compare_lib
from dice_jax.eval import generations as gen_lib
from dice_jax.eval import pipeline
from dice_jax.eval import report
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.defaults import EVALUATION
from dice_jax.verifier.options import verify_options


def _error(message: str, code: int = Exit.USAGE) -> int:
  print(f"dice eval: error: {message}", file=sys.stderr)
  return code


def _progress(console: Console) -> Progress:
  return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console)


def default_out(args: argparse.Namespace) -> pathlib.Path:
  stem = re.sub(r"[^A-Za-z0-9._-]+", "-", pathlib.Path(args.problems.replace(":", "-")).stem)
  if args.model:
    source = pathlib.Path(args.model).resolve().name
  elif args.generations:
    source = pathlib.Path(args.generations).resolve().name
  else:
    source = "reference"
  return pathlib.Path("runs") / "eval" / f"{stem}-{source}"


def _template(path: str | None, default: prompts.PromptTemplate) -> prompts.PromptTemplate:
  return prompts.PromptTemplate.from_yaml(path) if path else default


def _model_source(args: argparse.Namespace):
  """`--model`'s sampling (dice_jax.eval.model_samples, imported only here: it loads JAX)."""
  from dice_jax.eval import model_samples  # pylint: disable=import-outside-toplevel
  return model_samples.ModelSource(
      model_dir=args.model, samples=args.samples, decode=sampling.from_args(args, greedy=args.samples == 1),
      seed=args.seed,
      batch_size=args.batch_size,
      infilling_template=_template(args.template_infilling, prompts.INFILLING),
      end_to_end_template=_template(args.template_end_to_end, prompts.END_TO_END))


def evaluate(args: argparse.Namespace) -> int:
  progress_console, console = Console(stderr=True), report.stdout_console()
  try:
    problems = load_problems(args.problems)
    if args.level:
      problems = [p for p in problems if p.level in set(args.level)]
    if args.limit is not None:
      problems = problems[:args.limit]
    if not problems:
      return _error("no problems left after --level/--limit")
    mode = gen_lib.resolve_mode(problems, args.mode)
    source = _model_source(args) if args.model else None
  except (ProblemLoadError, ValueError) as e:
    return _error(str(e))
  out = args.out or default_out(args)
  args.resolved_out = out
  out.mkdir(parents=True, exist_ok=True)
  options = verify_options(precision=args.precision, trials=args.trials, atol=args.atol, rtol=args.rtol,
                           skip_timing=args.skip_timing, policy=args.policy)
  try:
    if args.reference_generations:
      gen_lib.write_reference_generations(out / "generations", problems)
    gens_dir = pathlib.Path(args.generations) if args.generations else out / "generations"
    if args.generations:  # cheap layout errors before anything is started
      gen_lib.read_generations(gens_dir, problems, allow_missing=args.allow_missing)
  except (gen_lib.GenerationsError, ValueError) as e:
    return _error(str(e))
  try:
    connection = connect_lib.connect(
        args.verifier, use=EVALUATION, connect_timeout_s=args.connect_timeout,
        request_timeout_s=args.request_timeout, auth_token_file=args.auth_token_file,
        local_log=out / "verifier.log")
  except connect_lib.UNAVAILABLE as e:
    return _error(str(e), Exit.VERIFIER)
  except ValueError as e:
    return _error(str(e))
  try:
    progress_console.print(f"verifier: {connection.describe()}")
    if source is not None:
      with _progress(progress_console) as progress:
        task = progress.add_task("generating", total=None)
        made = source.generate_missing(
            gens_dir, problems, mode,
            on_batch=lambda done, total: progress.update(task, completed=done, total=total))
      progress_console.print(f"generated {made} sample(s) into {gens_dir}")
    gens = gen_lib.read_generations(gens_dir, problems, allow_missing=args.allow_missing)
    scored = [p for p in problems if p.id in gens]
    run_info = {"name": args.name or out.name, "problems_source": args.problems,
                "generations": str(gens_dir), "model": args.model,
                "sampling": (f"{source.samples} sample(s) per problem, {source.decode.describe()}"
                             if source else None)}
    with _progress(progress_console) as progress:
      task = progress.add_task("verifying", total=None)
      outcome = pipeline.run_eval(
          out, scored, gens, connection, mode=mode, options=options, run_info=run_info,
          on_plan=lambda plan: progress.update(task, total=len(plan.pending)),
          on_verdict=lambda s, v: progress.update(
              task, advance=1, description=f"{s.problem.id}/{s.generation.sample}: "
                                           f"{pb.Outcome.Name(v.outcome)}"),
          make_plots=not args.no_plots)
  except (gen_lib.GenerationsError, ValueError, FileNotFoundError) as e:
    return _error(str(e))
  finally:
    connection.close()
  summary = outcome.summary
  console.print(report.console_table(summary))
  for note in summary["notes"]:
    console.print(f"[bold]Note:[/bold] {note}")
  console.print(f"{outcome.sent} candidate(s) verified now, {outcome.from_store} from earlier runs; "
                f"results in {out}/ (summary.json, summary.md, problems/, "
                f"{'plots' if outcome.plots else 'no plots'})")
  return Exit.VERIFIER if outcome.infra else Exit.OK


def compare(args: argparse.Namespace) -> int:
  try:
    result = compare_lib.compare(*args.compare)
  except ValueError as e:
    return _error(str(e))
  console = report.stdout_console()
  console.print(compare_lib.console_table(result))
  for warning in result["warnings"]:
    console.print(f"[bold]Warning:[/bold] {warning}")
  if args.out:
    compare_lib.write_outputs(args.out, result)
    console.print(f"written: {args.out}/compare.json, compare.md, compare_fast_p.png")
  return Exit.OK
