"""`dice train`: bi-phase RL (DICE recipe) of a diffusion LM on verifier rewards.

With no `--config` it runs the built-in `tiny` run (RLConfig()'s defaults with BUILT_IN_RUN;
configs/tiny.yaml spells it out): a tiny random model warm-started by a short SFT on bundled problems
(dice_jax.rl.warm_start), then bi-phase RL on bundled problems the warm start never saw, rewarded by
a verifier started on loopback. The end-of-run summary compares the first and the last step of each
phase and names the curves it drew (`dice plot`'s PNGs, in <run_dir>/plots).

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


# The built-in run: RLConfig()'s defaults with these settings (configs/tiny.yaml spells the result
# out). Decision: they live here, not in RLConfig's defaults, which stay the small, fast run that
# unit tests build their configs from; the built-in run needs a model wide enough to learn from its
# warm start, answers long enough to hold an end-to-end file (256 tokens), RL problems the warm start
# never saw (`bundled:elementwise`, whose infilling span is the op's one statement), and four
# infilling steps, each sampling the policy the previous update made (no overlap), before one
# end-to-end step. Four prompts of eight responses a step: with two, seed 0's compile rate did not
# rise within six steps. On a 2-core CPU waiting on the verifier's nvcc builds is most of an
# infilling step, so the steps' number and size set the run's time: four infilling steps show the
# rise (seed 0 on 2026-12-05's VM: compile rate 0.03, 0.09, 0.25, 0.62; README.md has seeds 1-2)
# that six did in 2.5 fewer minutes, and one end-to-end step shows phase 2 as two did.
BUILT_IN_RUN = (
    "model.init.hidden_size=256", "model.init.intermediate_size=512", "model.init.num_attention_heads=4",
    "model.init.num_key_value_heads=2", "model.init.head_dim=64",
    "data.phase1_files=[bundled:elementwise]", "data.phase2_files=[bundled:elementwise]",
    "data.max_prompt_length=368", "rollout.gen_length=256", "rollout.temperature=0.5", "rollout.group_size=8",
    "rollout.prompts_per_step=4", "train.steps=5", "curriculum.phase1_steps=4", "algo.advantage=drgrpo",
    "algo.kl_reference=reference", "algo.kl_beta=0.05", "pipeline.overlap=false", "optimizer.lr=3.0e-4")


def load(config_path: str | None, overrides: list[str]):
  """The resolved RLConfig: the built-in run (or the file), then the overrides."""
  from dice_jax.config import apply_overrides, from_dict, read_yaml, to_dict
  from dice_jax.rl.config import RLConfig

  data = read_yaml(config_path) if config_path else apply_overrides(RLConfig, to_dict(RLConfig()), BUILT_IN_RUN)
  data = apply_overrides(RLConfig, data, overrides)
  return from_dict(RLConfig, data)


def run(args: argparse.Namespace) -> int:
  training.configure_logging(args.log_level, quiet=("absl", "jax"))
  cfg, code = training.resolve("dice train", lambda: load(args.config, args.overrides), args.print_config,
                               where=f"{args.config}: " if args.config else "")
  if cfg is None:
    return code
  from dice_jax.data.problems import ProblemLoadError  # pylint: disable=import-outside-toplevel
  from dice_jax.data.sft_data import SFTDataError  # pylint: disable=import-outside-toplevel
  from dice_jax.rl.warm_start_run import train  # pylint: disable=import-outside-toplevel
  from dice_jax.verifier.connect import UNAVAILABLE  # pylint: disable=import-outside-toplevel

  return training.run("dice train", train, cfg, StopFlag(), usage_errors=(ProblemLoadError, SFTDataError),
                      errors={UNAVAILABLE: (Exit.VERIFIER, "verifier: ")}, finished=_finished, exported="policy")


def _finished(result) -> Exit | None:
  """The summary tables and the curves; a run that had nothing left to do says so and exits OK."""
  from dice_jax.rl.summary import print_summary  # pylint: disable=import-outside-toplevel

  print_summary(result)
  if result.history:
    _plot(result.run_dir)
  if result.status == "done" and result.step == result.start_step:
    print(f"dice train: {result.run_dir} had already finished its {result.step} steps; nothing to do (raise "
          "train.steps=, or give another run_dir=)", file=sys.stderr)
    return Exit.OK
  return None


def _plot(run_dir: str) -> None:
  """Draws `dice plot`'s curves into <run_dir>/plots and says where the learning curves are."""
  from dice_jax.rl.plots import PlotError, plot_run  # pylint: disable=import-outside-toplevel

  try:
    written = plot_run(run_dir)
  except (PlotError, OSError) as e:
    print(f"dice train: no curves drawn: {e}", file=sys.stderr)
    return
  folder = written[0].parent
  print(f"dice train: curves in {folder}/: phase_rates.png (format, compile and correct rates per step, per "
        f"phase), rewards.png, {', '.join(p.name for p in written if p.name not in ('phase_rates.png', 'rewards.png'))}",
        file=sys.stderr)
