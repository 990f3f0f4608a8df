"""The body of `dice generate` once its arguments are checked (the parser is dice_jax/cli/generate.py,
which imports this only when the command runs, so `dice --help` stays fast)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

from dice_jax.cli import sampling
from dice_jax.cli.exit_codes import Exit
from dice_jax.data import prompts
from dice_jax.eval import records
from dice_jax.eval import report
from dice_jax.generation import arch as arch_lib
from dice_jax.generation.generator import DESCRIPTION, GenerationResult, KernelGenerator, read_reference
from dice_jax.generation.ranking import Candidate
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.options import verify_options


def _error(message: str, code: int = Exit.USAGE) -> int:
  print(f"dice generate: error: {message}", file=sys.stderr)
  return code


def outcome_text(c: Candidate, result: GenerationResult) -> str:
  """The outcome column: never "verified" for what could not be checked."""
  if not result.correctness_available and c.compiled and c.outcome in ("NO_GPU", "BAD_REFERENCE"):
    return "compiled (unverified)"
  return c.outcome


def table(result: GenerationResult) -> Table:
  title = ("candidates, best first" if result.correctness_available else
           "candidates, best first — compile-only, NOTHING IS VERIFIED")
  t = Table(title=title)
  for column in ("candidate", "outcome", "max error", "speedup", "message"):
    t.add_column(column, justify="right" if column in ("max error", "speedup") else "left")
  for c in result.candidates:
    error = c.max_abs_error
    marker = " *" if c is result.best else ""
    t.add_row(c.name + marker, outcome_text(c, result), "-" if error is None else f"{error:.2e}",
              "-" if c.speedup is None else f"{c.speedup:.2f}x", c.verdict.message[:120])
  return t


def result_json(result: GenerationResult) -> dict[str, Any]:
  return {"mode": result.mode, "arch": result.arch, "precision": result.precision,
          "verified": result.verified, "correctness_available": result.correctness_available,
          "best": None if result.best is None else result.best.name, "notes": result.notes,
          "messages": result.messages,
          "candidates": [{"name": c.name, "origin": c.origin, "index": c.index,
                          **records.compact(c.verdict), "source": c.source, "completion": c.completion,
                          "verdict": records.to_dict(c.verdict)} for c in result.candidates]}


def generate(args: argparse.Namespace, injected: list[str]) -> int:
  progress_console, console = Console(stderr=True), report.stdout_console()
  try:
    reference = read_reference(args.reference) if args.reference is not None else None
    template = prompts.PromptTemplate.from_yaml(args.template) if args.template else None
    decode = sampling.from_args(args)
    options = verify_options(precision=args.precision, trials=args.trials, atol=args.atol, rtol=args.rtol)
    if args.arch is not None:
      arch_lib.parse(args.arch)
    kwargs = {}
    if template is not None:
      kwargs["template" if args.reference else "description_template"] = template
  except (ValueError, FileNotFoundError) as e:
    return _error(str(e))
  gen = None
  try:  # one try/finally from the start: an interruption anywhere still stops a local verifier
    try:
      with progress_console.status("connecting to the verifier and loading the model"):
        gen = KernelGenerator(args.model, verifier=args.verifier, arch=args.arch,
                              precision=args.precision, decode=decode, options=options,
                              connect_timeout_s=args.connect_timeout, **kwargs)
    except connect_lib.UNAVAILABLE as e:
      return _error(str(e), Exit.VERIFIER)
    progress_console.print(f"verifier: {gen.connection.describe()}; target "
                           f"{arch_lib.describe(gen.arch)}, {gen.precision}")
    total = args.samples + len(injected)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=progress_console) as progress:
      task = progress.add_task(f"sampling {args.samples} candidate(s)", total=total)
      result = gen.generate(
          reference, description=args.description, num_samples=args.samples,
          extra_candidates=injected, seed=args.seed,
          on_sampled=lambda: progress.update(task, description="verifying"),
          on_verdict=lambda c: progress.update(task, advance=1,
                                               description=f"{c.name}: {c.outcome}"))
  except (ValueError, FileNotFoundError) as e:
    return _error(str(e))
  finally:
    if gen is not None:
      gen.close()
  console.print(table(result))
  for note in result.notes:
    console.print(f"[bold]Note:[/bold] {note}")
  if args.report:
    report.write_json(args.report, result_json(result))
  winner, verified = result.winner()
  if winner is None:
    console.print("nothing written: " + ("no candidate was proven correct"
                                         if result.correctness_available else "no candidate compiled"))
    return Exit.VERIFIER if all(c.outcome == "INFRA_ERROR" for c in result.candidates) else Exit.NONE_CORRECT
  path = result.write(args.out)
  if verified:
    speed = f"{winner.speedup:.2f}x faster than PyTorch" if winner.speedup else "untimed"
    console.print(f"wrote {path}: {winner.name}, verified correct, {speed}")
    return Exit.OK
  why = "description-only mode" if result.mode == DESCRIPTION else "the verifier has no GPU"
  console.print(f"wrote {path}: {winner.name}, compiled but UNVERIFIED ({why})")
  return Exit.UNVERIFIED
