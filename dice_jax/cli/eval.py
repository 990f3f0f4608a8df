"""`dice eval`: KernelBench-style evaluation (execution accuracy, fast_p, pass@k) through the verifier.

Exit codes (dice_jax.cli.exit_codes): 0 finished; 2 bad command line or input (problems,
generations, model directory, templates); 4 the verifier is unreachable, or verdicts are
INFRA_ERROR (rerun the same command to retry only those); 130 interrupted by Ctrl-C or SIGTERM
(every verdict that arrived is saved: rerun to continue; a --verifier local server is stopped).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from dice_jax.cli import sampling
from dice_jax.cli.exit_codes import Exit, add_command
from dice_jax.verifier.defaults import EVALUATION, POLICY_NAMES, PRECISION_NAMES

CODES = (Exit.OK, Exit.USAGE, Exit.VERIFIER, Exit.INTERRUPTED)
HELP = "KernelBench-style evaluation: fast_p, pass@k, reports and plots"
DESCRIPTION = ("Evaluate a model (or kernels generated elsewhere) on KernelBench-format problems through the "
               "verifier: execution accuracy, fast_1/fast_2 and the fast_p curve, speedups and pass@k, per "
               "level. Resumable.")

EXAMPLES = """\
examples:
  # our model, greedy, on the DICE infilling items (graded as prefix + generated middle + suffix)
  dice eval --model ckpt/ --problems ../shared/data/dice/kernel_infilling_evaluation.json \\
      --verifier 10.0.0.5:50051 --out runs/eval/infill
  # 8 samples at temperature 1.0 on a KernelBench tree: adds pass@k
  dice eval --model ckpt/ --problems KernelBench/ --samples 8 --verifier 10.0.0.5:50051
  # kernels made elsewhere: one folder per problem (its id), one file per sample (its index)
  dice eval --generations gens/ --problems KernelBench/ --verifier 10.0.0.5:50051
      gens/19_ReLU/0.py        a candidate file (ModelNew + load_inline), graded as written
      gens/19_ReLU/1.txt       a raw model output; the code is extracted as in training
      gens/20_LeakyReLU/0.py
    The folder is the problem id: a KernelBench file's stem (level1/19_ReLU.py -> 19_ReLU), or a
    DICE item's id/idx field (bundled:tiny -> tiny_relu, ...).
  # the data's own known-good candidates (checks harness and data)
  dice eval --reference-generations --problems kernel_infilling_evaluation.json --verifier local
  # before / after RL
  dice eval --compare runs/eval/sft runs/eval/rl --out runs/eval/compare

