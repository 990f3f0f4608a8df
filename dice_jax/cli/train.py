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
import logging
import signal
import sys

from dice_jax.cli.exit_codes import Exit, epilog
from dice_jax.cli.signals import StopFlag

CODES = (Exit.OK, Exit.USAGE, Exit.VERIFIER, Exit.DIVERGED, Exit.CHECKPOINT, Exit.PREEMPTED, Exit.INTERRUPTED)

_EPILOG = """\
examples:
  dice train                                    # the built-in tiny run (CPU laptop, a few minutes)
  dice train rollout.gen_length=64 train.steps=10 run_dir=/tmp/tiny
  dice train --config configs/dice_sdar_1.7b_gpu.yaml model.path=/ckpt/sdar-1.7b-sft \\
      data.phase1_files=[/data/kernel_infilling.json] data.phase2_files=[/data/end_to_end.json] \\
      verifier.targets=[10.0.0.5:50051,10.0.0.6:50051] run_dir=/runs/dice-1.7b

The run directory gets checkpoints/ (orbax; the same command resumes from the latest), tensorboard/,
metrics.jsonl (`dice plot RUN_DIR` draws it), config.yaml (the resolved config), verifier.log (a
local verifier's log) and, at the end, hf/ (the policy in Hugging Face layout).

""" + epilog(*CODES, USAGE="bad config/data/model dir", VERIFIER="verifier could not be started or reached",
             INTERRUPTED="Ctrl-C after saving")


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = subparsers.add_parser(
      "train", help="bi-phase RL on verifier rewards (no --config: the built-in tiny run)",
      description="Reinforcement learning of a diffusion LM on CUDA-kernel problems (DICE's bi-phase recipe: "
                  "infilling, then end to end), rewarded by a dice-verifier farm. Resumes from the latest "
                  "checkpoint of its run directory.",
      epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", metavar="YAML",
                      help="config file (configs/tiny.yaml, configs/dice_sdar_*.yaml); default: the built-in "
                           "tiny run. Sections: model, data, rollout, algo, train, curriculum, rewards, verifier, "
                           "pipeline, optimizer, mesh, distributed, checkpoint, logging")
  parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                      help="dotted overrides applied after the file, e.g. train.steps=20 algo.logprob=coupled "
                           "verifier.targets=[host:50051] (values are YAML: [a,b], null, 1e-6)")
  parser.add_argument("--print-config", action="store_true",
                      help="print the resolved config as YAML and exit without training")
  parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                      help="Python logging level on stderr (default: INFO)")
  return parser


def load(config_path: str | None, overrides: list[str]):
  """The resolved RLConfig: the tiny defaults, then the file, then the overrides."""
  from dice_jax.config import apply_overrides, from_dict, read_yaml, to_dict
  from dice_jax.rl.config import RLConfig

  data = read_yaml(config_path) if config_path else to_dict(RLConfig())
  data = apply_overrides(RLConfig, data, overrides)
  return from_dict(RLConfig, data)


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                      stream=sys.stderr)
  for noisy in ("absl", "jax"):  # orbax's and JAX's start-up chatter (e.g. "no TPU backend")
    logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))
  from dice_jax.config import ConfigError, to_yaml  # deferred: `dice --help` stays fast

  try:
    cfg = load(args.config, args.overrides)
  except ConfigError as e:
    where = f"{args.config}: " if args.config else ""
    print(f"dice train: config error: {where}{e}", file=sys.stderr)
    return Exit.USAGE
  if args.print_config:
    print(to_yaml(cfg), end="")
    return Exit.OK
  return _train(cfg)


def _train(cfg) -> int:
  from dice_jax.checkpoints import CheckpointError
  from dice_jax.config import ConfigError
  from dice_jax.data.problems import ProblemLoadError
  from dice_jax.verifier.connect import UNAVAILABLE
  from dice_jax.model.config import UnsupportedModelError
  from dice_jax.model.hf_io import CheckpointError as HFCheckpointError
  from dice_jax.rl.loop import TrainingDiverged, run_rl
  from dice_jax.rl.summary import print_summary

  try:
    with StopFlag() as stop:
      result = run_rl(cfg, should_stop=stop)
  except (ConfigError, ProblemLoadError, UnsupportedModelError, FileNotFoundError) as e:
    print(f"dice train: {e}", file=sys.stderr)
    return Exit.USAGE
  except UNAVAILABLE as e:
    print(f"dice train: verifier: {e}", file=sys.stderr)
    return Exit.VERIFIER
  except TrainingDiverged as e:
    print(f"dice train: training diverged: {e}", file=sys.stderr)
    return Exit.DIVERGED
  except (CheckpointError, HFCheckpointError) as e:
    print(f"dice train: checkpoint error: {e}", file=sys.stderr)
    return Exit.CHECKPOINT
  print_summary(result)
  if result.status == "done" and result.step == result.start_step:
    print(f"dice train: {result.run_dir} had already finished its {result.step} steps; nothing to do (raise "
          "train.steps=, or give another run_dir=)", file=sys.stderr)
    return Exit.OK
  if result.status == "done":
    where = f"; policy in Hugging Face layout: {result.hf_dir}" if result.hf_dir else ""
    print(f"dice train: done at step {result.step} in {result.run_dir}{where}", file=sys.stderr)
    return Exit.OK
  print(f"dice train: {result.status} at step {result.step} (checkpoint saved); run the same command to resume",
        file=sys.stderr)
  return Exit.INTERRUPTED if stop.signal == signal.SIGINT else Exit.PREEMPTED
