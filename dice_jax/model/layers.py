"""Building blocks: parameters with logical axes, RMSNorm, rotary embeddings, SwiGLU MLP.

Every parameter may be created *stacked*: with `layers=N` it gets a leading axis of N and the
logical name 'layers', so one module instance holds all N layers' weights and the transformer can
`lax.scan` over them. Inside the scan each module sees its per-layer slice, so the code below never
assumes the leading axis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from dice_jax.model.config import ModelConfig
from dice_jax.sharding import constrain

Initializer = Callable[..., jax.Array]


def make_param(rngs: nnx.Rngs, init: Initializer, shape: Sequence[int], axes: Sequence[str | None],
               dtype: jnp.dtype, layers: int | None = None) -> nnx.Param:
  """An nnx.Param carrying logical axis names (stacked over `layers` when given)."""
  if layers is not None:
    shape, axes = (layers, *shape), ("layers", *axes)
  # Sharding is applied by dice_jax.sharding at creation (jit out_shardings), not eagerly by flax.
  return nnx.Param(init(rngs.params(), tuple(shape), dtype), out_sharding=tuple(axes), eager_sharding=False)


# HF's default initializer_range; only fresh (random) models use it.
DENSE_INIT: Initializer = nnx.initializers.normal(stddev=0.02)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm computed in float32 (as HF does), returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (x32 * weight.astype(jnp.float32)).astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis with a learned scale (HF `*.weight`)."""

  def __init__(self, dim: int, eps: float, *, param_dtype: jnp.dtype, layers: int | None = None,
               rngs: nnx.Rngs):
    self.eps = eps
    self.weight = make_param(rngs, nnx.initializers.ones, (dim,), ("norm",), param_dtype, layers)

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.weight[...], self.eps)


def rope_tables(positions_BxL: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """cos/sin of shape BxLxK (float32) for the HF 'rotate half' RoPE layout."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs_BxLxK2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
  emb_BxLxK = jnp.concatenate([freqs_BxLxK2, freqs_BxLxK2], axis=-1)
  return jnp.cos(emb_BxLxK), jnp.sin(emb_BxLxK)


def apply_rope(x_BxLxHxK: jax.Array, cos_BxLxK: jax.Array, sin_BxLxK: jax.Array) -> jax.Array:
  """Rotate q or k (float32 math, result in x's dtype): x*cos + rotate_half(x)*sin."""
  x = x_BxLxHxK.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  cos, sin = cos_BxLxK[:, :, None, :], sin_BxLxK[:, :, None, :]
  return (x * cos + rotated * sin).astype(x_BxLxHxK.dtype)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)). Weights stored [in, out] (HF stores [out, in])."""

  def __init__(self, config: ModelConfig, *, layers: int | None = None, rngs: nnx.Rngs):
    d, f, pdt = config.hidden_size, config.intermediate_size, config.weight_dtype
    init = DENSE_INIT
    self.dtype = config.compute_dtype
    self.gate_proj = make_param(rngs, init, (d, f), ("embed", "mlp"), pdt, layers)
    self.up_proj = make_param(rngs, init, (d, f), ("embed", "mlp"), pdt, layers)
    self.down_proj = make_param(rngs, init, (f, d), ("mlp", "embed"), pdt, layers)

  def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
    dt = self.dtype
    gate_BxLxF = checkpoint_name(jnp.einsum("bld,df->blf", x_BxLxD, self.gate_proj[...].astype(dt)), "mlp_gate")
    up_BxLxF = checkpoint_name(jnp.einsum("bld,df->blf", x_BxLxD, self.up_proj[...].astype(dt)), "mlp_up")
    h_BxLxF = constrain(jax.nn.silu(gate_BxLxF) * up_BxLxF, ("batch", "length", "act_mlp"))
    out_BxLxD = jnp.einsum("blf,fd->bld", h_BxLxF, self.down_proj[...].astype(dt))
    return checkpoint_name(out_BxLxD, "mlp_out")
