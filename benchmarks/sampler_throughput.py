"""Sampler throughput: KV-cached block diffusion vs recomputing the canvas, against the rooflines.

Random bf16 weights of an SDAR shape (its config.json), static mode, one token per step
(steps_per_block = block_size), temperature 1.0, no EOS (every row generates the full length).
Phases (each prints as it finishes; the table comes last):
  gen      `dice_jax.sampler.generate` end to end: batch x prompt, gen tokens -> generated tokens/s.
           The prompt prefill is timed on its own, so (total - prefill) / passes is the time of one
           forward pass = one denoising step (a block's first step also runs the finished block
           before it, storing its k/v: there are no separate cache passes). Per-pass bytes (weights
           + valid cached KV read) and FLOPs give the HBM roofline (4.8 TB/s datasheet, and a copy
           bandwidth measured here) and the compute roofline (989 TFLOP/s datasheet, and a measured
           matmul).
  nocache  the reference sampler that recomputes the whole canvas each denoising step
           (kv_cache=False, block-causal mask, cuDNN attention): one step timed, times the steps.
  long     gen = 4096 at the largest batch that fits: the cached loop timed over windows of
           blocks at its start and near its end (per-pass cost is linear in the valid
           context), extrapolated over the rollout; the no-cache step likewise.
The no-cache totals (and the long cached total) are extrapolations from timed steps, as printed.

  # GPU, from the repository root (the config is carried: ../shared does not travel); ~4-5 min
  PYTHONPATH=. python3 benchmarks/sampler_throughput.py --config .carry/sdar-4b-config.json
  # CPU smoke test at a toy shape (~2 min here)
  python benchmarks/sampler_throughput.py --tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.94")  # the long phase sizes its batch to fit

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from dice_jax.model import transformer  # noqa: E402
from dice_jax.model.config import ModelConfig  # noqa: E402
from dice_jax.sampler import SamplerConfig, decode_attention, generate  # noqa: E402
from dice_jax.sampler.block import BlockSampler  # noqa: E402
from dice_jax.sampler.config import resolve  # noqa: E402

HBM_DATASHEET = 4.8e12  # H200 bytes/s
BF16_DATASHEET = 989e12  # H200 dense bf16 FLOP/s
TINY = dict(model_type="sdar", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_size=4, mask_token_id=511,
            eos_token_id=1, max_position_embeddings=512, rope_theta=1e6)


def _timed(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def copy_bandwidth(nbytes: int) -> float:
  """Bytes/s of an elementwise pass over a bf16 buffer, counting bytes read plus bytes written."""
  x = jax.random.normal(jax.random.key(0), (nbytes // 2,), jnp.bfloat16)
  f = jax.jit(lambda x: x * 2 + 1)
  f(x).block_until_ready()
  return 2 * nbytes / float(np.median([_timed(f, x) for _ in range(10)]))


def matmul_rate(n: int) -> float:
  a, b = (jax.random.normal(k, (n, n), jnp.bfloat16) for k in jax.random.split(jax.random.key(1)))
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  return 2 * n**3 / float(np.median([_timed(f, a, b) for _ in range(10)]))


@dataclasses.dataclass(frozen=True)
class Work:
  """What one rollout of this shape does, counted from the loop's structure (every row: full length)."""
  passes: int  # forward passes (= denoising steps: a block's first pass also stores the previous block)
  steps: int  # denoising steps
  weight_bytes: float  # per pass (the embedding is gathered, not read)
  kv_bytes: float  # per pass, average over the rollout (valid cached keys read, k and v, every layer)
  matmul_flops: float  # per pass, average: projections, MLP (b + 1 tokens a row on average), lm_head (b)
  attention_flops: float  # per pass, average: q.k and p.v over the valid keys

  @property
  def flops(self) -> float:
    return self.matmul_flops + self.attention_flops

  def phase_floor(self, bandwidth: float, rate: float) -> float:
    """Seconds if the matmuls and the attention (separate kernels, run one after the other) each ran at
    their own bound: max(weight bytes, matmul FLOPs) + max(KV bytes, attention FLOPs)."""
    return (max(self.weight_bytes / bandwidth, self.matmul_flops / rate)
            + max(self.kv_bytes / bandwidth, self.attention_flops / rate))


