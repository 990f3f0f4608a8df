"""The decoder: embedding, a stack of pre-norm blocks scanned over layers, final norm, lm_head.

Run it as a pure function: split once outside jit, then jit over (graphdef, state):

    graphdef, state = nnx.split(model)
    logits_BxLxV = jax.jit(forward)(graphdef, state, tokens_BxL, masks.block_causal(4))

Inside a jitted step, `forward(graphdef, state, tokens_BxL, "two_copy")` with a constant kind name is
fine; as a *jit argument* pass an AttentionMask (a pytree whose kind is static) instead of a string.
`model(tokens_BxL, attention="block_causal")` is the same computation called eagerly.
Parameters are stacked over layers ([num_layers, ...]) whether or not `scan_layers` is on, so a
checkpoint, the sharding rules and the optimizer state look the same either way.

Training losses and RL scoring stop before the head: `model.hidden_states(...)` gives the final-norm
outputs, `model.logits(x)` / `model.head_weights()` apply or expose the lm_head, so a loss never
needs the full float32 BxLxV logits (dice_jax.diffusion.chunked_xent).
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

    Equals `self.logits(self.align_to_tokens(self.hidden_states(...)))[:, slice]`; the other
    arguments are those of `hidden_states`.
    """
    out = self.hidden_states(tokens_BxL, attention, positions_BxL=positions_BxL, kv_prefix=kv_prefix,
                             return_kv=return_kv)
    x_BxLxD, kv = out if return_kv else (out, None)
    x_BxLxD = self.align_to_tokens(x_BxLxD)
    if logits_slice is not None:
      x_BxLxD = x_BxLxD[:, logits_slice[0]:logits_slice[1]]
    logits_BxLxV = self.logits(x_BxLxD)
    return (logits_BxLxV, kv) if return_kv else logits_BxLxV

  def hidden_states(self, tokens_BxL: jax.Array, attention: str | masks.AttentionMask | None = None, *,
                    positions_BxL: jax.Array | None = None, kv_prefix: KVCache | None = None,
                    return_kv: bool = False):
    """What the lm_head multiplies: the last layer's output after the final norm, BxLxD (compute dtype).

    Position i holds the output *at* token i, not shifted for Dream-style models (`align_to_tokens`
    does that), so callers that gather a few positions before the head (RL scoring) index it
    directly, and a loss can run the head in chunks (dice_jax.diffusion.chunked_xent) instead of
    materialising BxLxV logits.

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
    x_BxLxD = self.final_norm(x_BxLxD)
    return (x_BxLxD, kv) if return_kv else x_BxLxD

  def align_to_tokens(self, x_BxLxD: jax.Array) -> jax.Array:
    """Dream (logits_shift): hidden state i predicts token i+1, so move it to position i+1 (position
    0 repeats state 0). Identity for every other architecture."""
    if not self.config.logits_shift:
      return x_BxLxD
    return jnp.concatenate([x_BxLxD[:, :1], x_BxLxD[:, :-1]], axis=1)

  def head_weights(self) -> jax.Array:
    """The lm_head as DxV in the parameter dtype (the embedding, transposed, when tied)."""
    return self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]

  def logits(self, x_BxLxD: jax.Array) -> jax.Array:
    """lm_head of hidden states: float32 BxLxV logits from a compute-dtype matmul."""
    head_DxV = self.head_weights().astype(self.config.compute_dtype)
    logits_BxLxV = jnp.einsum("bld,dv->blv", x_BxLxD.astype(self.config.compute_dtype), head_DxV,
                              preferred_element_type=jnp.float32)
    return sharding.constrain(logits_BxLxV, ("batch", "length", "act_vocab"))

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
      # The lambda runs at once, inside this iteration: it cannot see a later `i`.
      x_BxLxD, kv = body(x_BxLxD, jax.tree.map(lambda a: a[i], (layer_state, kv_prefix)))  # noqa: B023
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
