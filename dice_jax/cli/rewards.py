"""`dice rewards check`: given completions through exactly the reward path `dice train` uses.

Each completion is extracted and assembled as in a rollout (phase 1: the `source = '''...'''` body
put into the problem's scaffold; phase 2: the whole file), sent through the same verifier client
with the same request options, and scored by the same reward shaper (the config's preset and
`rewards.*` settings, custom reward functions included). One row per completion: what happened
(the outcome label of dice_jax.rewards.outcomes), the verifier's message, each reward component and
the total. Users test their reward functions with it; so do we.

FILE.jsonl has one object per line: {"problem_id": ..., "phase": 1 or 2, "completion": "..."}.
Completions of the same problem and phase form one group (components normalised per group see
them together, as the G responses to one prompt do in training).

Exit codes (dice_jax.cli.exit_codes): 0 every completion was scored; 2 bad command line, config or
input file; 4 the verifier could not be started or reached (the same codes as `dice train`).
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
import tempfile
from typing import Any

from dice_jax.cli.exit_codes import Exit, add_command

CODES = (Exit.OK, Exit.USAGE, Exit.VERIFIER)
HELP = "verify and score given completions exactly as `dice train` would"
DESCRIPTION = __doc__.split("\n\n")[0] + " One row per completion: outcome, message, each reward component, total."
EXAMPLES = """\
examples:
  # the tiny default's reward (compile_only without a GPU) on the bundled problems
  dice rewards check --problems bundled:tiny --completions mine.jsonl
  # a recipe's reward against a running verifier, plus a custom component
  dice rewards check --config configs/dice_sdar_1.7b_gpu.yaml --problems data.json \\
      --completions mine.jsonl --verifier 10.0.0.5:50051 \\
      'rewards.custom.short={fn: "myrewards:short", weight: 0.1}' --json rows.json

