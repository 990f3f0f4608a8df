"""`dice train`: bi-phase RL (DICE recipe) of a diffusion LM on verifier rewards.

With no `--config` it runs the built-in `tiny` default (dice_jax.rl.config.RLConfig(); also
configs/tiny.yaml): a tiny random model, the bundled problems and a verifier started on loopback.

Exit codes (dice_jax.cli.exit_codes): 0 finished; 2 bad command line, config, data file or model
directory (nothing was trained); 4 the verifier could not be started or reached; 5 the loss
diverged (NaN/inf); 6 a checkpoint does not match the config; 75 stopped by SIGTERM or a
preemption notice after saving a checkpoint (run the same command to resume); 130 interrupted by
Ctrl-C after saving a checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from dice_jax.cli import training
from dice_jax.cli.exit_codes import Exit, add_command
from dice_jax.cli.signals import StopFlag

CODES = (*training.CODES[:2], Exit.VERIFIER, *training.CODES[2:])
WORDING = dict(training.WORDING, VERIFIER="verifier could not be started or reached")
HELP = "bi-phase RL on verifier rewards (no --config: the built-in tiny run)"
DESCRIPTION = ("Reinforcement learning of a diffusion LM on CUDA-kernel problems (DICE's bi-phase recipe: infilling, "
               "then end to end), rewarded by a dice-verifier farm. Resumes from the latest checkpoint of its run "
               "directory.")
EXAMPLES = """\
examples:
  dice train                                    # the built-in tiny run (CPU laptop, a few minutes)
  dice train rollout.gen_length=64 train.steps=10 run_dir=/tmp/tiny
  dice train --config configs/dice_sdar_1.7b_gpu.yaml model.path=/ckpt/sdar-1.7b-sft \\
      data.phase1_files=[/data/kernel_infilling.json] data.phase2_files=[/data/end_to_end.json] \\
      verifier.targets=[10.0.0.5:50051,10.0.0.6:50051] run_dir=/runs/dice-1.7b

The run directory gets checkpoints/ (orbax; the same command resumes from the latest), tensorboard/,
metrics.jsonl (`dice plot RUN_DIR` draws it), config.yaml (the resolved config), verifier.log (a
local verifier's log) and, at the end, hf/ (the policy in Hugging Face layout).

"""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = add_command(subparsers, "train", HELP, DESCRIPTION, EXAMPLES, CODES, **WORDING)
  parser.add_argument("--config", metavar="YAML",
                      help="config file (configs/tiny.yaml, configs/dice_sdar_*.yaml); default: the built-in "
                           "tiny run. Sections: model, data, rollout, algo, train, curriculum, rewards, verifier, "
                           "pipeline, optimizer, mesh, distributed, checkpoint, logging")
  training.add_run_flags(parser, "train.steps=20 algo.logprob=coupled verifier.targets=[host:50051]")
  return parser


def load(config_path: str | None, overrides: list[str]):
  """The resolved RLConfig: the tiny defaults, then the file, then the overrides."""
  from dice_jax.config import apply_overrides, from_dict, read_yaml, to_dict
  from dice_jax.rl.config import RLConfig

  data = read_yaml(config_path) if config_path else to_dict(RLConfig())
  data = apply_overrides(RLConfig, data, overrides)
  return from_dict(RLConfig, data)


def run(args: argparse.Namespace) -> int:
  training.configure_logging(args.log_level, quiet=("absl", "jax"))
  cfg, code = training.resolve("dice train", lambda: load(args.config, args.overrides), args.print_config,
                               where=f"{args.config}: " if args.config else "")
  if cfg is None:
    return code
  from dice_jax.data.problems import ProblemLoadError  # pylint: disable=import-outside-toplevel
  from dice_jax.rl.loop import run_rl  # pylint: disable=import-outside-toplevel
  from dice_jax.verifier.connect import UNAVAILABLE  # pylint: disable=import-outside-toplevel

  return training.run("dice train", run_rl, cfg, StopFlag(), usage_errors=(ProblemLoadError,),
                      errors={UNAVAILABLE: (Exit.VERIFIER, "verifier: ")}, finished=_finished, exported="policy")


def _finished(result) -> Exit | None:
  """The per-phase summary table; a run that had nothing left to do says so and exits OK."""
  from dice_jax.rl.summary import print_summary  # pylint: disable=import-outside-toplevel

  print_summary(result)
  if result.status == "done" and result.step == result.start_step:
    print(f"dice train: {result.run_dir} had already finished its {result.step} steps; nothing to do (raise "
          "train.steps=, or give another run_dir=)", file=sys.stderr)
    return Exit.OK
  return None
