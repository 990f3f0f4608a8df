"""The decoder: embedding, a stack of pre-norm blocks scanned over layers, final norm, lm_head.

Run it as a pure function: split once outside jit, then jit over (graphdef, state):

    graphdef, state = nnx.split(model)
    logits_BxLxV = jax.jit(forward)(graphdef, state, tokens_BxL, masks.block_causal(4))

Inside a jitted step, `forward(graphdef, state, tokens_BxL, "two_copy")` with a constant kind name is
fine; as a *jit argument* pass an AttentionMask (a pytree whose kind is static) instead of a string.
`model(tokens_BxL, attention="block_causal")` is the same computation called eagerly.
Parameters are stacked over layers ([num_layers, ...]) whether or not `scan_layers` is on, so a
checkpoint, the sharding rules and the optimizer state look the same either way.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from dice_jax import sharding
from dice_jax.model import masks
from dice_jax.model.attention import Attention
from dice_jax.model.config import REMAT_POLICIES, ModelConfig
from dice_jax.model.layers import DENSE_INIT, MLP, RMSNorm, make_param

_cp = jax.checkpoint_policies
# Remat policy names (ModelConfig.remat) -> what the backward pass may keep instead of recomputing.
# cuDNN attention is a custom call, not a dot: every policy but "none" re-runs its forward pass
# (its softmax statistics are not saved), "minimal" included.
REMAT_POLICY_FNS = {
    "none": None,  # no rematerialisation: keep everything (fastest, most memory)
    "minimal": _cp.save_only_these_names(  # keep projection/attention/MLP outputs; recompute norms, RoPE, SwiGLU
        "query", "key", "value", "attn_out", "attn_proj", "mlp_gate", "mlp_up", "mlp_out"),
    "dots": _cp.dots_saveable,  # keep every matmul output
    "dots_no_batch": _cp.dots_with_no_batch_dims_saveable,  # keep almost nothing in a layer
    "full": _cp.nothing_saveable,  # keep only each layer's input
}
assert tuple(REMAT_POLICY_FNS) == REMAT_POLICIES, "config.REMAT_POLICIES and REMAT_POLICY_FNS disagree"

KVCache = tuple[jax.Array, jax.Array]  # (k, v), each [num_layers, B, S, G, K], rotated


class Block(nnx.Module):
  """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x)). Params stacked over layers."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    n, pdt, eps = config.num_layers, config.weight_dtype, config.rms_norm_eps
    self.input_norm = RMSNorm(config.hidden_size, eps, param_dtype=pdt, layers=n, rngs=rngs)
    self.attn = Attention(config, layers=n, rngs=rngs)
    self.post_attn_norm = RMSNorm(config.hidden_size, eps, param_dtype=pdt, layers=n, rngs=rngs)
    self.mlp = MLP(config, layers=n, rngs=rngs)

  def __call__(self, x_BxLxD, positions_BxL, mask, kv_prefix=None):
    h_BxLxD, kv = self.attn(self.input_norm(x_BxLxD), positions_BxL, mask, kv_prefix)
    x_BxLxD = sharding.constrain(x_BxLxD + h_BxLxD, ("batch", "length", "act_embed"))
    x_BxLxD = x_BxLxD + self.mlp(self.post_attn_norm(x_BxLxD))
    return sharding.constrain(x_BxLxD, ("batch", "length", "act_embed")), kv


