"""What the SFT loop costs on top of its compiled step: data, host-to-device, logging, checkpoints.

The step's own speed (MFU) is benchmarks/model_mfu.py. This measures the infrastructure around it,
in one process, on the same shape:

  bare step   the compiled SFT step called back to back on one batch already on the device
  sft loop    `run_sft` (dice sft) on synthetic prompt/response data: grain pipeline, host-to-global
              placement, metrics every `--log-every` steps, async orbax checkpoints every
              `--ckpt-every`; step time from metrics.jsonl timestamps, compile excluded
  checkpoint  saving the train state (params, AdamW moments, RNG, data position): the blocking
              part (device-to-host copy; training waits for it) and the total until committed

Target: loop step time within 5% of the bare step (the ratio printed last), checkpoint blocking
time a small fraction of the interval it is taken at.

  python benchmarks/sft_loop_overhead.py                  # tiny shape, CPU smoke run
  python benchmarks/sft_loop_overhead.py --shape 1.7b     # Qwen3-1.7B/SDAR-1.7B dims, seq 2048, GPU

The 1.7b shape keeps float32 params and AdamW moments (~21 GB) and writes them to a temporary
directory (at most two copies at a time): it needs ~45 GB of free disk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import string
import tempfile
import time

import jax

from dice_jax import sharding
from dice_jax.checkpoints import Checkpointer
from dice_jax.config import from_dict
from dice_jax.data import sft_data
from dice_jax.metrics_log import read_jsonl
from dice_jax.train import model_setup
from dice_jax.train.optim import make_optimizer
from dice_jax.train.sft_loop import SFTConfig, run_sft
from dice_jax.train.sft_step import make_sft_step
from dice_jax.train.step import compile_train_step
from dice_jax.train.train_state import abstract_state, create_train_state, state_shardings

SHAPES = {
    "tiny": dict(model=dict(model_type="sdar", vocab_size=264, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, block_size=4, mask_token_id=259),
                 seq=128, batch=4, dtype="float32", remat="none"),
    "1.7b": dict(model=dict(model_type="sdar", vocab_size=151936, hidden_size=2048,
                            intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=128, block_size=4, mask_token_id=259,
                            tie_word_embeddings=True, rope_theta=1e6),
                 seq=2048, batch=8, dtype="bfloat16", remat="full"),
}


def _write_data(path: str, seq: int, count: int = 64) -> None:
  """Random printable examples that fill most of `seq` byte-level tokens."""
  rng = random.Random(0)
  text = lambda n: "".join(rng.choice(string.ascii_letters + " ") for _ in range(n))  # noqa: E731
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(count):
      prompt_len = seq // 8
      f.write(json.dumps({"prompt": text(prompt_len), "response": text(seq - prompt_len - 48)}) + "\n")


def _config(args, shape, work: str) -> SFTConfig:
  data = os.path.join(work, "data.jsonl")
  _write_data(data, shape["seq"])
  return from_dict(SFTConfig, {
      "run_dir": os.path.join(work, "run"),
      "model": {"init": shape["model"], "tokenizer": "builtin:bytes", "dtype": shape["dtype"],
                "remat": shape["remat"]},
      "data": {"train_files": [data], "max_length": shape["seq"], "batch_size": shape["batch"]},
      "train": {"steps": args.steps, "export_hf": False},
      "checkpoint": {"every_steps": args.ckpt_every, "keep": 1},
      "logging": {"every_steps": args.log_every, "progress": False},
  })


def bare_step(cfg: SFTConfig, steps: int):
  """(seconds per step, state) of the compiled step alone, and the state for the checkpoint test."""
  mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
  config = model_setup.model_config(cfg.model)
  tokenizer, _ = model_setup.tokenizer_for(cfg.model, cfg.run_dir)
  data = sft_data.tokenize_files(cfg.data, tokenizer)
  batch_np = next(sft_data.make_iterator(data, cfg.data, tokenizer.pad_id))
  tx, schedule = make_optimizer(cfg.optimizer, cfg.train.steps)
  graphdef, abstract_params, params_sharding = model_setup.abstract_params(config, mesh)
  shardings = state_shardings(tx, params_sharding, abstract_params, mesh)
  target = abstract_state(tx, abstract_params, shardings)
  state = create_train_state(model_setup.load_params(cfg.model, config, mesh), tx, 0, shardings)
  step_fn, _ = make_sft_step(graphdef, config, cfg.train, tx, schedule)
  batch_sharding = sharding.batch_sharding(mesh, 2)
  batch = jax.device_put(batch_np, batch_sharding)
  compiled = compile_train_step(step_fn, target, jax.eval_shape(lambda: batch), shardings,
                                batch_sharding, mesh)
  for _ in range(2):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(3):  # best of three: the least disturbed by other load on the machine
    start = time.perf_counter()
    for _ in range(steps // 3):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times.append((time.perf_counter() - start) / (steps // 3))
  return min(times), state


def checkpoint_cost(state, directory: str) -> tuple[float, float, float]:
  """(blocking s, total s, GB) of saving `state` once."""
  gb = sum(x.nbytes for x in jax.tree.leaves(state)) / 1e9
  with Checkpointer(directory, every_steps=1, keep=1) as ckpt:
    start = time.perf_counter()
    ckpt.save(1, state, force=True)
    blocking = time.perf_counter() - start
    ckpt.wait()
    total = time.perf_counter() - start
  shutil.rmtree(directory)  # a 1.7B state is ~21 GB: do not keep it beside the loop's own
  return blocking, total, gb


def loop_step_time(cfg: SFTConfig) -> float:
  """Seconds per step of run_sft: the best interval between logged steps (compile excluded).

  Each interval holds `log_every` steps, one metrics fetch and one checkpoint save.
  """
  run_sft(cfg)
  records = read_jsonl(os.path.join(cfg.run_dir, "metrics.jsonl"))
  return min((b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(records, records[1:]))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
  parser.add_argument("--steps", type=int, default=30,
                      help="steps per measurement (the loop needs >= 2 logging intervals)")
  parser.add_argument("--log-every", type=int, default=10)
  parser.add_argument("--ckpt-every", type=int, default=10)
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  shape = SHAPES[args.shape]
  with tempfile.TemporaryDirectory() as work:
    cfg = _config(args, shape, work)
    bare, state = bare_step(cfg, args.steps)
    blocking, total, gb = checkpoint_cost(state, os.path.join(work, "ckpt"))
    del state
    loop = loop_step_time(cfg)
  tokens = shape["batch"] * shape["seq"]
  results = {"shape": args.shape, "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
             "batch": shape["batch"], "seq": shape["seq"], "bare_step_s": bare, "loop_step_s": loop,
             "loop_over_bare": loop / bare, "ckpt_state_gb": gb, "ckpt_blocking_s": blocking,
             "ckpt_total_s": total, "ckpt_every": args.ckpt_every,
             "ckpt_blocking_share": blocking / (args.ckpt_every * loop)}
  print(f"\nSFT loop overhead, {results['devices']}, {args.shape} shape, batch {shape['batch']} x "
        f"seq {shape['seq']} ({tokens} tokens/step)")
  print(f"  bare compiled step      {bare * 1e3:9.1f} ms")
  print(f"  run_sft loop step       {loop * 1e3:9.1f} ms   (data, placement, logging every "
        f"{args.log_every}, async checkpoint every {args.ckpt_every})")
  print(f"  checkpoint {gb:6.2f} GB    blocking {blocking:6.2f} s, committed after {total:6.2f} s "
        f"({100 * results['ckpt_blocking_share']:.1f}% of a {args.ckpt_every}-step interval)")
  print(f"  loop / bare ratio       {loop / bare:9.3f}   (target <= 1.05)")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
