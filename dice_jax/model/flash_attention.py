"""Flash attention over block-structured masks: block_causal, two_copy and multi_copy, with no L x L array.

    out_BxQxHxK = flash_attention(q_BxQxHxK, k_BxQxGxK, v_BxQxGxK, mask)   # differentiable

The mask is its layout (dice_jax.model.block_layout): a few integers per position and, per query
tile, the list of key tiles that hold an allowed pair. The kernels visit only those tiles; tiles
whose every pair is allowed run without mask arithmetic, the rest compute the rule in registers
from the positions' (group, block, slot). Nothing of size L x L exists, forward or backward: a
two-copy pass of 2n tokens visits ~n^2 query-key pairs (plus the diagonal tiles) instead of the
3n^2 that two dense-bias cuDNN calls compute, and a TraceRL multi_copy pass skips the other copies.

Kernels (Pallas; Triton on GPU, Pallas's interpreter elsewhere, which is how the CPU tests run
them): a forward pass (online softmax, base-2 exponent, saves the log-sum-exp), and a backward pass
as two kernels, dq per query tile over the same key tiles, and dk/dv per key tile over the query
tiles that see it (the transposed lists), accumulating a kv head's R query heads in the program so
grouped-query attention needs no repeated keys. Rows with no allowed key give 0 (cannot happen for
real rows of these masks: a query sees its own block, multi_copy's padding rows see themselves).
Under a mesh the kernels run per shard (shard_map over batch and heads; the length axis must not
be split).

Decision: tile lists built at trace time from static layout arithmetic instead of per-tile
predicates computed in the kernel: any layout (copies that do not align with tiles, left padding)
costs the same simple loop, and the lists are tiny (rows x visited tiles int32).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec

from dice_jax import sharding
from dice_jax.model import masks
from dice_jax.model.block_layout import KINDS as BLOCK_KINDS  # the mask kinds this kernel runs
from dice_jax.model.block_layout import BlockLayout, TileLists, allowed_tile, transposed_tiles

_NEG = -0.7 * float(np.finfo(np.float32).max)  # a masked score: finite, so exp2 differences never NaN
_LOG2E = math.log2(math.e)
_ACT_HEADS = ("batch", "length", "act_heads", None)


@dataclasses.dataclass(frozen=True)
class Tuning:
  """Tile sizes (powers of two, >= 16) and Triton launch settings of the three kernels."""
  fwd_q: int = 128
  fwd_k: int = 64
  fwd_warps: int = 8
  fwd_stages: int = 3
  bwd_q: int = 64
  bwd_k: int = 64
  bwd_warps: int = 4
  bwd_stages: int = 2

  @property
  def multiple(self) -> int:  # the sequence is padded to a multiple of every tile
    return max(self.fwd_q, self.fwd_k, self.bwd_q, self.bwd_k)


DEFAULT_TUNING = Tuning()


def unsupported_settings(dtype, head_dim: int, *, strict: bool = False) -> list[str]:
  """Why this kernel should not run this dtype / head size (empty: it can). Not strict: only the
  16-bit dtypes it is fast for (float32 dots would run in TF32 on a GPU)."""
  problems = []
  if head_dim < 16 or head_dim & (head_dim - 1):
    problems.append(f"head_dim {head_dim} is not a power of two >= 16")
  allowed = (jnp.bfloat16, jnp.float16, jnp.float32) if strict else (jnp.bfloat16, jnp.float16)
  if jnp.dtype(dtype) not in allowed:
    problems.append(f"compute dtype is {jnp.dtype(dtype).name}")
  return problems


def unsupported(q_shape, k_shape, dtype, mask: masks.AttentionMask) -> list[str]:
  """Why this kernel cannot run these operands (empty: it can)."""
  problems = unsupported_settings(dtype, q_shape[-1], strict=True)
  if mask.kind not in BLOCK_KINDS:
    problems.append(f"mask kind {mask.kind} has no block layout")
  if q_shape[1] != k_shape[1]:
    problems.append(f"{q_shape[1]} queries over {k_shape[1]} keys (needs as many queries as keys)")
  if q_shape[2] % k_shape[2]:
    problems.append(f"{q_shape[2]} query heads are not a multiple of {k_shape[2]} kv heads")
  return problems


@functools.cache
def self_check() -> str:
  """'' if the kernel compiles and matches XLA attention (forward and backward, bf16, GQA, a two-copy
  mask) on this backend, else why not. Run once per process, outside any trace, before "auto"
  relies on it: a Triton or jax version that cannot lower it then costs a logged fallback, not a
  failed training step."""
  rng = np.random.default_rng(0)
  operands = [rng.normal(size=s).astype(np.float32) for s in ((1, 256, 4, 128), (1, 256, 2, 128), (1, 256, 2, 128),
                                                               (1, 256, 4, 128))]
  mask = masks.two_copy(4)

  def errors(*operands_f32):  # max |kernel - XLA| of the output and of dq, dk, dv
    q, k, v, g = (x.astype(jnp.bfloat16) for x in operands_f32)
    dense = masks.dense(mask, 256, 256)[:, None]

    def run(fn):
      out, vjp = jax.vjp(fn, q, k, v)
      return (out, *vjp(g))

    got = run(lambda q, k, v: flash_attention(q, k, v, mask, per_shard=False))
    want = run(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=dense, implementation="xla"))
    return jnp.stack([jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) for a, b in zip(got, want)])

  try:  # lowered and compiled explicitly, so it runs even when called while tracing something else
    err = np.asarray(jax.jit(errors).lower(*operands).compile()(*operands))
    for what, e in zip(("output", "dq", "dk", "dv"), err):
      if not e < 5e-2:
        return f"self-check: {what} differs from XLA attention by {e}"
    return ""
  except Exception as e:  # noqa: BLE001  (any failure to lower, compile or run is the answer)
    return f"self-check failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _pack(lists: TileLists) -> jnp.ndarray:
  """[rows, 2 + cols] int32: full count, total count, then the column tiles (width a power of two)."""
  rows, width = lists.cols.shape
  out = np.zeros((rows, pl.next_power_of_2(width + 2)), np.int32)
  out[:, 0], out[:, 1], out[:, 2:2 + width] = lists.full, lists.total, lists.cols
  return jnp.asarray(out)


@dataclasses.dataclass(frozen=True)
class _Static:
  layout: BlockLayout
  padded: int
  tuning: Tuning
  bounded: bool  # per-row key range given: every tile is masked
  interpret: bool


def _rule(st: _Static, pos_refs, q_start, tq, k_start, tk, lo, hi):
  """allowed [tq, tk] for the query tile at q_start and the key tile at k_start."""
  grp_ref, blk_ref, slot_ref = pos_refs
  gq, bq = grp_ref[pl.ds(q_start, tq)][:, None], blk_ref[pl.ds(q_start, tq)][:, None]
  gk, bk = grp_ref[pl.ds(k_start, tk)][None, :], blk_ref[pl.ds(k_start, tk)][None, :]
  ok = allowed_tile(gq, bq, gk, bk)
  if st.bounded:
    sk = slot_ref[pl.ds(k_start, tk)][None, :]
    ok = ok & (sk >= lo) & (sk < hi)
  if st.layout.self_visible:
    ok = ok | ((q_start + jnp.arange(tq))[:, None] == (k_start + jnp.arange(tk))[None, :])
  return ok


def _visit(lists_ref, st: _Static, body, carry):
  """Run body(col_tile, carry, masked) over this row's full tiles, then its partial ones."""
  full, total = lists_ref[0], lists_ref[1]
  if st.bounded:
    full = 0 * full
  carry = jax.lax.fori_loop(0, full, lambda t, c: body(lists_ref[2 + t], c, False), carry)
  return jax.lax.fori_loop(full, total, lambda t, c: body(lists_ref[2 + t], c, True), carry)


