"""RL with rewards that actually flow: warm-start a small model by SFT, then `dice train` on it.

A random model never writes parseable code, so its RL rewards are all 0. This script first
fine-tunes (`dice sft`) a small byte-level SDAR-layout model on the bundled problems' phase-1
answers (prompt: the same compact infilling prompt RL uses; response: the known-good `source`
string in a fenced block), so it can reproduce them, then runs `dice train` from that checkpoint
on phase 1 (and a last phase-2 step) with the verifier on loopback. Sampling at temperature 1.0
from a model that learned the answers gives a mix of exact copies (which compile, and on a GPU
verifier pass correctness and get timed) and corrupted ones (which do not): every reward
component moves, and the policy gradient has signal. Nothing is faked: the verdicts are the real
verifier's, on what the model wrote.

    python benchmarks/rl_gpu_rewards.py --out /tmp/rl_gpu          # one H200: ~3-4 minutes
    python benchmarks/rl_gpu_rewards.py --out /tmp/rl_cpu --hidden 64 --layers 2 --problems 2 \
        --sft-steps 150 --rl-steps 2 --dtype float32                # CPU sanity check (slow)

Prints, per RL step: reward and each component, compile / correct rates, speedup, KL, entropy
and wait_frac; then the fraction of phase-1 responses that compiled and were correct.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
import time

from dice_jax.config import load_config


def write_sft_data(path: pathlib.Path, problems: int) -> int:
  """Phase-1 prompt/response pairs of the first `problems` bundled problems, as RL will prompt them."""
  from dice_jax.data import problems as problems_lib
  from dice_jax.data import prompts
  from dice_jax.rl.data import COMPACT_INFILLING

  rows = []
  for problem in problems_lib.load_bundled("tiny")[:problems]:
    user = prompts.infilling_messages(problem, template=COMPACT_INFILLING)[-1]["content"]
    rows.append({"prompt": user, "response": f"```python\n{problem.middle}\n```"})
  path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
  return len(rows)


def model_init(hidden: int, layers: int) -> dict:
  from dice_jax.rl.config import TINY_MODEL_INIT

  heads = max(hidden // 32, 2)
  return TINY_MODEL_INIT | {"hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
                            "num_attention_heads": heads, "num_key_value_heads": max(heads // 2, 1),
                            "head_dim": hidden // heads}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="work directory (SFT and RL run directories go here)")
  parser.add_argument("--problems", type=int, default=6, help="bundled problems to learn (1-6)")
  parser.add_argument("--hidden", type=int, default=384)
  parser.add_argument("--layers", type=int, default=6)
  parser.add_argument("--sft-steps", type=int, default=800)
  parser.add_argument("--rl-steps", type=int, default=5, help="RL steps (the last one end to end)")
  parser.add_argument("--sft-lr", type=float, default=3e-3)
  parser.add_argument("--sft-max-length", type=int, default=2816, help="prompt + answer tokens (all 6 fit 2816)")
  parser.add_argument("--temperature", type=float, default=0.7, help="rollout temperature (DICE: 1.0)")
  parser.add_argument("--dtype", default="bfloat16", help="compute dtype (float32 on CPU)")
  parser.add_argument("--verifier", default="local", help="`local` or HOST:PORT of a dice-verifier")
  args = parser.parse_args()
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  from dice_jax.cli.train import load
  from dice_jax.rewards import outcomes
  from dice_jax.rl.loop import run_rl
  from dice_jax.rl.summary import print_summary
  from dice_jax.train.sft_loop import SFTConfig, run_sft

  out = pathlib.Path(args.out).expanduser().resolve()
  out.mkdir(parents=True, exist_ok=True)
  count = write_sft_data(out / "sft.json", args.problems)
  init = model_init(args.hidden, args.layers)
  t0 = time.perf_counter()
  sft = load_config(SFTConfig, None, [
      f"run_dir={out / 'sft'}", "model.tokenizer=builtin:bytes", f"model.init={json.dumps(init)}",
      f"model.dtype={args.dtype}", f"data.train_files=[{out / 'sft.json'}]", f"data.max_length={args.sft_max_length}",
      f"data.batch_size={count}", f"train.steps={args.sft_steps}", f"optimizer.lr={args.sft_lr}",
      "optimizer.schedule=cosine",
      "optimizer.warmup_steps=20", "optimizer.min_lr_ratio=0.05", "checkpoint.every_steps=100000",
      "logging.every_steps=25"])
  result = run_sft(sft)
  sft_s = time.perf_counter() - t0
  print(f"SFT: {result.step} steps in {sft_s:.0f} s, final loss {result.metrics.get('loss', float('nan')):.4f}")
  rl = load(None, [
      f"run_dir={out / 'rl'}", f"model.path={result.hf_dir}", "model.init=null", "model.tokenizer=null",
      f"model.dtype={args.dtype}", "data.phase1_files=[bundled:tiny]", "data.phase2_files=[bundled:tiny]",
      "rollout.gen_length=1536", "rollout.prompts_per_step=2", "rollout.group_size=4",
      f"rollout.temperature={args.temperature}",
      f"train.steps={args.rl_steps}", f"curriculum.phase1_steps={max(args.rl_steps - 1, 1)}",
      "optimizer.lr=1e-5", "checkpoint.every_steps=100000", f"verifier.targets=[{args.verifier}]",
      "verifier.request_timeout_s=600"])
  t1 = time.perf_counter()
  outcome = run_rl(rl)
  print_summary(outcome)
  keys = ("reward", "reward/format", "reward/compile", "reward/correct", "reward/speedup", "compile", "correct",
          "speedup", "kl", "entropy", "wait_frac")
  print("step " + " ".join(f"{k:>14}" for k in keys))
  for record in outcome.history:
    print(f"{record['step']:>4} " + " ".join(f"{record[k]:>14.4f}" if k in record else f"{'-':>14}" for k in keys))
  for record in outcome.history:  # what the verifier said, counted (dice_jax.rewards.outcomes)
    print(f"step {record['step']} outcomes: {outcomes.describe(outcomes.from_metrics(record)) or '-'}")
  phase1 = [r for r in outcome.history if r.get("curriculum/phase2_share") == 0]
  compiled = sum(r.get("phase1/compile", 0.0) for r in phase1) / max(len(phase1), 1)
  correct = sum(r.get("phase1/correct", 0.0) for r in phase1) / max(len(phase1), 1)
  print(f"RL: {outcome.step} steps in {time.perf_counter() - t1:.0f} s; phase-1 responses compiled {compiled:.1%}, "
        f"correct {correct:.1%}; verifier: {outcome.verifier}")
  first = outcome.history[0] if outcome.history else {}
  print(f"first RL step: phase-1 responses compiled {first.get('phase1/compile', 0.0):.1%}, correct "
        f"{first.get('phase1/correct', 0.0):.1%} (targets: >= 80%, >= 50%)")
  print(json.dumps({"sft_s": round(sft_s, 1), "phase1_compile_rate": compiled, "phase1_correct_rate": correct,
                    "first_step_phase1_compile": first.get("phase1/compile"),
                    "first_step_phase1_correct": first.get("phase1/correct")}))
  return 0 if outcome.status == "done" else 1


if __name__ == "__main__":
  sys.exit(main())
