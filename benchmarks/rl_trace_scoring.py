"""TraceRL scoring cost: the structured multi_copy attention vs one dense explicit mask.

TraceRL re-scores every denoising state of a block-diffusion rollout in one forward pass over
[clean | C copies of the generated blocks] (dice_jax.rl.scoring). This times forward + backward of
the trace log-probs (what the update differentiates) with the multi_copy mask kind (clean part and
per-copy attention computed separately, masks [B,1,L,L] and [B,1,n,L+n]) against the same inputs
under a dense explicit [B, L + C n, L + C n] mask, checks the two agree, and prints both times and
their ratio. Reference run: the dense mask in the same script.

    python benchmarks/rl_trace_scoring.py                       # GPU: ~1.3B-like layer shapes, bf16
    python benchmarks/rl_trace_scoring.py --small               # CPU smoke (seconds)
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dice_jax.model import masks, transformer
from dice_jax.model.config import ModelConfig
from dice_jax.rl import logprobs, scoring
from dice_jax.rl.batch import RLBatch
from dice_jax.sampler.config import SamplerConfig, resolve


def _timed(fn, *args, repeats: int) -> tuple[float, jax.Array]:
  out = jax.block_until_ready(fn(*args))  # compile + warm-up
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best, out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--small", action="store_true", help="tiny shapes for a CPU check")
  parser.add_argument("--rows", type=int, default=None)
  parser.add_argument("--prompt", type=int, default=None, help="prompt tokens")
  parser.add_argument("--gen", type=int, default=None, help="generated tokens")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  if args.small:
    dims, dtype, rows, prompt, gen = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                          num_kv_heads=2, head_dim=16), "float32", 2, 96, 64
  else:
    dims, dtype, rows, prompt, gen = dict(hidden_size=2048, intermediate_size=6144, num_layers=4, num_heads=16,
                                          num_kv_heads=8, head_dim=128), "bfloat16", 2, 1024, 2048
  rows, prompt, gen = args.rows or rows, args.prompt or prompt, args.gen or gen
  config = ModelConfig(architecture="sdar", attention="block_causal", block_size=4, vocab_size=4096,
                       max_position_embeddings=prompt + gen + 8, mask_token_id=4095, eos_token_id=1,
                       pad_token_id=0, dtype=dtype, **dims)
  graphdef, params = nnx.split(transformer.init_model(config, seed=0))
  spec = resolve(SamplerConfig(gen_length=gen, steps_per_block=4), config)  # block 4, mask 4095, pad 0
  rng = np.random.default_rng(0)
  batch = RLBatch(prompt=jnp.asarray(rng.integers(2, 4000, (rows, prompt)), jnp.int32),
                  prompt_lengths=jnp.asarray(rng.integers(prompt // 2, prompt + 1, rows), jnp.int32),
                  tokens=jnp.asarray(rng.integers(2, 4000, (rows, gen)), jnp.int32),
                  valid=jnp.ones((rows, gen), bool), commit_rank=jnp.asarray(rng.integers(0, 4, (rows, gen)), jnp.int32),
                  old_logp=jnp.zeros((rows, gen), jnp.float32), score_keys=jnp.zeros((rows, 2), jnp.uint32))

  def structured(p):
    return jnp.sum(logprobs.policy_logprobs(graphdef, p, spec, "trace", batch)[0])

  def dense(p):
    prompt_ids, states, index = logprobs.ESTIMATORS["trace"](spec, batch, 0.0)
    tokens, positions, mask, gather = scoring.block_inputs(spec, prompt_ids, batch.prompt_lengths,
                                                           batch.tokens, states, index)
    length = tokens.shape[1]
    explicit = masks.explicit(jnp.broadcast_to(masks.dense(mask, length, length), (rows, length, length)))
    model = nnx.merge(graphdef, p)
    hidden = model.hidden_states(tokens, explicit, positions_BxL=positions)
    x = jnp.take_along_axis(hidden, gather[..., None], axis=1)
    return jnp.sum(scoring._token_stats(model, x, batch.tokens, 1.0)[0])  # pylint: disable=protected-access

  results = {}
  for name, fn in (("multi_copy", structured), ("dense", dense)):
    step = jax.jit(jax.value_and_grad(fn))
    seconds, (value, _) = _timed(step, params, repeats=args.repeats)
    results[name] = (seconds, float(value))
  tokens = rows * (prompt + gen + 4 + 4 * (gen + 4))
  (t_s, v_s), (t_d, v_d) = results["multi_copy"], results["dense"]
  print(f"{jax.devices()[0].device_kind}: {rows} rows x ({prompt} prompt + {gen} generated), 4 states per block, "
        f"~{tokens} tokens per pass")
  print(f"trace log-prob fwd+bwd  multi_copy {t_s * 1e3:9.1f} ms   dense mask {t_d * 1e3:9.1f} ms   "
        f"speedup {t_d / t_s:5.2f}x   |sum logp| diff {abs(v_s - v_d) / max(abs(v_d), 1):.1e} (relative)")
  print(json.dumps({"multi_copy_ms": t_s * 1e3, "dense_ms": t_d * 1e3, "speedup": t_d / t_s}))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
