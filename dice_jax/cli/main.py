"""`dice`: the trainer-side command line (train, sft, eval, generate, rewards, plot).

Each subcommand lives in its own module under dice_jax/cli/ and exposes
`add_parser(subparsers) -> argparse.ArgumentParser` and `run(args) -> int` (the exit code).
Imports are deferred to the chosen subcommand so `dice --help` stays fast and a verifier-only
install can still print help. Exit codes mean the same in every subcommand (exit_codes.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dice_jax.cli.exit_codes import Exit

# Subcommand name -> module under dice_jax.cli. Order is the order shown in --help.
COMMANDS = {
    "train": "train",
    "sft": "sft",
    "eval": "eval",
    "generate": "generate",
    "rewards": "rewards",
    "plot": "plot",
}


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="dice",
      description="Train diffusion language models to write CUDA kernels (bi-phase RL), and evaluate them.",
  )
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
  for module_name in COMMANDS.values():
    module = importlib.import_module(f"dice_jax.cli.{module_name}")
    sub = module.add_parser(subparsers)
    sub.set_defaults(_run=module.run)
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if getattr(args, "_run", None) is None:
    parser.print_help()
    return Exit.USAGE
  return int(args._run(args) or 0)


if __name__ == "__main__":
  sys.exit(main())
