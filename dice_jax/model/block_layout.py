"""Block-structured masks (block_causal, two_copy, multi_copy) as tile lists for a flash kernel.

Every such mask is decided by a few integers per position, never by a dense L x L array:
- group: 0 for the clean stream, c + 1 for noisy copy c, -1 for padding the kernel appended;
- slot: the clean slot a position stands for (a copy's position mirrors a clean slot);
- block: slot // block_size.
Query i may see key j when
    key clean and (block_j < block_i, or block_j == block_i and query clean)    [earlier clean blocks]
    or key and query in the same copy and block_j == block_i                    [own noisy block]
and, per row, the key's slot is in [kv_start, kv_length) (multi_copy / block_causal padding);
multi_copy also lets every query see itself. That is `masks.dense` exactly for these kinds
(tests/model/test_model_flash_attention.py checks it): two_copy is one copy at the front,
`[noisy (n) | clean (n)]`, mirroring clean slots 0..n-1; multi_copy is `[clean (L) | C copies of n]`,
mirroring the last n clean slots; block_causal is the clean stream alone.

From these the kernel's work list is built once per (mask, length, tile sizes) at trace time in
numpy: for each query tile the key tiles that hold an allowed pair, those whose every pair is
allowed first ("full": no mask arithmetic), then the partial ones; and the transpose for the
backward pass's dk/dv kernel. Decision: tile lists from static layout arithmetic (runs of equal
group cut at tile edges, compared pairwise), not a dense mask reduced to tiles: the dense mask of a
TraceRL pass (L ~ 30k) would be ~1 GB at trace time.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dice_jax.model import masks

KINDS = ("block_causal", "two_copy", "multi_copy")  # the mask kinds this layout describes


@dataclasses.dataclass(frozen=True)
class BlockLayout:
  """Where the clean stream and the noisy copies sit in a sequence of `length` positions."""
  length: int
  block_size: int
  clean_start: int
  clean_len: int
  copy_start: int = 0
  copies: int = 0
  copy_len: int = 0
  mirror_start: int = 0  # first clean slot the copies mirror
  self_visible: bool = False  # every query also sees itself (multi_copy: padding rows keep a key)

  @classmethod
  def from_mask(cls, mask: masks.AttentionMask, length: int) -> BlockLayout:
    """The layout of a block_causal / two_copy / multi_copy mask over `length` queries = keys."""
    b = mask.block_size
    if mask.kind == "block_causal":
      return cls(length, b, 0, length)
    if mask.kind == "two_copy":
      if length % 2:
        raise ValueError(f"two_copy attention needs an even length [noisy | clean], got {length}")
      n = length // 2
      return cls(length, b, n, n, copy_start=0, copies=1, copy_len=n, mirror_start=0)
    if mask.kind == "multi_copy":
      c, n = mask.copies, mask.copy_length
      clean = length - c * n
      if clean < n or (clean - n) % b:
        raise ValueError(f"multi_copy attention needs a clean part of at least {n} slots whose last {n} start on "
                         f"a block boundary (block_size {b}); got length {length} with {c} x {n} copies")
      return cls(length, b, 0, clean, copy_start=clean, copies=c, copy_len=n, mirror_start=clean - n,
                 self_visible=True)
    raise ValueError(f"no block layout for {mask.kind!r} masks; these have one: {KINDS}")

  def positions(self, padded_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, block, slot) per position, int32 [padded_length]; positions past `length` are padding
    (group -1, block -1: they see nothing and nothing sees them)."""
    p = np.arange(padded_length)
    in_clean = (p >= self.clean_start) & (p < self.clean_start + self.clean_len)
    rel = p - self.copy_start
    in_copy = (rel >= 0) & (rel < self.copies * self.copy_len) & (p < self.length)
    copy_len = max(self.copy_len, 1)
    group = np.where(in_clean, 0, np.where(in_copy, rel // copy_len + 1, -1))
    slot = np.where(in_clean, p - self.clean_start, np.where(in_copy, self.mirror_start + rel % copy_len, 0))
    block = np.where(group >= 0, slot // self.block_size, -1)
    return group.astype(np.int32), block.astype(np.int32), slot.astype(np.int32)

  def dense(self) -> np.ndarray:
    """The structural mask [length, length] (no per-row key range): for tests, small lengths only."""
    g, b, _ = self.positions(self.length)
    allowed = _allowed(g[:, None], b[:, None], g[None, :], b[None, :])
    if self.self_visible:
      allowed |= np.eye(self.length, dtype=bool)
    return allowed

  def tiles(self, tile_q: int, tile_k: int, padded_length: int) -> TileLists:
    return _tiles(self, tile_q, tile_k, padded_length)


def _allowed(gq, bq, gk, bk):
  """The structural rule of the module docstring, elementwise (numpy or jax arrays)."""
  earlier_clean = (gk == 0) & ((bk < bq) | ((bk == bq) & (gq == 0)))
  own_block = (gk == gq) & (gk > 0) & (bk == bq)
  return earlier_clean | own_block


@dataclasses.dataclass(frozen=True)
class TileLists:
  """Per row tile r: the column tiles to visit, `full[r]` unmasked ones first, `total[r]` in all.

  For the forward and dq kernels rows are query tiles and columns key tiles; for the dk/dv kernel
  (`transpose=True` when built) rows are key tiles and columns query tiles.
  """
  cols: np.ndarray  # int32 [rows, max(1, max total)], padded with 0
  full: np.ndarray  # int32 [rows]
  total: np.ndarray  # int32 [rows]

  @property
  def visited(self) -> int:
    return int(self.total.sum())


def _runs(group: np.ndarray, block: np.ndarray, tile: int):
  """Maximal stretches of one group inside one tile: (tile index, group, min block, max block, first, last)."""
  n = group.shape[0]
  starts = np.unique(np.concatenate([np.arange(0, n, tile), np.flatnonzero(np.diff(group)) + 1]))
  ends = np.append(starts[1:], n) - 1
  bmin = np.minimum.reduceat(block, starts)
  bmax = np.maximum.reduceat(block, starts)
  return starts // tile, group[starts], bmin, bmax, starts, ends


def _pair_any_all(layout: BlockLayout, tile_q: int, tile_k: int, padded_length: int):
  """any[I, J] / all[I, J]: query tile I and key tile J have some / only allowed pairs (padding
  queries ignored, padding keys never allowed)."""
  group, block, _ = layout.positions(padded_length)
  qt, gq, qa, qb, qs, qe = (x[:, None] for x in _runs(group, block, tile_q))
  kt, gk, ka, kb, ks, ke = (x[None, :] for x in _runs(group, block, tile_k))
  clean_any = (gk == 0) & np.where(gq == 0, ka <= qb, ka < qb)
  clean_all = (gk == 0) & np.where(gq == 0, kb <= qa, kb < qa)
  own_any = (gk == gq) & (gk > 0) & (ka <= qb) & (qa <= kb)
  own_all = (gk == gq) & (gk > 0) & (qa == qb) & (ka == kb) & (qa == ka)
  real_q = gq >= 0
  any_runs = real_q & (clean_any | own_any)
  if layout.self_visible:
    any_runs |= real_q & (ks <= qe) & (qs <= ke)
  all_runs = ~real_q | ((gk >= 0) & (clean_all | own_all))
  rows_q = np.flatnonzero(np.diff(np.concatenate([[-1], qt[:, 0]])))
  rows_k = np.flatnonzero(np.diff(np.concatenate([[-1], kt[0]])))
  any_t = np.logical_or.reduceat(np.logical_or.reduceat(any_runs, rows_q, axis=0), rows_k, axis=1)
  all_t = np.logical_and.reduceat(np.logical_and.reduceat(all_runs, rows_q, axis=0), rows_k, axis=1)
  return any_t, all_t & any_t


def _lists(any_t: np.ndarray, all_t: np.ndarray) -> TileLists:
  rows = any_t.shape[0]
  total = any_t.sum(axis=1).astype(np.int32)
  cols = np.zeros((rows, max(1, int(total.max(initial=0)))), np.int32)
  for r in range(rows):
    order = np.concatenate([np.flatnonzero(all_t[r]), np.flatnonzero(any_t[r] & ~all_t[r])])
    cols[r, :order.size] = order
  return TileLists(cols=cols, full=all_t.sum(axis=1).astype(np.int32), total=total)


@functools.lru_cache(maxsize=64)
def _tiles(layout: BlockLayout, tile_q: int, tile_k: int, padded_length: int) -> TileLists:
  if padded_length % tile_q or padded_length % tile_k or padded_length < layout.length:
    raise ValueError(f"padded length {padded_length} must cover {layout.length} and be a multiple of the tiles "
                     f"({tile_q}, {tile_k})")
  return _lists(*_pair_any_all(layout, tile_q, tile_k, padded_length))


@functools.lru_cache(maxsize=64)
def transposed_tiles(layout: BlockLayout, tile_q: int, tile_k: int, padded_length: int) -> TileLists:
  """Per key tile (of tile_k), the query tiles (of tile_q) that see it: the dk/dv kernel's lists."""
  any_t, all_t = _pair_any_all(layout, tile_q, tile_k, padded_length)
  return _lists(any_t.T, all_t.T)


def allowed_tile(gq, bq, gk, bk):
  """The structural rule on one tile inside a kernel (jax arrays [Tq, 1] and [1, Tk])."""
  return _allowed(gq, bq, gk, bk)
