"""Which split each synthetic problem is in: a deterministic function of the seed and the family.

Splits (the `split=` of a spec; `train` is sft + rl, `all` everything):
  sft        what SFT learns from (the known-good answers).
  rl         training problems SFT never saw: RL's prompts, so rewards vary from what SFT memorised.
  heldout    the headline evaluation: op chains and bias+activation pairs no training problem has,
             whose every op and every adjacent op pair (a chain's (op_i, op_i+1); a pair's bias
             variant and activation) occurs in the sft split, so each is reachable by composing
             what SFT taught. `novelty` "combination".
  unseen_op  problems with an activation or reduction kind that no training problem of any family
             uses (families.HELDOUT_ACTIVATIONS, HELDOUT_REDUCTIONS). `novelty` "op". Reported
             apart, never in the headline: no composition of training answers can reach them.

Per family: `HELDOUT[family]` problems with seen ops are drawn for `heldout` (the smallest seeded
hashes of their keys); every other problem with seen ops is split sft / rl by a seeded hash of its
key (`RL_SHARE` of them rl). A drawn problem whose ops or adjacent pairs would not all occur in the
sft split stays in training and the next draw takes its place, until the rule holds for every
held-out problem (tests/data check it for every family and several seeds).

Sizes at the default seed (tests/data pin them): element-wise 1,448 problems (120 held out),
bias_act 60 (8 held out, 8 unseen-op), activation 30 (4 unseen-op), reduction 22 (6 unseen-op);
elementwise + activation + bias_act give 850 sft, 548 rl, 128 held out and 12 unseen-op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dice_jax.data.synthetic import families
from dice_jax.data.synthetic.families import Params

SPLITS = ("sft", "rl", "heldout", "unseen_op")
HELDOUT = {"elementwise": 120, "bias_act": 8}  # combination problems held out per family
RL_SHARE = 0.393  # of the training problems: ~550 rl of ~1,400 (elementwise + activation + bias_act)
_UNSEEN = frozenset(families.HELDOUT_ACTIVATIONS) | frozenset(families.HELDOUT_REDUCTIONS)


def adjacent_pairs(p: Params) -> set[tuple[str, str]]:
  """The adjacent op pairs of an element-wise chain (none for other families: a bias_act pair's two
  parts are its ops, and the pair itself is what is new)."""
  return set(zip(p.ops, p.ops[1:])) if p.family == "elementwise" else set()


def _rl(seed: int, p: Params) -> bool:
  """By key, not id: an activation's two shapes share one answer, so they share a split."""
  return families.seeded_hash(seed, f"rl:{p.family}:{p.key}") / 2**64 < RL_SHARE


def _covered(p: Params, sft: Sequence[Params]) -> bool:
  ops = {op for q in sft for op in q.ops}
  if p.family == "bias_act":  # each part seen in a trained pair, in the same position
    return any(q.ops[0] == p.ops[0] for q in sft) and any(q.ops[1] == p.ops[1] for q in sft)
  pairs = set().union(*(adjacent_pairs(q) for q in sft))
  return set(p.ops) <= ops and adjacent_pairs(p) <= pairs


def assign(family: str, problems: Sequence[Params], seed: int) -> list[Params]:
  """`problems` (one family's, in generation order) with `split` and `novelty` set."""
  unseen = [p for p in problems if set(p.ops) & _UNSEEN]
  seen = [p for p in problems if not set(p.ops) & _UNSEEN]
  ranked = sorted(seen, key=lambda p: families.seeded_hash(seed, f"heldout:{family}:{p.key}"))
  kept_in_training: set[str] = set()
  while True:
    drawn = [p for p in ranked if p.problem_id not in kept_in_training][:HELDOUT.get(family, 0)]
    drawn_ids = {p.problem_id for p in drawn}
    sft = [p for p in seen if p.problem_id not in drawn_ids and not _rl(seed, p)]
    unreachable = {p.problem_id for p in drawn if not _covered(p, sft)}
    if not unreachable:
      break
    kept_in_training |= unreachable
  out = []
  for p in problems:
    if p in unseen:
      split, novelty = "unseen_op", "op"
    elif p.problem_id in drawn_ids:
      split, novelty = "heldout", "combination"
    else:
      split, novelty = ("rl" if _rl(seed, p) else "sft"), None
    out.append(dataclasses.replace(p, split=split, novelty=novelty))
  return out
