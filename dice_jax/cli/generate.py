"""`dice generate`: best-of-N verified CUDA kernels for one PyTorch module.

Exit codes (dice_jax.cli.exit_codes; 0-4 as `dice-verifier check`): 0 a verified winner was
written; 1 no candidate was proven correct (nothing written); 2 bad command line or input
(reference, architecture, model directory); 3 compile-only: a candidate compiled and was written
marked UNVERIFIED (description-only mode, or a verifier without a GPU); 4 the verifier is
unreachable or failed; 130 interrupted (Ctrl-C or SIGTERM; a --verifier local server is stopped).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from dice_jax.cli import sampling
from dice_jax.cli.exit_codes import Exit, add_command
from dice_jax.verifier.defaults import EVALUATION, PRECISION_NAMES

CODES = (Exit.OK, Exit.NONE_CORRECT, Exit.USAGE, Exit.UNVERIFIED, Exit.VERIFIER, Exit.INTERRUPTED)
WORDING = dict(OK="verified winner written", USAGE="bad input", UNVERIFIED="compile-only (UNVERIFIED written)",
               VERIFIER="verifier unreachable")
HELP = "verified best-of-N CUDA kernels for a PyTorch module"
DESCRIPTION = ("Sample candidate kernels for a KernelBench-format reference (Model, get_inputs, get_init_inputs), "
               "verify every one, and write the fastest correct one.")
EXAMPLES = """\
examples:
  dice generate my_model.py --model ckpt/ --verifier 10.0.0.5:50051 --out ModelNew.py
  dice generate my_model.py --model ckpt/ --samples 16 --precision bf16 --arch sm_90
  dice generate --description "row-wise softmax of a [4096, 4096] fp32 tensor" --model ckpt/
  # check the pipeline end to end: a known-good kernel among the samples must win or tie
  dice generate ref.py --model ckpt/ --inject known_good.py --report result.json

The prompt states the target architecture, the precision and the input shapes and dtypes (read
statically from get_inputs). Without a reference (--description) candidates are only compiled and
statically checked: nothing is called verified, and a written file is marked UNVERIFIED.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = add_command(subparsers, "generate", HELP, DESCRIPTION, EXAMPLES, CODES, **WORDING)
  parser.add_argument("reference", nargs="?", type=pathlib.Path,
                      help="the PyTorch reference file (omit with --description)")
  parser.add_argument("--description", help="description-only mode: what to compute, in words")
  parser.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory (HF layout)")
  parser.add_argument("--samples", type=int, default=8, help="candidates to sample (default 8)")
  parser.add_argument("--verifier", default="local", metavar="HOST:PORT|local",
                      help="verifier target(s), or 'local': a loopback server for this run (default)")
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("ModelNew.py"),
                      help="where the winner is written (default %(default)s)")
  parser.add_argument("--report", type=pathlib.Path, metavar="JSON",
                      help="also write every candidate with its verdict and source as JSON")
  parser.add_argument("--arch", help="target GPU architecture, e.g. sm_90 (default: the verifier's)")
  parser.add_argument("--precision", choices=PRECISION_NAMES, default="fp32",
                      help="floating precision the kernel is written and checked for (default fp32)")
  parser.add_argument("--inject", type=pathlib.Path, action="append", default=[], metavar="FILE",
                      help="an extra candidate file verified and ranked with the samples (repeatable)")
  parser.add_argument("--template", metavar="YAML", help="prompt template (user/system); see "
                      "dice_jax.data.prompts for the fields")
  parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
  parser.add_argument("--trials", type=int, default=0, help="correctness trials (0: server default)")
  parser.add_argument("--atol", type=float, default=0.0, help="0: per-precision default")
  parser.add_argument("--rtol", type=float, default=0.0, help="0: as --atol")
  parser.add_argument("--connect-timeout", type=float, default=EVALUATION.connect_timeout_s,
                      help="seconds to wait for the verifier to answer its preflight (default %(default)g)")
  sampling.add_flags(parser.add_argument_group("sampling (the keys of dice train's rollout section)"))
  return parser


def _error(message: str, code: int = Exit.USAGE) -> int:
  print(f"dice generate: error: {message}", file=sys.stderr)
  return code


def _read_injected(paths: list[pathlib.Path]) -> list[str]:
  out = []
  for path in paths:
    try:
      out.append(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
      raise ValueError(f"--inject {path}: cannot read as UTF-8 text ({e})") from None
  return out


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  if (args.reference is None) == (args.description is None):
    return _error("give a REFERENCE.py, or --description TEXT for description-only mode (not both)")
  if args.samples < 0 or args.samples + len(args.inject) < 1:
    return _error("--samples must be >= 1 (or 0 with --inject)")
  from dice_jax.cli import generate_run  # pylint: disable=import-outside-toplevel
  try:
    injected = _read_injected(args.inject)
  except ValueError as e:
    return _error(str(e))
  from dice_jax.cli.signals import sigterm_as_interrupt  # pylint: disable=import-outside-toplevel
  try:
    with sigterm_as_interrupt():
      return generate_run.generate(args, injected)
  except KeyboardInterrupt:
    return _error("interrupted", Exit.INTERRUPTED)