class Transformer(nnx.Module):
  """SDAR/Qwen3/Qwen2/LLaMA/LLaDA decoder; see ModelConfig for what each architecture switches."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, v, pdt = config.hidden_size, config.vocab_size, config.weight_dtype
    self.config = config
    self.embed = make_param(rngs, DENSE_INIT, (v, d), ("vocab", "embed"), pdt)
    self.layers = Block(config, rngs=rngs)
    self.final_norm = RMSNorm(d, config.rms_norm_eps, param_dtype=pdt, rngs=rngs)
    if not config.tie_word_embeddings:
      self.lm_head = make_param(rngs, DENSE_INIT, (d, v), ("embed", "vocab"), pdt)

  def __call__(self, tokens_BxL: jax.Array, attention: str | masks.AttentionMask | None = None, *,
               positions_BxL: jax.Array | None = None, logits_slice: tuple[int, int] | None = None,
               kv_prefix: KVCache | None = None, return_kv: bool = False):
    """Logits BxLxV (float32) at every position, or at positions [logits_slice[0], logits_slice[1])
    (static ints: e.g. (0, L) keeps only the noisy half of a two-copy pass).

    attention: a kind name ("block_causal", "bidirectional", "causal", "two_copy") or an
      AttentionMask; default: the architecture's (config.attention).
    positions_BxL: RoPE positions; default 0..L-1 (two_copy: 0..L/2-1 twice).
    kv_prefix: cached (k, v) per layer, [num_layers, B, S, G, K], attended before these tokens;
      the mask must then cover S + L keys (masks.explicit).
    return_kv: also return this call's (k, v) per layer, [num_layers, B, L, G, K], for a cache.
    """
    cfg = self.config
    mask = masks.as_mask(cfg.attention if attention is None else attention, cfg.block_size)
    batch, length = tokens_BxL.shape
    if positions_BxL is None:
      positions_BxL = masks.default_positions(mask, batch, length)
    # Gather the fsdp-sharded embedding dim first (FSDP gathers every weight anyway) so the lookup
    # partitions cleanly: rows stay split over 'tensor', the batch over data x fsdp.
    table_VxD = sharding.constrain(self.embed[...], ("vocab", None))
    x_BxLxD = jnp.take(table_VxD, tokens_BxL, axis=0).astype(cfg.compute_dtype)
    x_BxLxD = sharding.constrain(x_BxLxD, ("batch", "length", "act_embed"))
    x_BxLxD, kv = self._run_layers(x_BxLxD, positions_BxL, mask, kv_prefix, return_kv)
    if cfg.logits_shift:  # Dream: hidden state i predicts token i+1; move it to position i+1
      x_BxLxD = jnp.concatenate([x_BxLxD[:, :1], x_BxLxD[:, :-1]], axis=1)
    if logits_slice is not None:
      x_BxLxD = x_BxLxD[:, logits_slice[0]:logits_slice[1]]
    x_BxLxD = self.final_norm(x_BxLxD)
    head_DxV = self.embed[...].T if cfg.tie_word_embeddings else self.lm_head[...]
    logits_BxLxV = jnp.einsum("bld,dv->blv", x_BxLxD, head_DxV.astype(cfg.compute_dtype),
                              preferred_element_type=jnp.float32)
    logits_BxLxV = sharding.constrain(logits_BxLxV, ("batch", "length", "act_vocab"))
    return (logits_BxLxV, kv) if return_kv else logits_BxLxV

  def _run_layers(self, x_BxLxD, positions_BxL, mask, kv_prefix, return_kv):
    cfg = self.config
    graphdef, layer_state = nnx.split(self.layers)

    def body(x, layer_and_prefix):
      params, prefix = layer_and_prefix
      x, kv = nnx.merge(graphdef, params)(x, positions_BxL, mask, prefix)
      return x, (kv if return_kv else None)

    if cfg.remat != "none":
      body = jax.checkpoint(body, policy=REMAT_POLICY_FNS[cfg.remat], prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      return jax.lax.scan(body, x_BxLxD, (layer_state, kv_prefix))
    kvs = []
    for i in range(cfg.num_layers):
      x_BxLxD, kv = body(x_BxLxD, jax.tree.map(lambda a: a[i], (layer_state, kv_prefix)))
      kvs.append(kv)
    return x_BxLxD, (jax.tree.map(lambda *a: jnp.stack(a), *kvs) if return_kv else None)


def forward(graphdef: nnx.GraphDef, state: nnx.State, tokens_BxL: jax.Array,
            attention: str | masks.AttentionMask | None = None, **kwargs):
  """The pure entry point: logits of the model (graphdef, state); kwargs as Transformer.__call__."""
  return nnx.merge(graphdef, state)(tokens_BxL, attention, **kwargs)


def abstract_model(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """Graph definition and parameter shapes/dtypes/logical axes, allocating nothing."""
  return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))


def single_device_mesh() -> Mesh:
  return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


@functools.cache
def _init_fn(config: ModelConfig, mesh: Mesh):
  """The jitted, sharded initialiser of one (config, mesh): compiled once per process."""
  _, abstract_state = abstract_model(config)

  def init(key):
    return nnx.state(Transformer(config, rngs=nnx.Rngs(params=key)))

  return jax.jit(init, out_shardings=sharding.state_shardings(abstract_state, mesh))


def init_model(config: ModelConfig, *, mesh: Mesh | None = None, seed: int = 0) -> Transformer:
  """A randomly initialised model whose parameters are created already sharded over `mesh`.

  Values depend on the seed only, not on the mesh (JAX's partitionable threefry).
  """
  mesh = mesh or single_device_mesh()
  graphdef, _ = abstract_model(config)
  return nnx.merge(graphdef, _init_fn(config, mesh)(jax.random.key(seed)))


def count_params(state: nnx.State) -> int:
  return sum(x.size for x in jax.tree.leaves(state))
