"""One real sharded SFT train step (loss + grad + AdamW update) of dice_jax's model over a device mesh.

Parameters are created already sharded (`init_model(..., mesh)`), the optimizer state follows the
parameter shardings, the batch is split over data x fsdp, and the step is jitted once with explicit
in/out shardings and donated state. Prints the compiled memory analysis, the loss of each step,
the time per step, and checks that the loss is finite and decreases on a repeated batch.

With --compare-one-device the same steps (same weights, global batch and noise) then run on the
first device alone, and the script prints the largest loss difference per step (the sharded step
must match within float noise: 2e-2 in bf16, 1e-4 in float32) and the scaling: one device's step
time over the mesh's, and that over the number of devices.

  python benchmarks/model_sharded_step.py --mesh 1,2,1 --compare-one-device   # 2 GPUs, FSDP
  python benchmarks/model_sharded_step.py --mesh 2,1,1 --compare-one-device   # 2 GPUs, data parallel
  python benchmarks/model_sharded_step.py --mesh 1,1,2                 # 2 GPUs, tensor parallel
  python benchmarks/model_sharded_step.py --tiny --cpu-devices 8 --mesh 2,2,2   # 8 fake CPU devices
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor sizes (one may be -1: the rest)")
  parser.add_argument("--tiny", action="store_true", help="toy model (2 layers, hidden 64) and sequence 32")
  parser.add_argument("--cpu-devices", type=int, default=0, help="fake this many CPU devices (before JAX starts)")
  parser.add_argument("--preset", default="qwen3-1.7b", choices=("qwen3-1.7b", "sdar-4b"), help="model dimensions")
  parser.add_argument("--objective", default="two_copy", choices=("two_copy", "masked"))
  parser.add_argument("--batch", type=int, default=None, help="global batch (default: 2 per data x fsdp shard)")
  parser.add_argument("--seq", type=int, default=None, help="sequence length (default 2048; tiny 32)")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--remat", default="full", help="remat policy (default full: fits the 4B preset on 2 GPUs)")
  parser.add_argument("--compare-one-device", action="store_true",
                      help="then run the same steps on the first device alone: loss difference and scaling")
  args = parser.parse_args(argv)
  if args.cpu_devices:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.cpu_devices}").strip()

  import jax  # after XLA_FLAGS
  import numpy as np

  from dice_jax import sharding
  from dice_jax.model.config import ModelConfig

  presets = {
      "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
                         num_kv_heads=8, head_dim=128),
      "sdar-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                      num_kv_heads=8, head_dim=128),
      "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16),
  }
  dims = presets["tiny" if args.tiny else args.preset]
  gpu = jax.default_backend() == "gpu"
  cfg = ModelConfig(architecture="sdar", **dims, qk_norm=True, attention="block_causal", block_size=4,
                    mask_token_id=dims["vocab_size"] - 1, dtype="bfloat16" if gpu else "float32",
                    param_dtype="float32", remat=args.remat)
  mesh = sharding.make_mesh(*(int(x) for x in args.mesh.split(",")))
  data_ways = mesh.shape["data"] * mesh.shape["fsdp"]
  batch = args.batch or 2 * data_ways
  length = args.seq or (32 if args.tiny else 2048)
  print(f"devices: {jax.devices()}\nmesh {dict(mesh.shape)}; model {args.preset if not args.tiny else 'tiny'} "
        f"({cfg.dtype} compute, {cfg.param_dtype} params, remat {cfg.remat}); objective {args.objective}; "
        f"batch {batch} x {length}", flush=True)
  rng = np.random.default_rng(0)
  tokens_np = rng.integers(0, cfg.vocab_size - 1, (batch, length))

  def run(mesh, label: str) -> tuple[list[float], list[float], bool]:
    """Initialise on `mesh`, compile, take the steps: (losses, step seconds, stayed sharded)."""
    print(f"--- {label}: mesh {dict(mesh.shape)}", flush=True)
    return run_steps(args, cfg, mesh, tokens_np)

  losses, times, sharded = run(mesh, "sharded")
  ok = all(np.isfinite(losses)) and losses[-1] < losses[0] and sharded
  print(f"{'OK' if ok else 'FAILED'}: losses {' -> '.join(f'{x:.4f}' for x in losses)} "
        f"(same batch and noise each step, so the loss must fall); parameters stayed sharded: {sharded}")
  if args.compare_one_device:
    one = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    one_losses, one_times, _ = run(one, "one device")
    tol = 2e-2 if cfg.dtype == "bfloat16" else 1e-4
    diff = max(abs(a - b) for a, b in zip(losses, one_losses))
    step_s, one_s = float(np.median(times[1:] or times)), float(np.median(one_times[1:] or one_times))
    n = mesh.devices.size
    print(f"one device: losses {' -> '.join(f'{x:.4f}' for x in one_losses)}; largest difference "
          f"{diff:.2e} (tolerance {tol:g}): {'same loss' if diff <= tol else 'DIFFERENT'}")
    print(f"step time: {n} devices {step_s * 1e3:.1f} ms, one device {one_s * 1e3:.1f} ms; scaling "
          f"{one_s / step_s:.2f}x on {n} devices ({one_s / step_s / n:.0%} of linear)")
    ok = ok and diff <= tol
  return 0 if ok else 1


def run_steps(args, cfg, mesh, tokens_np) -> tuple[list[float], list[float], bool]:
  """One mesh's run: sharded init, the compiled step, `args.steps` steps on the same batch
  (imports here: `main` sets XLA_FLAGS before JAX is first imported)."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from dice_jax import sharding
  from dice_jax.diffusion.objectives import diffusion_loss
  from dice_jax.model.transformer import count_params, init_model

  t0 = time.perf_counter()
  model = init_model(cfg, mesh=mesh, seed=0)
  graphdef, state = nnx.split(model)
  del model
  jax.block_until_ready(state)
  print(f"init (sharded): {count_params(state) / 1e9:.3f} B params in {time.perf_counter() - t0:.1f}s; "
        f"e.g. gate_proj {state['layers']['mlp']['gate_proj'][...].sharding.spec}", flush=True)

  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4 if args.tiny else 1e-5, weight_decay=0.01))
  param_shardings = sharding.state_shardings(state, mesh)
  # Adam moments are Variables carrying their parameter's logical axes: sharded the same way.
  opt_shardings = sharding.state_shardings(jax.eval_shape(tx.init, state), mesh)
  opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(state)
  print(f"Adam mu of gate_proj: {opt_state[1][0].mu['layers']['mlp']['gate_proj'][...].sharding.spec}", flush=True)
  batch_sharding = sharding.batch_sharding(mesh)

  def train_step(state, opt_state, tokens, response, rng):
    def loss_fn(s):
      return diffusion_loss(graphdef, s, tokens, response, rng, objective=args.objective)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state)
    updates, opt_state = tx.update(grads, opt_state, state)
    return optax.apply_updates(state, updates), opt_state, loss, optax.global_norm(grads)

  step = jax.jit(train_step, in_shardings=(param_shardings, opt_shardings, batch_sharding, batch_sharding, None),
                 out_shardings=(param_shardings, opt_shardings, None, None), donate_argnums=(0, 1))
  batch, length = tokens_np.shape
  tokens = jax.device_put(jnp.asarray(tokens_np, jnp.int32), batch_sharding)
  response = jax.device_put(jnp.broadcast_to(jnp.arange(length) >= length // 4, (batch, length)), batch_sharding)
  with jax.set_mesh(mesh):
    t0 = time.perf_counter()
    compiled = step.lower(state, opt_state, tokens, response, jax.random.key(0)).compile()
    mem = compiled.memory_analysis()
    print(f"compiled in {time.perf_counter() - t0:.1f}s; per-device memory: " + (
        f"arguments {mem.argument_size_in_bytes / 2**30:.2f} GiB, temporaries {mem.temp_size_in_bytes / 2**30:.2f} "
        f"GiB, outputs {mem.output_size_in_bytes / 2**30:.2f} GiB" if mem is not None else "n/a"), flush=True)
    losses, times = [], []
    for i in range(args.steps):
      t0 = time.perf_counter()
      state, opt_state, loss, grad_norm = compiled(state, opt_state, tokens, response, jax.random.key(0))
      loss = float(loss)  # waits for the step
      times.append(time.perf_counter() - t0)
      losses.append(loss)
      print(f"step {i}: loss {loss:.4f}, grad norm {float(grad_norm):.3f}, {times[-1]:.2f}s", flush=True)
  sample = state["layers"]["mlp"]["gate_proj"][...]
  print(f"gate_proj after the steps: {sample.sharding.spec}", flush=True)
  return losses, times, sample.sharding == param_shardings["layers"]["mlp"]["gate_proj"].get_value()


if __name__ == "__main__":
  sys.exit(main())