def count_work(mc: ModelConfig, batch: int, prompt: int, gen: int) -> Work:
  b = mc.block_size
  if prompt % b:
    raise ValueError("the roofline counts assume a prompt length that is a multiple of block_size")
  blocks = -(-gen // b)
  steps = passes = blocks * b  # one token per step
  # Block j's first pass runs 2b tokens (block j - 1 clean, block j noisy) and reads the cached prefix
  # before block j - 1; its other b - 1 passes run b tokens and read the prefix before block j. The
  # pass's own tokens' keys (fresh, b or 2b) are not read from memory.
  read = np.array([[prompt + (j - 1) * b] + [prompt + j * b] * (b - 1) for j in range(blocks)], float)
  queries = np.array([[2 * b] + [b] * (b - 1)] * blocks, float)
  scores = queries * (read + queries)  # query x key pairs (fresh keys included, both blocks: an upper bound)
  d, h, g, k, f, v = (mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.intermediate_size,
                      mc.vocab_size)
  layer = d * h * k + 2 * d * g * k + h * k * d + 3 * d * f
  tokens = batch * float(queries.mean())
  return Work(passes=passes, steps=steps,
              weight_bytes=2.0 * (mc.num_layers * layer + d * v),
              kv_bytes=2.0 * 2 * mc.num_layers * g * k * batch * float(read.mean()),
              matmul_flops=2.0 * (tokens * mc.num_layers * layer + batch * b * d * v),
              attention_flops=4.0 * batch * h * k * float(scores.mean()) * mc.num_layers)


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def run_prefill(graphdef, state, prompt_BxP, lengths_B, config):
  """Only the sampler's set-up: canvas, cache allocation and the prompt prefill (a checksum of slots the
  prefill wrote, so that it is not optimised away)."""
  sampler = BlockSampler(graphdef, state, config, resolve(config, nnx.merge(graphdef, state).config))
  _, st = sampler.init(prompt_BxP, lengths_B)
  return sum(jnp.sum(k[:, :, 0, 0].astype(jnp.float32) + v[:, :, 0, 0]) for k, v in st.cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def run_window(graphdef, state, prompt_BxP, lengths_B, rng, first_block_offset, num_blocks, config):
  """Prefill, then `num_blocks` whole blocks (all their steps) starting `first_block_offset` blocks in."""
  sampler = BlockSampler(graphdef, state, config, resolve(config, nnx.merge(graphdef, state).config))
  layout, st = sampler.init(prompt_BxP, lengths_B)
  st = st.replace(block=st.block + first_block_offset)
  st = jax.lax.fori_loop(0, num_blocks, lambda i, s: sampler.block(layout, rng, s), st)
  return st.step, st.canvas_BxS[:, :8]


@functools.partial(jax.jit, static_argnames=("graphdef", "config"))
def run_steps(graphdef, state, prompt_BxP, lengths_B, rng, num_steps, config):
  """Set-up, then `num_steps` denoising steps of the first block (the no-cache reference's step)."""
  sampler = BlockSampler(graphdef, state, config, resolve(config, nnx.merge(graphdef, state).config))
  layout, st = sampler.init(prompt_BxP, lengths_B)
  st = jax.lax.fori_loop(0, num_steps, lambda i, s: sampler.step(layout, rng, s), st)
  return st.step, st.canvas_BxS[:, :8]


def inputs(batch: int, prompt: int, vocab: int):
  tokens = jax.random.randint(jax.random.key(2), (batch, prompt), 2, vocab - 2, jnp.int32)
  return tokens, jnp.full((batch,), prompt, jnp.int32)


def window_times(graphdef, state, batch, prompt, gen, config, n: int, vocab: int) -> dict[str, float]:
  """Prefill time, and per-pass seconds measured at the start and near the end of the rollout (windows
  of whole blocks, n passes rounded up)."""
  p, lengths = inputs(batch, prompt, vocab)
  cfg = config.replace(gen_length=gen)
  t = time.perf_counter()
  compiled = run_window.lower(graphdef, state, p, lengths, jax.random.key(0), 0, 0, cfg).compile()
  compile_s = time.perf_counter() - t
  run = lambda offset, iters: _timed(compiled, state, p, lengths, jax.random.key(0), offset, iters)  # noqa: E731
  run(0, 1)
  prefill = min(run(0, 0) for _ in range(2))
  b = config.block_size
  blocks, window = -(-gen // b), -(-n // b)
  late = max(blocks - 1 - window, 0)
  start = (min(run(0, window) for _ in range(2)) - prefill) / (window * b)
  end = (min(run(late, window) for _ in range(2)) - prefill) / (window * b)
  return dict(compile_s=compile_s, prefill_s=prefill, start_pass_s=start, end_pass_s=end)


def compile_and_time_prefill(graphdef, state, p, lengths, config) -> float:
  compiled = run_prefill.lower(graphdef, state, p, lengths, config).compile()
  compiled(state, p, lengths).block_until_ready()
  return min(_timed(compiled, state, p, lengths) for _ in range(3))


def nocache_step(graphdef, state, batch, prompt, gen, config, vocab: int) -> tuple[float, float]:
  """(compile seconds, seconds per denoising step) of the recompute-everything reference."""
  p, lengths = inputs(batch, prompt, vocab)
  cfg = config.replace(gen_length=gen, kv_cache=False)
  t = time.perf_counter()
  compiled = run_steps.lower(graphdef, state, p, lengths, jax.random.key(0), 0, cfg).compile()
  compile_s = time.perf_counter() - t
  run = lambda steps: _timed(compiled, state, p, lengths, jax.random.key(0), steps)  # noqa: E731
  run(1)
  return compile_s, run(1) - run(0)


def largest_batch(mc: ModelConfig, prompt: int, gen: int, implementation: str, weight_bytes: float,
                  cap: int) -> int:
  """Rows whose KV cache fits beside two copies of the weights and a working reserve."""
  stats = jax.devices()[0].memory_stats() or {}
  limit = stats.get("bytes_limit")
  if not limit:
    return cap
  length = decode_attention.cache_length(prompt + gen + 2 * mc.block_size, implementation)
  per_row = 2 * 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * length
  free = limit - 2 * weight_bytes - 24e9  # prefill k/v and activations, logits, the embedding table
  return int(max(8, min(cap, free // per_row // 8 * 8)))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--config", help="SDAR config.json (e.g. a carried copy of ../shared/models/sdar-4b-chat/)")
  ap.add_argument("--tiny", action="store_true", help="toy model and shapes: a CPU smoke test")
  ap.add_argument("--batch", type=int, default=128)
  ap.add_argument("--prompt", type=int, default=512)
  ap.add_argument("--gen", type=int, default=1024)
  ap.add_argument("--long-gen", type=int, default=4096)
  ap.add_argument("--long-batch", type=int, default=0, help="0: the largest that fits (capped at 256)")
  ap.add_argument("--window", type=int, default=40, help="passes per timing window (whole blocks)")
  ap.add_argument("--attention", default="auto", choices=("auto", "pallas", "xla"), help="cached decode kernel")
  ap.add_argument("--phases", default="gen,nocache,long")
  ap.add_argument("--json", help="also write the results here")
  args = ap.parse_args()
  phases = set(args.phases.split(","))
  if args.tiny:
    args.batch, args.prompt, args.gen, args.long_gen, args.window = 4, 16, 32, 64, 8
    hf = TINY
  elif args.config:
    hf = json.load(open(args.config))
  else:
    ap.error("give --config PATH (an SDAR config.json) or --tiny")
  mc = ModelConfig.from_hf_dict(hf, dtype="bfloat16", param_dtype="bfloat16")
  print(f"devices: {jax.devices()}  backend: {jax.default_backend()}  jax {jax.__version__}", flush=True)
  model = transformer.init_model(mc, seed=0)
  graphdef, state = nnx.split(model)
  print(f"model: {transformer.count_params(state) / 1e9:.2f} B params, {mc.num_layers} layers, "
        f"block {mc.block_size}", flush=True)
  bandwidth = copy_bandwidth(64 << 20 if args.tiny else 4 << 30)
  rate = matmul_rate(512 if args.tiny else 8192)
  print(f"measured: copy {bandwidth / 1e12:.2f} TB/s (read + write), bf16 matmul {rate / 1e12:.0f} TFLOP/s",
        flush=True)
  config = SamplerConfig(gen_length=args.gen, steps_per_block=mc.block_size, temperature=1.0, eos_ids=(),
                         decode_attention=args.attention)
  implementation = decode_attention.choose(args.attention)
  config = config.replace(block_size=mc.block_size)
  results: dict[str, float | str] = dict(batch=args.batch, prompt=args.prompt, gen=args.gen)
  results["optimisations"] = (
      "cached decode: one q/k/v and one gate/up matmul per layer (weights merged before the loop); each block's "
      "k/v stored by the next block's first step (no cache-filling passes); decode attention "
      f"'{implementation}'" + (f" over the cached prefix, key splits of {decode_attention.PALLAS_SPLIT}, all of a kv "
                               "head's query rows per program" if implementation == "pallas" else ""))
  print(f"optimisations: {results['optimisations']}", flush=True)
  rows: list[tuple[str, str]] = []
  work = count_work(mc, args.batch, args.prompt, args.gen)

  if "gen" in phases:
    p, lengths = inputs(args.batch, args.prompt, mc.vocab_size)
    t = time.perf_counter()
    try:
      compiled = generate.lower(graphdef, state, p, lengths, jax.random.key(0), config).compile()
    except Exception as e:  # noqa: BLE001  (report the kernel's failure, measure the fallback)
      if implementation != "pallas":
        raise
      print(f"!! Pallas decode attention failed to compile ({type(e).__name__}: {str(e)[:400]}); "
            "measuring XLA decode attention instead", flush=True)
      implementation, config = "xla", config.replace(decode_attention="xla")
      compiled = generate.lower(graphdef, state, p, lengths, jax.random.key(0), config).compile()
    results["gen_compile_s"] = time.perf_counter() - t
    memory = compiled.memory_analysis()
    if memory is not None:
      print(f"compiled generate: temp {memory.temp_size_in_bytes / 1e9:.1f} GB, arguments "
            f"{memory.argument_size_in_bytes / 1e9:.1f} GB", flush=True)
    rollout = compiled(state, p, lengths, jax.random.key(0))
    jax.block_until_ready(rollout)
    assert int(rollout.num_steps) == work.steps, (int(rollout.num_steps), work.steps)
    elapsed = _timed(compiled, state, p, lengths, jax.random.key(1))
    results.update(gen_s=elapsed, tokens_per_s=args.batch * args.gen / elapsed)
    print(f"gen: compile {results['gen_compile_s']:.0f} s; {args.batch} x {args.gen} tokens in {elapsed:.2f} s "
          f"= {results['tokens_per_s']:,.0f} tokens/s ({implementation} decode attention)", flush=True)
    rows.append(("generated tokens/s (batch %d, prompt %d, gen %d)" % (args.batch, args.prompt, args.gen),
                 f"{results['tokens_per_s']:,.0f}  (target >= 10,000)"))

    p_prefill = compile_and_time_prefill(graphdef, state, p, lengths, config)
    per_pass = (elapsed - p_prefill) / work.passes
    hbm = work.weight_bytes + work.kv_bytes
    roof = dict(hbm_datasheet=hbm / HBM_DATASHEET, hbm_measured=hbm / bandwidth,
                compute_datasheet=work.flops / BF16_DATASHEET, compute_measured=work.flops / rate)
    results.update(prefill_s=p_prefill, per_pass_s=per_pass, bytes_per_pass=hbm, flops_per_pass=work.flops,
                   **{f"roofline_{k}_s": v for k, v in roof.items()})
    print(f"prefill {p_prefill * 1e3:.0f} ms; {work.passes} passes ({work.steps} denoising steps) of "
          f"{per_pass * 1e3:.2f} ms", flush=True)
    floor = max(roof["hbm_datasheet"], roof["compute_datasheet"])
    rows += [
        ("time per forward pass (mean over the rollout)", f"{per_pass * 1e3:.2f} ms"),
        ("  bytes per pass: weights + valid KV", f"{work.weight_bytes / 1e9:.1f} + {work.kv_bytes / 1e9:.1f} GB"),
        ("  HBM roofline @4.8 TB/s datasheet", f"{roof['hbm_datasheet'] * 1e3:.2f} ms = "
         f"{roof['hbm_datasheet'] / per_pass:.0%} achieved  (target >= 50%)"),
        (f"  HBM roofline @{bandwidth / 1e12:.2f} TB/s measured copy", f"{roof['hbm_measured'] * 1e3:.2f} ms = "
         f"{roof['hbm_measured'] / per_pass:.0%} achieved"),
        ("  FLOPs per pass", f"{work.flops / 1e12:.2f} TFLOP"),
        ("  compute roofline @989 TFLOP/s datasheet", f"{roof['compute_datasheet'] * 1e3:.2f} ms = "
         f"{roof['compute_datasheet'] / per_pass:.0%} achieved"),
        (f"  compute roofline @{rate / 1e12:.0f} TFLOP/s measured", f"{roof['compute_measured'] * 1e3:.2f} ms = "
         f"{roof['compute_measured'] / per_pass:.0%} achieved"),
        ("  max(HBM, compute) datasheet floor", f"{floor * 1e3:.2f} ms = {floor / per_pass:.0%} achieved"),
        ("  matmuls then attention, each at its bound (measured ceilings)",
         f"{work.phase_floor(bandwidth, rate) * 1e3:.2f} ms = {work.phase_floor(bandwidth, rate) / per_pass:.0%}"
         " achieved")]

  if "nocache" in phases:
    compile_s, step_s = nocache_step(graphdef, state, args.batch, args.prompt, args.gen, config, mc.vocab_size)
    total = step_s * work.steps
    results.update(nocache_step_s=step_s, nocache_total_s=total)
    print(f"nocache: compile {compile_s:.0f} s, {step_s:.3f} s per step -> {total:.0f} s for {work.steps} steps",
          flush=True)
    if "gen_s" in results:
      results["speedup"] = total / results["gen_s"]
      rows.append((f"cache vs no-cache at gen {args.gen} (no-cache extrapolated)", f"{results['speedup']:.1f}x"))

  if "long" in phases:
    long_work = count_work(mc, 1, args.prompt, args.long_gen)
    batch = args.long_batch or largest_batch(mc, args.prompt, args.long_gen, implementation,
                                             long_work.weight_bytes, 256 if not args.tiny else args.batch)
    for _ in range(3):
      try:
        w = window_times(graphdef, state, batch, args.prompt, args.long_gen, config, args.window, mc.vocab_size)
        break
      except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
          raise
        batch = max(8, int(batch * 0.8) // 8 * 8)
        print(f"long: out of memory, retrying at batch {batch}", flush=True)
    long_work = count_work(mc, batch, args.prompt, args.long_gen)
    cached = w["prefill_s"] + long_work.passes * (w["start_pass_s"] + w["end_pass_s"]) / 2
    compile_s, step_s = nocache_step(graphdef, state, batch, args.prompt, args.long_gen, config, mc.vocab_size)
    nocache = step_s * long_work.steps
    results.update(long_batch=batch, long_cached_s=cached, long_nocache_s=nocache, long_speedup=nocache / cached,
                   long_tokens_per_s=batch * args.long_gen / cached)
    print(f"long: batch {batch}; cached pass {w['start_pass_s'] * 1e3:.2f} -> {w['end_pass_s'] * 1e3:.2f} ms, "
          f"~{cached:.0f} s total; no-cache {step_s:.2f} s/step -> ~{nocache:.0f} s", flush=True)
    rows += [(f"cache vs no-cache at gen {args.long_gen}, batch {batch} (both extrapolated)",
              f"{nocache / cached:.1f}x  (target >= 10x)"),
             (f"  generated tokens/s at gen {args.long_gen}", f"{batch * args.long_gen / cached:,.0f}")]

  print("\n" + "\n".join(f"{name:<62} {value}" for name, value in rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
