"""SFT train-step throughput and MFU of dice_jax's model, against a plain-JAX reference in the same run.

Default shape: Qwen3-1.7B / SDAR-1.7B dimensions (hidden 2048, 28 layers, 16 heads, 8 kv heads,
head_dim 128, intermediate 6144, vocab 151936), sequence 2048, bf16 compute, float32 master
weights, AdamW with global-norm clipping, one device, remat "none" by default. Three steps are
measured, all at the same batch (default 4 sequences: the two-copy step's 2L-token forward pass
must fit without remat too) and the same remat policy:

  reference       a straightforward scan-over-layers transformer written in plain JAX (same weights,
                  same loss), jax.nn.dot_product_attention with cuDNN, bidirectional
  bidirectional   dice_jax: the masked-diffusion (LLaDA) objective, bidirectional attention (one
                  cuDNN flash call per layer, no mask)
  two_copy        dice_jax: SDAR's block-diffusion objective on [x_t | x_0] (2L tokens per sequence),
                  attention_impl auto: on GPU the block-sparse Triton kernel (dice_jax.model.
                  flash_attention: only tiles with an allowed pair, no L x L bias)
  two_copy_cudnn  the same step with attention_impl="cudnn": two cuDNN calls per layer with dense
                  bias masks (noisy queries over [x_t | x_0], clean block-causal): the path before

dice_jax's loss runs the lm_head and cross-entropy in sequence chunks straight from the hidden
states (dice_jax.diffusion.chunked_xent: no float32 BxLxV logits) and skips chunks without a
response token (here the first L/4 positions are the prompt); the reference materialises the logits
everywhere, as a straightforward step does. Both are charged the same model FLOPs.
MFU = model FLOPs / step time / peak (989e12, H200 bf16 dense). Model FLOPs = 6 * (matmul
parameters x tokens through them) + attention, where attention counts 12 * heads * head_dim per
*allowed* (query, key) pair (fwd + bwd), i.e. the mask's density: all pairs for bidirectional,
about half of the 2L x 2L pairs for the two-copy mask. Throughput is also given per training
sequence so the two objectives compare directly. Each step is lowered and compiled first and its
compiled memory analysis logged (and on GPU the number of cuDNN attention calls in its HLO), so a
shape that does not fit fails in seconds. The process may use 90% of the GPU's memory
(XLA_PYTHON_CLIENT_MEM_FRACTION, unless set).

  python benchmarks/model_mfu.py                 # on the GPU (the lead runs this); --batch 8 if it fits
  python benchmarks/model_mfu.py --tiny          # toy shape on CPU, checks the script works
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import re
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dice_jax.diffusion import losses, noising
from dice_jax.diffusion.objectives import diffusion_loss
from dice_jax.model import masks
from dice_jax.model.config import ModelConfig
from dice_jax.model.transformer import count_params, init_model

PEAK_FLOPS = 989e12  # H200 SXM, bf16 dense
QWEN3_1_7B = dict(architecture="sdar", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=28,
                  num_heads=16, num_kv_heads=8, head_dim=128, qk_norm=True, rope_theta=1e6, rms_norm_eps=1e-6,
                  attention="block_causal", block_size=4, mask_token_id=151669)
TINY = dict(QWEN3_1_7B, vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, mask_token_id=511)


# ---------------------------------------------------------------- plain-JAX reference (same math)
def _rms(x, w, eps):
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * w).astype(x.dtype)


def _rope(x, pos, theta):
  k = x.shape[-1]
  freqs = pos[..., None].astype(jnp.float32) * (1.0 / theta ** (jnp.arange(0, k, 2, dtype=jnp.float32) / k))
  cos, sin = jnp.cos(jnp.concatenate([freqs, freqs], -1))[:, :, None], jnp.sin(jnp.concatenate([freqs, freqs], -1))[:, :, None]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, -1)
  return (x32 * cos + jnp.concatenate([-x2, x1], -1) * sin).astype(x.dtype)


def reference_logits(params, tokens, cfg: ModelConfig, impl):
  """Embedding, scan over layers (attention + SwiGLU, pre-norm), final norm, lm_head."""
  dt, eps = jnp.bfloat16, cfg.rms_norm_eps
  pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  x = params["embed"][tokens].astype(dt)

  def layer(x, p):
    h = _rms(x, p["input_norm"], eps)
    q = _rms(jnp.einsum("bld,dhk->blhk", h, p["q"].astype(dt)), p["q_norm"], eps)
    k = _rms(jnp.einsum("bld,dhk->blhk", h, p["k"].astype(dt)), p["k_norm"], eps)
    v = jnp.einsum("bld,dhk->blhk", h, p["v"].astype(dt))
    o = jax.nn.dot_product_attention(_rope(q, pos, cfg.rope_theta), _rope(k, pos, cfg.rope_theta), v,
                                     implementation=impl)
    x = x + jnp.einsum("blhk,hkd->bld", o, p["o"].astype(dt))
    h = _rms(x, p["post_norm"], eps)
    g = jnp.einsum("bld,df->blf", h, p["gate"].astype(dt))
    u = jnp.einsum("bld,df->blf", h, p["up"].astype(dt))
    return x + jnp.einsum("blf,fd->bld", jax.nn.silu(g) * u, p["down"].astype(dt)), None

  x, _ = jax.lax.scan(layer, x, params["layers"])
  return jnp.einsum("bld,dv->blv", _rms(x, params["final_norm"], eps), params["lm_head"].astype(dt)).astype(jnp.float32)


def reference_params(state):
  """The same weights as dice_jax's model, in the reference's plain dict."""
  a, l = state["layers"]["attn"], state["layers"]
  return {"embed": state["embed"][...], "final_norm": state["final_norm"]["weight"][...],
          "lm_head": state["lm_head"][...],
          "layers": {"input_norm": l["input_norm"]["weight"][...], "post_norm": l["post_attn_norm"]["weight"][...],
                     "q": a["q_proj"][...], "k": a["k_proj"][...], "v": a["v_proj"][...], "o": a["o_proj"][...],
                     "q_norm": a["q_norm"]["weight"][...], "k_norm": a["k_norm"]["weight"][...],
                     "gate": l["mlp"]["gate_proj"][...], "up": l["mlp"]["up_proj"][...],
                     "down": l["mlp"]["down_proj"][...]}}


def reference_loss(params, tokens, response, rng, cfg, impl):
  rate_rng, mask_rng = jax.random.split(rng)
  t = noising.sample_mask_rate(rate_rng, tokens.shape[0])
  noisy, masked = noising.mask_tokens(mask_rng, tokens, response, t, cfg.mask_token_id)
  return losses.masked_diffusion_loss(reference_logits(params, noisy, cfg, impl), tokens, masked, t, response)


# ---------------------------------------------------------------- measurement
@dataclasses.dataclass
class Result:
  name: str
  batch: int
  step_s: float
  flops: float
  first_loss: float = float("nan")
  error: str = ""


def model_flops(cfg: ModelConfig, n_params: int, batch: int, length: int, objective: str) -> float:
  """6 * matmul params * tokens + attention over the mask's allowed (query, key) pairs."""
  head_params = cfg.hidden_size * cfg.vocab_size
  body_params = n_params - 2 * head_params  # minus the embedding table and lm_head
  if objective == "two_copy":
    tokens_body, tokens_head, kind = 2 * length, length, masks.two_copy(cfg.block_size)
  else:
    tokens_body, tokens_head, kind = length, length, masks.bidirectional()
  pairs = float(jnp.sum(masks.dense(kind, tokens_body, tokens_body)))
  attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs
  return batch * (6 * (body_params * tokens_body + head_params * tokens_head) + attention)


