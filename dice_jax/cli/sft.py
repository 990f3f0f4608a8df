"""`dice sft`: supervised fine-tuning of a diffusion LM on prompt/response data.

Exit codes (dice_jax.cli.exit_codes): 0 finished; 2 bad command line, config, data file or model
directory (nothing was trained); 5 the loss diverged (NaN/inf); 6 a checkpoint does not match the
config; 75 stopped by SIGTERM or a preemption notice after saving a checkpoint (run the same command
to resume); 130 interrupted by Ctrl-C after saving a checkpoint.
"""

from __future__ import annotations

import argparse

from dice_jax.cli import training
from dice_jax.cli.exit_codes import add_command
from dice_jax.cli.signals import StopFlag

HELP = "supervised fine-tuning on prompt/response JSON/JSONL (masked diffusion)"
DESCRIPTION = ("Fine-tune a diffusion LM (SDAR two-copy block diffusion, or the LLaDA masked ELBO) on "
               "prompt/response or chat-message examples. Resumes from the latest checkpoint of its run directory.")
EXAMPLES = """\
examples:
  dice sft --config configs/sft_tiny.yaml
  dice sft --config configs/sft_tiny.yaml train.steps=100 optimizer.lr=1e-3 run_dir=/tmp/sft
  dice sft --config configs/sft_sdar.yaml model.path=/ckpt/SDAR-1.7B-Chat \\
      data.train_files=[/data/cuke.json] run_dir=/runs/sdar-sft

The run directory gets checkpoints/ (orbax; a rerun of the same command resumes from the latest),
tensorboard/ (event files), metrics.jsonl, config.yaml (the resolved config) and, at the end,
hf/ (the model in Hugging Face layout, the input of `dice train`).

"""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = add_command(subparsers, "sft", HELP, DESCRIPTION, EXAMPLES, training.CODES, **training.WORDING)
  parser.add_argument("--config", required=True, metavar="YAML",
                      help="config file (see configs/sft_*.yaml); sections: model, data, train, "
                           "optimizer, mesh, distributed, checkpoint, logging")
  training.add_run_flags(parser, "optimizer.lr=1e-5 model.path=/ckpt train.steps=200")
  return parser


def run(args: argparse.Namespace) -> int:
  training.configure_logging(args.log_level, quiet=("absl",))

  def load():
    from dice_jax.config import load_config  # pylint: disable=import-outside-toplevel
    from dice_jax.train.sft_loop import SFTConfig  # pylint: disable=import-outside-toplevel
    return load_config(SFTConfig, args.config, args.overrides)

  cfg, code = training.resolve("dice sft", load, args.print_config)
  if cfg is None:
    return code
  from dice_jax.data.sft_data import SFTDataError  # pylint: disable=import-outside-toplevel
  from dice_jax.distributed import launcher  # pylint: disable=import-outside-toplevel
  from dice_jax.train.sft_loop import run_sft  # pylint: disable=import-outside-toplevel

  return training.run("dice sft", run_sft, cfg, StopFlag(enabled=launcher(cfg.distributed) is None),
                      usage_errors=(SFTDataError,))