def _fwd_kernel(lists_ref, grp_ref, blk_ref, slot_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
                st: _Static, scale: float):
  tq, tk = st.tuning.fwd_q, st.tuning.fwd_k
  q_start, b = pl.program_id(0) * tq, pl.program_id(1)
  lo, hi = lo_ref[b], hi_ref[b]
  q = plgpu.load(q_ref)

  def body(j, carry, masked):
    acc, m, l = carry
    k = plgpu.load(k_ref.at[pl.ds(j * tk, tk), :])
    v = plgpu.load(v_ref.at[pl.ds(j * tk, tk), :])
    s = plgpu.dot(q, k.T) * (scale * _LOG2E)
    if masked:
      ok = _rule(st, (grp_ref, blk_ref, slot_ref), q_start, tq, j * tk, tk, lo, hi)
      s = jnp.where(ok, s, _NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.exp2(s - m_new[:, None])
    if masked:
      p = jnp.where(ok, p, 0.0)
    corr = jnp.exp2(m - m_new)
    acc = acc * corr[:, None] + plgpu.dot(p.astype(v.dtype), v)
    return acc, m_new, l * corr + jnp.sum(p, axis=1)

  init = (jnp.zeros(q.shape, jnp.float32), jnp.full((tq,), _NEG, jnp.float32), jnp.zeros((tq,), jnp.float32))
  acc, m, l = _visit(lists_ref, st, body, init)
  # A row that saw no key (padding appended to the sequence, masked in every tile it met here) gets
  # output 0 and lse = +big, so exp2(s - lse) = 0 wherever the backward pass's tiling (which may
  # call a tile of it "full") meets it: never inf times a zero cotangent.
  empty = l == 0.0
  l = jnp.where(empty, 1.0, l)
  plgpu.store(o_ref, (acc / l[:, None]).astype(o_ref.dtype))
  plgpu.store(lse_ref, jnp.where(empty, -_NEG, m + jnp.log2(l)))


def _dq_kernel(lists_ref, grp_ref, blk_ref, slot_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref,
               delta_ref, dq_ref, *, st: _Static, scale: float):
  tq, tk = st.tuning.bwd_q, st.tuning.bwd_k
  q_start, b = pl.program_id(0) * tq, pl.program_id(1)
  lo, hi = lo_ref[b], hi_ref[b]
  q, do = plgpu.load(q_ref), plgpu.load(do_ref)
  lse, delta = plgpu.load(lse_ref), plgpu.load(delta_ref)

  def body(j, dq, masked):
    k = plgpu.load(k_ref.at[pl.ds(j * tk, tk), :])
    v = plgpu.load(v_ref.at[pl.ds(j * tk, tk), :])
    p = jnp.exp2(plgpu.dot(q, k.T) * (scale * _LOG2E) - lse[:, None])
    if masked:
      p = jnp.where(_rule(st, (grp_ref, blk_ref, slot_ref), q_start, tq, j * tk, tk, lo, hi), p, 0.0)
    ds = p * (plgpu.dot(do, v.T) - delta[:, None])
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  dq = _visit(lists_ref, st, body, jnp.zeros(q.shape, jnp.float32))
  plgpu.store(dq_ref, (dq * scale).astype(dq_ref.dtype))


def _dkdv_kernel(lists_ref, grp_ref, blk_ref, slot_ref, lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref,
                 delta_ref, dk_ref, dv_ref, *, st: _Static, scale: float, group: int):
  tq, tk = st.tuning.bwd_q, st.tuning.bwd_k
  k_start, b = pl.program_id(0) * tk, pl.program_id(1)
  lo, hi = lo_ref[b], hi_ref[b]
  k, v = plgpu.load(k_ref), plgpu.load(v_ref)
  carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  head_dim, padded = k.shape[-1], st.padded
  for r in range(group):  # this kv head's query heads: q/do as [P, R * K], lse/delta as [R * P]
    def body(i, carry, masked, r=r):
      dk, dv = carry
      rows, cols, stats = pl.ds(i * tq, tq), pl.ds(r * head_dim, head_dim), pl.ds(r * padded + i * tq, tq)
      q, do = plgpu.load(q_ref.at[rows, cols]), plgpu.load(do_ref.at[rows, cols])
      lse, delta = plgpu.load(lse_ref.at[stats]), plgpu.load(delta_ref.at[stats])
      p = jnp.exp2(plgpu.dot(q, k.T) * (scale * _LOG2E) - lse[:, None])
      if masked:
        p = jnp.where(_rule(st, (grp_ref, blk_ref, slot_ref), i * tq, tq, k_start, tk, lo, hi), p, 0.0)
      dv = dv + plgpu.dot(p.astype(do.dtype).T, do)
      ds = p * (plgpu.dot(do, v.T) - delta[:, None])
      return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv

    carry = _visit(lists_ref, st, body, carry)
  dk, dv = carry
  plgpu.store(dk_ref, (dk * scale).astype(dk_ref.dtype))
  plgpu.store(dv_ref, dv.astype(dv_ref.dtype))


def _common_inputs(st: _Static, lo_B, hi_B):
  grp, blk, slot = (jnp.asarray(a) for a in st.layout.positions(st.padded))
  whole = lambda n: pl.BlockSpec((n,), lambda *_: (0,))  # noqa: E731
  specs = [whole(st.padded)] * 3 + [whole(lo_B.shape[0])] * 2
  return (grp, blk, slot, lo_B, hi_B), specs


def _params(warps: int, stages: int):
  return plgpu.CompilerParams(num_warps=warps, num_stages=stages)


def _forward(q, k, v, lo_B, hi_B, st: _Static):
  batch, length, heads, head_dim = q.shape
  kv_heads, group, t = k.shape[2], heads // k.shape[2], st.tuning
  lists = _pack(st.layout.tiles(t.fwd_q, t.fwd_k, st.padded))
  common, common_specs = _common_inputs(st, lo_B, hi_B)
  whole_kv = pl.BlockSpec((None, length, None, head_dim), lambda i, b, h: (b, 0, h // group, 0))
  tile_q = pl.BlockSpec((None, t.fwd_q, None, head_dim), lambda i, b, h: (b, i, h, 0))
  out, lse = pl.pallas_call(
      functools.partial(_fwd_kernel, st=st, scale=1.0 / math.sqrt(head_dim)),
      grid=(length // t.fwd_q, batch, heads),
      in_specs=[pl.BlockSpec((None, lists.shape[1]), lambda i, b, h: (i, 0)), *common_specs, tile_q, whole_kv,
                whole_kv],
      out_specs=[tile_q, pl.BlockSpec((None, None, t.fwd_q), lambda i, b, h: (b, h, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      compiler_params=_params(t.fwd_warps, t.fwd_stages), interpret=st.interpret, name="block_sparse_attention_fwd",
  )(lists, *common, q, k, v)
  del kv_heads
  return out, lse


def _backward(q, k, v, lo_B, hi_B, out, lse, do, st: _Static):
  batch, length, heads, head_dim = q.shape
  kv_heads, group, t = k.shape[2], heads // k.shape[2], st.tuning
  scale = 1.0 / math.sqrt(head_dim)
  delta = jnp.einsum("blhk,blhk->bhl", out.astype(jnp.float32), do.astype(jnp.float32))
  common, common_specs = _common_inputs(st, lo_B, hi_B)
  rows_q = _pack(st.layout.tiles(t.bwd_q, t.bwd_k, st.padded))
  rows_k = _pack(transposed_tiles(st.layout, t.bwd_q, t.bwd_k, st.padded))
  whole_kv = pl.BlockSpec((None, length, None, head_dim), lambda i, b, h: (b, 0, h // group, 0))
  tile_q = pl.BlockSpec((None, t.bwd_q, None, head_dim), lambda i, b, h: (b, i, h, 0))
  tile_stat = pl.BlockSpec((None, None, t.bwd_q), lambda i, b, h: (b, h, i))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, st=st, scale=scale),
      grid=(length // t.bwd_q, batch, heads),
      in_specs=[pl.BlockSpec((None, rows_q.shape[1]), lambda i, b, h: (i, 0)), *common_specs, tile_q, whole_kv,
                whole_kv, tile_q, tile_stat, tile_stat],
      out_specs=tile_q, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=_params(t.bwd_warps, t.bwd_stages), interpret=st.interpret, name="block_sparse_attention_dq",
  )(rows_q, *common, q, k, v, do, lse, delta)
  # A kv head's R query heads side by side (free reshapes: head h = g * R + r).
  q_g, do_g = (x.reshape(batch, length, kv_heads, group * head_dim) for x in (q, do))
  lse_g, delta_g = (x.reshape(batch, kv_heads, group * length) for x in (lse, delta))
  group_q = pl.BlockSpec((None, length, None, group * head_dim), lambda j, b, g: (b, 0, g, 0))
  group_stat = pl.BlockSpec((None, None, group * length), lambda j, b, g: (b, g, 0))
  tile_kv = pl.BlockSpec((None, t.bwd_k, None, head_dim), lambda j, b, g: (b, j, g, 0))
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, st=st, scale=scale, group=group),
      grid=(length // t.bwd_k, batch, kv_heads),
      in_specs=[pl.BlockSpec((None, rows_k.shape[1]), lambda j, b, g: (j, 0)), *common_specs, group_q, tile_kv,
                tile_kv, group_q, group_stat, group_stat],
      out_specs=[tile_kv, tile_kv], out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype)] * 2,
      compiler_params=_params(t.bwd_warps, t.bwd_stages), interpret=st.interpret, name="block_sparse_attention_dkdv",
  )(rows_k, *common, q_g, k, v, do_g, lse_g, delta_g)
  return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, lo_B, hi_B, st: _Static):
  return _forward(q, k, v, lo_B, hi_B, st)[0]


def _attention_fwd(q, k, v, lo_B, hi_B, st: _Static):
  out, lse = _forward(q, k, v, lo_B, hi_B, st)
  return out, (q, k, v, lo_B, hi_B, out, lse)


def _attention_bwd(st: _Static, residuals, do):
  q, k, v, lo_B, hi_B, out, lse = residuals
  dq, dk, dv = _backward(q, k, v, lo_B, hi_B, out, lse, do, st)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q_BxQxHxK: jax.Array, k_BxQxGxK: jax.Array, v_BxQxGxK: jax.Array, mask: masks.AttentionMask, *,
                    tuning: Tuning = DEFAULT_TUNING, interpret: bool | None = None,
                    per_shard: bool = True) -> jax.Array:
  """Softmax(q k^T / sqrt(K) + mask) v for a block_causal / two_copy / multi_copy mask (see module doc).

  interpret: run Pallas's interpreter (default: whenever the backend is not a GPU).
  per_shard: under a mesh of several devices, run the kernel per shard (shard_map); False ignores
    the mesh (for operands that are not sharded over it).
  """
  problems = unsupported(q_BxQxHxK.shape, k_BxQxGxK.shape, q_BxQxHxK.dtype, mask)
  if problems:
    raise ValueError(f"block-sparse flash attention cannot run this: {'; '.join(problems)}")
  batch, length = q_BxQxHxK.shape[:2]
  padded = -(-length // tuning.multiple) * tuning.multiple
  bounded = mask.kv_start_B is not None or mask.kv_lengths_B is not None
  st = _Static(BlockLayout.from_mask(mask, length), padded, tuning, bounded,
               jax.default_backend() != "gpu" if interpret is None else interpret)
  lo_B = jnp.zeros((batch,), jnp.int32) if mask.kv_start_B is None else mask.kv_start_B.astype(jnp.int32)
  hi_B = (jnp.full((batch,), np.iinfo(np.int32).max, jnp.int32) if mask.kv_lengths_B is None
          else mask.kv_lengths_B.astype(jnp.int32))
  pad = [(0, 0), (0, padded - length), (0, 0), (0, 0)]
  q, k, v = (jnp.pad(x, pad) if padded != length else x for x in (q_BxQxHxK, k_BxQxGxK, v_BxQxGxK))
  k, v = k.astype(q.dtype), v.astype(q.dtype)
  run = lambda q, k, v, lo, hi: _attention(q, k, v, lo, hi, st)  # noqa: E731
  mesh = jax.sharding.get_abstract_mesh()
  if per_shard and not mesh.empty and mesh.size > 1:  # XLA does not partition a custom kernel: run per shard
    spec = sharding.logical_to_spec(_ACT_HEADS, q.shape, mesh)
    kv_spec = sharding.logical_to_spec(_ACT_HEADS, k.shape, mesh)
    if spec[1] is not None:
      raise ValueError("block-sparse flash attention cannot split the length axis over the mesh")
    rows = PartitionSpec(spec[0])
    run = jax.shard_map(run, in_specs=(spec, kv_spec, kv_spec, rows, rows), out_specs=spec, check_vma=False)
  out = run(q, k, v, lo_B, hi_B)
  return out[:, :length] if padded != length else out
