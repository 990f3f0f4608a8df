"""`dice plot RUN_DIR`: PNG curves of a `dice train` run (see dice_jax.rl.plots for what is drawn).

Exit codes (dice_jax.cli.exit_codes): 0 written; 2 not a run directory, or nothing logged yet.
"""

from __future__ import annotations

import argparse
import sys

from dice_jax.cli.exit_codes import Exit, add_command

HELP = "PNG curves of a dice train run (rewards, per-phase rates, speedups, KL, entropy)"
DESCRIPTION = ("Draw a `dice train` run's metrics.jsonl (and speedups.jsonl) as PNG files: reward per component, "
               "phase-1/phase-2 format/compile/correct rates, the speedup distribution, KL, entropy, and training "
               "health (loss, gradient norm, ratio, time waiting on verdicts).")
EXAMPLES = """\
examples:
  dice plot runs/tiny                   # writes runs/tiny/plots/*.png
  dice plot runs/tiny --out /tmp/plots
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = add_command(subparsers, "plot", HELP, DESCRIPTION, EXAMPLES, (Exit.OK, Exit.USAGE), OK="written",
                       USAGE="not a run directory, or nothing logged yet")
  parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory of `dice train` (its run_dir)")
  parser.add_argument("--out", metavar="DIR", help="where to write the PNGs (default: RUN_DIR/plots)")
  return parser


def run(args: argparse.Namespace) -> int:
  from dice_jax.rl.plots import PlotError, plot_run  # deferred: matplotlib is slow to import

  try:
    written = plot_run(args.run_dir, args.out)
  except PlotError as e:
    print(f"dice plot: {e}", file=sys.stderr)
    return Exit.USAGE
  for path in written:
    print(path)
  return Exit.OK