Interrupted? Run the same command again: verdicts are saved as they arrive (OUT/verdicts.jsonl,
keyed by a hash of reference + candidate + options) and are never requested twice.
--verifier local (the default, as for `dice generate`) starts a verifier on loopback for this run
(needs the 'verify' extra: torch and nvcc); without a GPU its verdicts are compile-only and the
report says correctness is unavailable. Give HOST:PORT to use a running `dice-verifier serve`.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = add_command(subparsers, "eval", HELP, DESCRIPTION, EXAMPLES, CODES, USAGE="bad input")
  src = parser.add_argument_group("what to evaluate")
  src.add_argument("--problems", metavar="PATH",
                   help="KernelBench directory (levelN/<id>_<name>.py), a DICE .json/.jsonl file, or "
                        "bundled:<name>")
  one = src.add_mutually_exclusive_group()
  one.add_argument("--model", metavar="DIR", help="checkpoint directory (HF layout) to generate with")
  one.add_argument("--generations", metavar="DIR",
                   help="kernels made elsewhere: DIR/<problem id>/<sample index>.py (candidate files) "
                        "or .txt (raw model outputs, extracted as in training), e.g. DIR/19_ReLU/0.py "
                        "for KernelBench's level1/19_ReLU.py (see the layout below)")
  one.add_argument("--reference-generations", action="store_true",
                   help="evaluate each problem's known-good candidate (DICE cuda_code) as sample 0")
  one.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="compare two finished runs (their --out directories) side by side")
  src.add_argument("--mode", choices=("auto", "infilling", "end-to-end"), default="auto",
                   help="infilling grades prefix + generated middle + suffix (phase-1 items); "
                        "auto: infilling when every problem has a scaffold (default %(default)s)")
  src.add_argument("--level", type=int, action="append", metavar="N",
                   help="only problems of this level (repeatable)")
  src.add_argument("--limit", type=int, metavar="N", help="only the first N problems (after --level)")
  src.add_argument("--allow-missing", action="store_true",
                   help="with --generations: score only problems that have samples")
  gen = parser.add_argument_group("generation (--model)")
  gen.add_argument("--samples", type=int, default=1, metavar="K",
                   help="samples per problem: 1 = greedy (top_k 1), K > 1 = at --temperature; pass@k "
                        "is reported for k <= K (default %(default)s)")
  gen.add_argument("--batch-size", type=int, default=8, help="rows per sampler call (default 8)")
  gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
  gen.add_argument("--template-infilling", metavar="YAML", help="phase-1 prompt template (user/system)")
  gen.add_argument("--template-end-to-end", metavar="YAML", help="phase-2 prompt template")
  sampling.add_flags(parser.add_argument_group(
      "sampling (--model; the keys of dice train's rollout section; --samples 1 is greedy)"))
  ver = parser.add_argument_group("verification")
  ver.add_argument("--verifier", metavar="HOST:PORT|local", default="local",
                   help="verifier target(s), comma-separated, or 'local': a loopback server for this run "
                        "(default)")
  ver.add_argument("--precision", choices=PRECISION_NAMES, default="fp32",
                   help="floating precision problems are run in (default fp32); integer inputs "
                        "keep their dtype")
  ver.add_argument("--trials", type=int, default=0, help="correctness trials (0: server default, 5)")
  ver.add_argument("--atol", type=float, default=0.0,
                   help="absolute tolerance (0: KernelBench's per-precision default, fp32 1e-4; DICE "
                        "used 1e-2)")
  ver.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (0: as --atol)")
  ver.add_argument("--skip-timing", action="store_true", help="correctness only (no fast_p)")
  ver.add_argument("--policy", choices=POLICY_NAMES, default=None,
                   help="partial replacement: default (KernelBench/DICE: a kept torch matmul or "
                        "conv is fine) or strict (torch only for glue); unset: the server's")
  ver.add_argument("--auth-token-file", metavar="FILE", help="bearer token for the verifier")
  ver.add_argument("--connect-timeout", type=float, default=EVALUATION.connect_timeout_s,
                   help="seconds (default %(default)g)")
  ver.add_argument("--request-timeout", type=float, default=EVALUATION.request_timeout_s,
                   help="seconds from send to verdict per candidate (default %(default)g)")
  out = parser.add_argument_group("output")
  out.add_argument("--out", metavar="DIR", type=pathlib.Path,
                   help="results directory (default runs/eval/<problems>-<source>); rerunning with "
                        "the same --out resumes")
  out.add_argument("--name", help="run name shown in tables (default: the --out folder name)")
  out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
  return parser


def _error(message: str, code: int = Exit.USAGE) -> int:
  print(f"dice eval: error: {message}", file=sys.stderr)
  return code


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  from dice_jax.cli import eval_run  # pylint: disable=import-outside-toplevel
  if args.compare:
    return eval_run.compare(args)
  if not args.problems:
    return _error("--problems PATH is required (or --compare RUN_A RUN_B)")
  if not (args.model or args.generations or args.reference_generations):
    return _error("say what to evaluate: --model DIR, --generations DIR or --reference-generations")
  if args.samples < 1 or args.batch_size < 1:
    return _error("--samples and --batch-size must be >= 1")
  if args.samples > 1 and not args.model:
    return _error("--samples applies to --model (generated samples); with --generations the sample "
                  "files decide")
  from dice_jax.cli.signals import sigterm_as_interrupt  # pylint: disable=import-outside-toplevel
  try:
    with sigterm_as_interrupt():
      return eval_run.evaluate(args)
  except KeyboardInterrupt:
    out = getattr(args, "resolved_out", args.out)
    return _error(f"interrupted; verdicts received so far are saved in {out}/verdicts.jsonl. "
                  "Run the same command again to continue.", Exit.INTERRUPTED)
