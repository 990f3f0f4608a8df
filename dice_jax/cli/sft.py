"""`dice sft`: supervised fine-tuning of a diffusion LM on prompt/response data.

Exit codes (dice_jax.cli.exit_codes): 0 finished; 2 bad command line, config, data file or model
directory (nothing was trained); 5 the loss diverged (NaN/inf); 6 a checkpoint does not match the
config; 75 stopped by SIGTERM or a preemption notice after saving a checkpoint (run the same command
to resume); 130 interrupted by Ctrl-C after saving a checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from dice_jax.cli.exit_codes import Exit, epilog
from dice_jax.cli.signals import StopFlag

CODES = (Exit.OK, Exit.USAGE, Exit.DIVERGED, Exit.CHECKPOINT, Exit.PREEMPTED, Exit.INTERRUPTED)

_EPILOG = """\
examples:
  dice sft --config configs/sft_tiny.yaml
  dice sft --config configs/sft_tiny.yaml train.steps=100 optimizer.lr=1e-3 run_dir=/tmp/sft
  dice sft --config configs/sft_sdar.yaml model.path=/ckpt/SDAR-1.7B-Chat \\
      data.train_files=[/data/cuke.json] run_dir=/runs/sdar-sft

The run directory gets checkpoints/ (orbax; a rerun of the same command resumes from the latest),
tensorboard/ (event files), metrics.jsonl, config.yaml (the resolved config) and, at the end,
hf/ (the model in Hugging Face layout, the input of `dice train`).

""" + epilog(*CODES, USAGE="bad config/data/model dir", INTERRUPTED="Ctrl-C after saving")


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = subparsers.add_parser(
      "sft", help="supervised fine-tuning on prompt/response JSON/JSONL (masked diffusion)",
      description="Fine-tune a diffusion LM (SDAR two-copy block diffusion, or the LLaDA masked "
                  "ELBO) on prompt/response or chat-message examples. Resumes from the latest "
                  "checkpoint of its run directory.",
      epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, metavar="YAML",
                      help="config file (see configs/sft_*.yaml); sections: model, data, train, "
                           "optimizer, mesh, distributed, checkpoint, logging")
  parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                      help="dotted overrides applied after the file, e.g. optimizer.lr=1e-5 "
                           "model.path=/ckpt train.steps=200 (values are YAML: [a,b], null, 1e-6)")
  parser.add_argument("--print-config", action="store_true",
                      help="print the resolved config as YAML and exit without training")
  parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                      help="Python logging level on stderr (default: INFO)")
  return parser


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                      stream=sys.stderr)
  logging.getLogger("absl").setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))
  from dice_jax.config import ConfigError, load_config, to_yaml  # deferred: `dice --help` stays fast

  try:
    from dice_jax.train.sft_loop import SFTConfig

    cfg = load_config(SFTConfig, args.config, args.overrides)
  except ConfigError as e:
    print(f"dice sft: config error: {e}", file=sys.stderr)
    return Exit.USAGE
  if args.print_config:
    print(to_yaml(cfg), end="")
    return Exit.OK
  return _train(cfg)


def _train(cfg) -> int:
  from dice_jax.checkpoints import CheckpointError
  from dice_jax.config import ConfigError
  from dice_jax.data.sft_data import SFTDataError
  from dice_jax.distributed import launcher
  from dice_jax.model.config import UnsupportedModelError
  from dice_jax.model.hf_io import CheckpointError as HFCheckpointError
  from dice_jax.train.sft_loop import TrainingDiverged, run_sft

  try:
    with StopFlag(enabled=launcher(cfg.distributed) is None) as stop:
      result = run_sft(cfg, should_stop=stop)
  except (ConfigError, SFTDataError, UnsupportedModelError, FileNotFoundError) as e:
    print(f"dice sft: {e}", file=sys.stderr)
    return Exit.USAGE
  except TrainingDiverged as e:
    print(f"dice sft: training diverged: {e}", file=sys.stderr)
    return Exit.DIVERGED
  except (CheckpointError, HFCheckpointError) as e:
    print(f"dice sft: checkpoint error: {e}", file=sys.stderr)
    return Exit.CHECKPOINT
  if result.status == "done":
    where = f"; model in Hugging Face layout: {result.hf_dir}" if result.hf_dir else ""
    print(f"dice sft: done at step {result.step} in {result.run_dir}{where}", file=sys.stderr)
    return Exit.OK
  print(f"dice sft: {result.status} at step {result.step} (checkpoint saved); run the same "
        f"command to resume", file=sys.stderr)
  return Exit.INTERRUPTED if stop.signal == signal.SIGINT else Exit.PREEMPTED