A line of FILE.jsonl: {"problem_id": "19_ReLU", "phase": 2, "completion": "```python\\n...```"}
"""


class InputError(ValueError):
  """A problem or completions file that cannot be used; the message says where and why."""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = subparsers.add_parser("rewards", help="reward tools (check: completions through the training reward path)",
                                 description="Tools for the reward path of `dice train`.")
  sub = parser.add_subparsers(dest="rewards_command", metavar="SUBCOMMAND", required=True)
  check = add_command(sub, "check", HELP, DESCRIPTION, EXAMPLES, CODES, USAGE="bad input",
                      VERIFIER="verifier could not be started or reached")
  check.add_argument("--problems", required=True, action="append", metavar="PATH",
                     help="problems the completions answer: anything data.phase*_files takes (DICE .json/.jsonl, "
                          "a KernelBench directory, bundled:<name>); repeat for several")
  check.add_argument("--completions", required=True, metavar="FILE.jsonl",
                     help='one {"problem_id", "phase", "completion"} object per line')
  check.add_argument("--config", metavar="YAML", help="a `dice train` config (default: the built-in tiny run's)")
  check.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                     help="`dice train` overrides, e.g. rewards.preset=dice_binary verifier.precision=bf16")
  check.add_argument("--verifier", metavar="HOST:PORT|local",
                     help="verifier target(s), comma-separated, or `local` (default: the config's verifier.targets)")
  check.add_argument("--json", metavar="OUT", help="also write the rows to OUT as a JSON list")
  check.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
  return parser


def read_completions(path: str, problems: dict[str, Any]) -> list[dict[str, Any]]:
  """The completion records of FILE.jsonl, each checked against the problems it names."""
  try:
    text = pathlib.Path(path).expanduser().read_bytes().decode("utf-8")
  except OSError as e:
    raise InputError(f"{path}: {e.strerror}") from None
  except UnicodeDecodeError as e:
    raise InputError(f"{path}: not UTF-8 text ({e})") from None
  records = []
  for lineno, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    where = f"{path} line {lineno}"
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise InputError(f"{where}: invalid JSON at column {e.colno}: {e.msg}") from None
    if not isinstance(record, dict):
      raise InputError(f"{where}: expected an object, got {type(record).__name__}")
    missing = sorted({"problem_id", "phase", "completion"} - set(record))
    if missing:
      raise InputError(f"{where}: missing {missing} (fields present: {sorted(record)})")
    problem_id, phase, completion = str(record["problem_id"]), record["phase"], record["completion"]
    if phase not in (1, 2) or isinstance(phase, bool):
      raise InputError(f"{where}: phase must be 1 or 2, got {phase!r}")
    if not isinstance(completion, str):
      raise InputError(f"{where}: completion must be a string, got {type(completion).__name__}")
    if problem_id not in problems:
      raise InputError(f"{where}: no problem {problem_id!r} in --problems ({len(problems)} problems loaded)")
    if phase == 1 and not problems[problem_id].has_scaffold:
      raise InputError(f"{where}: problem {problem_id!r} has no prefix/middle/suffix scaffold, so it has no phase 1")
    records.append({"problem_id": problem_id, "phase": phase, "completion": completion})
  if not records:
    raise InputError(f"{path}: no completions")
  return records


def _load_problems(paths: list[str]) -> dict[str, Any]:
  from dice_jax.data.problems import load_problems

  loaded: dict[str, Any] = {}
  for path in paths:
    for problem in load_problems(path):
      if problem.id in loaded:
        raise InputError(f"problem id {problem.id!r} appears twice ({loaded[problem.id].origin} and {problem.origin})")
      loaded[problem.id] = problem
  return loaded


def check(cfg, problems: dict[str, Any], records: list[dict[str, Any]], workdir: str
          ) -> tuple[list[dict[str, Any]], str]:
  """(the rows of `records`, what the verifier said about itself); see the module docstring.
  Raises one of dice_jax.verifier.connect.UNAVAILABLE when no verifier can be reached."""
  from dice_jax.data.rl_data import REWARD_COLUMNS, collate, make_item
  from dice_jax.rewards import defaults
  from dice_jax.rewards.candidates import submit_completions
  from dice_jax.rl import rewarding, setup
  from dice_jax.rl.data import PromptBook
  from dice_jax.train import model_setup

  tokenizer, _ = model_setup.tokenizer_for(cfg.model, workdir)
  book = PromptBook(cfg.data, tokenizer)
  items = [make_item(problems[r["problem_id"]], r["phase"], infilling=book.infilling, end_to_end=book.end_to_end)
           for r in records]
  prompts = [book.render(problems[r["problem_id"]], r["phase"]) for r in records]
  completions = [r["completion"] for r in records]
  columns = collate(items, 1, REWARD_COLUMNS)
  groups: dict[tuple[str, int], int] = {}
  group_ids = [groups.setdefault((r["problem_id"], r["phase"]), len(groups)) for r in records]
  cfg.rewards.custom_components()  # a bad custom reward fails before the verifier starts
  connection = setup.connect_verifier(cfg.verifier, workdir)
  try:
    shaper = defaults.make_shaper(cfg.rewards, has_gpu=connection.has_gpu)
    verdicts = submit_completions(connection.client, completions, options=cfg.verifier.options(),
                                  **columns).result()
    scored = rewarding.score(shaper, prompts, completions, verdicts, columns, group_ids)
    verifier = connection.describe()
  finally:
    connection.close()
  result = scored.result
  return [{"problem_id": r["problem_id"], "phase": r["phase"], "outcome": scored.labels[i],
           "stage": _stage(verdicts[i]), "message": verdicts[i].message,
           "components": {name: round(float(values[i]), 6) for name, values in result.components.items()},
           "reward": round(float(result.total[i]), 6), "valid": bool(result.valid[i])} for i, r in enumerate(records)], verifier


def _stage(verdict) -> str:
  from dice.verifier.v1 import verifier_pb2 as pb

  return pb.Stage.Name(verdict.stage).removeprefix("STAGE_")


def print_rows(rows: list[dict[str, Any]], verifier: str) -> None:
  from rich.console import Console
  from rich.table import Table

  names = list(rows[0]["components"]) if rows else []
  table = Table(title="dice rewards check", caption=f"verifier: {verifier}" if verifier else None)
  for column in ("#", "problem", "phase", "outcome"):
    table.add_column(column, no_wrap=True)
  for name in names:
    table.add_column(name, justify="right")
  table.add_column("reward", justify="right")
  table.add_column("message", overflow="fold")
  for i, row in enumerate(rows):
    reward = f"{row['reward']:.3f}" if row["valid"] else "excluded"
    table.add_row(str(i), row["problem_id"], str(row["phase"]), row["outcome"],
                  *(f"{row['components'][n]:.3f}" for n in names), reward, row["message"][:200])
  console = Console()
  if not console.is_terminal:
    console = Console(width=200)  # a pipe or a log file: do not fold at 80 columns
  console.print(table)


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                      stream=sys.stderr)
  from dice_jax.cli.train import load
  from dice_jax.config import ConfigError
  from dice_jax.data.problems import ProblemLoadError
  from dice_jax.verifier.connect import UNAVAILABLE

  overrides = list(args.overrides)
  if args.verifier:
    overrides.append(f"verifier.targets=[{args.verifier}]")
  try:
    cfg = load(args.config, overrides)
    problems = _load_problems(args.problems)
    records = read_completions(args.completions, problems)
  except (ConfigError, ProblemLoadError, InputError) as e:
    print(f"dice rewards check: {e}", file=sys.stderr)
    return Exit.USAGE
  with tempfile.TemporaryDirectory(prefix="dice-rewards-check-") as workdir:
    try:
      rows, verifier = check(cfg, problems, records, workdir)
    except ConfigError as e:
      print(f"dice rewards check: {e}", file=sys.stderr)
      return Exit.USAGE
    except UNAVAILABLE as e:
      print(f"dice rewards check: verifier: {e}", file=sys.stderr)
      return Exit.VERIFIER
  print_rows(rows, verifier)
  if args.json:
    pathlib.Path(args.json).expanduser().write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
  return Exit.OK