def run_step(name, loss_fn, params, tx, batch, length, vocab, steps, warmup, flops) -> Result:
  """Compile (logging memory), warm up, then time `steps` AdamW steps."""
  opt_state = jax.jit(tx.init)(params)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, tokens, response, rng):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, response, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, vocab - 1, (batch, length)), jnp.int32)
  response = jnp.broadcast_to(jnp.arange(length) >= length // 4, (batch, length))
  t0 = time.perf_counter()
  compiled = step.lower(params, opt_state, tokens, response, jax.random.key(0)).compile()
  mem = compiled.memory_analysis()
  print(f"[{name}] compiled in {time.perf_counter() - t0:.1f}s; memory: "
        + (f"arguments {mem.argument_size_in_bytes / 2**30:.2f} GiB, outputs {mem.output_size_in_bytes / 2**30:.2f} GiB, "
           f"temporaries {mem.temp_size_in_bytes / 2**30:.2f} GiB, generated code {mem.generated_code_size_in_bytes / 2**20:.1f} MiB"
           if mem is not None else "n/a"), flush=True)
  if jax.default_backend() == "gpu":  # which attention kernels the step really runs (fwd + bwd)
    calls = collections.Counter(re.findall(r'custom_call_target="(__cudnn\$fmha\w*)"', compiled.as_text()))
    sparse = sorted(set(re.findall(r"block_sparse_attention_\w+", compiled.as_text())))
    print(f"[{name}] cuDNN attention calls in the compiled step: {dict(calls) or 'NONE'}; block-sparse Triton "
          f"kernels: {sparse or 'NONE'}", flush=True)
  losses_seen = []
  for i in range(warmup + steps):
    if i == warmup:
      jax.block_until_ready(params)
      t0 = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, tokens, response, jax.random.key(i))
    losses_seen.append(loss)
  jax.block_until_ready(params)
  step_s = (time.perf_counter() - t0) / steps
  values = [float(x) for x in losses_seen]
  if not all(np.isfinite(values)):
    raise FloatingPointError(f"non-finite loss: {values}")
  print(f"[{name}] {step_s * 1e3:.1f} ms/step, losses {values[0]:.3f} -> {values[-1]:.3f}", flush=True)
  return Result(name, batch, step_s, flops, values[0])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tiny", action="store_true", help="toy shape (CPU check): 2 layers, hidden 64, seq 64")
  parser.add_argument("--batch", type=int, default=None, help="sequences per step, every variant (default 4; tiny 2)")
  parser.add_argument("--two-copy-batch", type=int, default=None,
                      help="sequences per two-copy step (default: --batch; its forward pass holds 2L tokens each)")
  parser.add_argument("--seq", type=int, default=None, help="sequence length L (default 2048; tiny 64)")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant")
  parser.add_argument("--remat", default="none", help="dice_jax remat policy (none, minimal, dots, full, ...)")
  parser.add_argument("--attention-impl", default="auto", choices=("auto", "cudnn", "xla", "pallas"),
                      help="dice_jax attention kernel (auto: on GPU in bf16, cuDNN; block-sparse Triton for two-copy)")
  parser.add_argument("--variants", default="reference,bidirectional,two_copy,two_copy_cudnn",
                      help="comma-separated subset")
  args = parser.parse_args(argv)

  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")  # read when JAX first touches the GPU
  batch = args.batch or (2 if args.tiny else 4)
  two_copy_batch = args.two_copy_batch or batch
  length = args.seq or (64 if args.tiny else 2048)
  cfg = ModelConfig(**(TINY if args.tiny else QWEN3_1_7B), dtype="bfloat16", param_dtype="float32", remat=args.remat,
                    attention_impl=args.attention_impl)
  gpu = jax.default_backend() == "gpu"
  impl = "cudnn" if gpu else "xla"
  print(f"devices: {jax.devices()}; jax {jax.__version__}; model {cfg.architecture} hidden {cfg.hidden_size} "
        f"layers {cfg.num_layers} vocab {cfg.vocab_size}; seq {length}; batch {batch} (two-copy {two_copy_batch}); "
        f"remat {cfg.remat}", flush=True)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5, weight_decay=0.01))
  results, n_params = [], 0
  unknown = set(args.variants.split(",")) - {"reference", "bidirectional", "two_copy", "two_copy_cudnn"}
  if unknown:
    parser.error(f"unknown variants {sorted(unknown)}")
  for name in args.variants.split(","):
    try:
      # two_copy_cudnn: the dense-bias path ("cudnn" needs a GPU; the CPU smoke test takes XLA's).
      variant_cfg = cfg.replace(attention_impl="cudnn" if gpu else "xla") if name == "two_copy_cudnn" else cfg
      model = init_model(variant_cfg, seed=0)
      graphdef, state = nnx.split(model)
      n_params = count_params(state)
      del model
      if name == "reference":
        params = reference_params(state)
        del state
        loss_fn = functools.partial(reference_loss, cfg=cfg, impl=impl)
        flops = model_flops(cfg, n_params, batch, length, "masked")
        results.append(run_step(name, loss_fn, params, tx, batch, length, cfg.vocab_size, args.steps, args.warmup,
                                flops))
        continue
      objective = "two_copy" if name.startswith("two_copy") else "masked"
      b = two_copy_batch if objective == "two_copy" else batch
      attention = None if objective == "two_copy" else "bidirectional"

      def loss_fn(state, tokens, response, rng, objective=objective, attention=attention, graphdef=graphdef):
        return diffusion_loss(graphdef, state, tokens, response, rng, objective=objective, attention=attention)

      flops = model_flops(cfg, n_params, b, length, objective)
      results.append(run_step(name, loss_fn, state, tx, b, length, cfg.vocab_size, args.steps, args.warmup, flops))
    except Exception as e:  # report and go on: the other variants still say something
      traceback.print_exc()
      results.append(Result(name, 0, float("nan"), 0.0, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))

  print(f"\nparams {n_params / 1e9:.3f} B; peak {PEAK_FLOPS / 1e12:.0f} TFLOP/s (H200 bf16); "
        f"MFU only meaningful on that GPU")
  print(f"{'variant':<14}{'batch':>6}{'ms/step':>10}{'seq/s':>9}{'TFLOP/s':>10}{'MFU':>8}{'vs ref':>8}")
  ref = next((r for r in results if r.name == "reference" and not r.error), None)
  by_name = {r.name: r for r in results}
  for r in results:
    if r.error:
      print(f"{r.name:<14} FAILED: {r.error}")
      continue
    tflops = r.flops / r.step_s / 1e12
    vs_ref = f"{ref.step_s / r.step_s * r.batch / ref.batch:.2f}x" if ref and r.name == "bidirectional" else ""
    print(f"{r.name:<14}{r.batch:>6}{r.step_s * 1e3:>10.1f}{r.batch / r.step_s:>9.2f}{tflops:>10.1f}"
          f"{r.flops / r.step_s / PEAK_FLOPS:>8.1%}{vs_ref:>8}")
  bidi, two = by_name.get("bidirectional"), by_name.get("two_copy")
  if ref and bidi and not bidi.error:  # same weights, same noise: the reference computes the same loss
    print(f"first-step loss: reference {ref.first_loss:.4f}, bidirectional {bidi.first_loss:.4f}")
  if bidi and two and not bidi.error and not two.error:
    cost = (two.step_s / two.batch) / (bidi.step_s / bidi.batch)
    print(f"two_copy costs {cost:.2f}x the bidirectional step per training sequence")
  dense = by_name.get("two_copy_cudnn")
  if two and dense and not two.error and not dense.error:
    print(f"two_copy, block-sparse kernel vs dense-bias cuDNN: {dense.step_s / two.step_s:.2f}x faster per step")
  if gpu and bidi and not bidi.error:
    mfu = bidi.flops / bidi.step_s / PEAK_FLOPS
    print(f"target bidirectional MFU >= 50%: {'met' if mfu >= 0.5 else 'NOT met'} ({mfu:.1%})")
    if ref:
      speed = ref.step_s / bidi.step_s
      print(f"target >= 1.05x the plain reference: {'met' if speed >= 1.05 else 'NOT met'} ({speed:.2f}x)")
  if gpu and two and not two.error:
    mfu = two.flops / two.step_s / PEAK_FLOPS
    print(f"target two_copy MFU >= 45%: {'met' if mfu >= 0.45 else 'NOT met'} ({mfu:.1%})")
  return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
  sys.exit(main())
