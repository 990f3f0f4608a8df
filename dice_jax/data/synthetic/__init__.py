"""Synthetic KernelBench-format problems with known-good CUDA answers and phase-1 scaffolds.

Written for dice-jax (nothing copied from DICE or KernelBench). Four families (families.py,
reductions.py): `elementwise` op chains over two inputs (every chain of length 2 and 3, a sample
of length 4), `activation`s, `bias_act` (a bias parameter fused with an activation) and
`reduction`s over rows (sum, max, softmax, layernorm, ...). Each problem is a DICE-style record:
the PyTorch reference and a known-good candidate split into prefix (imports) + middle
(`source = \"\"\"...\"\"\"`) + suffix (`cpp_src`, `load_inline`, `ModelNew`).

Selected anywhere a problem path is accepted (`data.phase1_files`, `data.phase2_files`,
`dice eval --problems`) by a spec:

    synthetic:<family>[+<family>...]?split=sft|rl|train|heldout|unseen_op|all[&limit=N][&seed=S]
    synthetic:all?split=heldout           every family's held-out problems (the headline set)
    synthetic:elementwise+bias_act?split=sft&seed=1

`split` is required (so a run never trains on held-out problems by omission); splits.py says what
each holds: `sft` and `rl` are the two disjoint parts of `train`; `heldout` has new combinations of
ops and adjacent op pairs that all occur in `sft`; `unseen_op` has ops no training problem uses
(report it apart). `seed` (default 0) draws the length-4 chains, the splits, constants and shapes;
the same spec always gives the same list. Order: sorted by a hash of the problem id, so `limit=N`
is a fixed pseudo-random sample of the selection, with the families in about their proportions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from dice_jax.data.synthetic import families as families_lib
from dice_jax.data.synthetic import reductions, render, splits
from dice_jax.data.synthetic.families import FAMILIES, Params

PREFIX = "synthetic:"
SPLITS = (*splits.SPLITS, "train", "all")
_UNION = {"train": ("sft", "rl"), "all": splits.SPLITS}
_LEVEL = {"activation": 1, "reduction": 1, "elementwise": 2, "bias_act": 2}
_BUILDERS = {"elementwise": families_lib.elementwise, "activation": families_lib.activation,
             "bias_act": families_lib.bias_act, "reduction": reductions.reduction}
_USAGE = (f"expected {PREFIX}<family>[+<family>...]?split={'|'.join(SPLITS)}[&limit=N][&seed=S] with "
          f"families {', '.join(FAMILIES)} or all")


class SpecError(ValueError):
  """A malformed `synthetic:` spec; the message shows the accepted form."""


@dataclasses.dataclass(frozen=True)
class Spec:
  families: tuple[str, ...]
  split: str
  limit: int | None = None
  seed: int = 0


def is_spec(text: str) -> bool:
  return text.startswith(PREFIX)


def parse_spec(text: str) -> Spec:
  """The families, split and limit of `synthetic:...`; SpecError names what is wrong."""
  if not is_spec(text):
    raise SpecError(f"{text!r}: {_USAGE}")
  body = text[len(PREFIX):]
  names, _, query = body.partition("?")
  chosen: list[str] = []
  for name in names.split("+"):
    if name == "all":
      chosen += [f for f in FAMILIES if f not in chosen]
    elif name in FAMILIES:
      chosen += [name] if name not in chosen else []
    else:
      raise SpecError(f"{text!r}: unknown family {name!r}; {_USAGE}")
  fields: dict[str, str] = {}
  for part in filter(None, query.split("&")):
    key, eq, value = part.partition("=")
    if not eq or key in fields or key not in ("split", "limit", "seed"):
      raise SpecError(f"{text!r}: bad or repeated option {part!r}; {_USAGE}")
    fields[key] = value
  if fields.get("split") not in SPLITS:
    raise SpecError(f"{text!r}: split must be given as one of {', '.join(SPLITS)}; {_USAGE}")
  limit = None
  if "limit" in fields:
    if not fields["limit"].isdigit() or int(fields["limit"]) < 1:
      raise SpecError(f"{text!r}: limit must be a positive integer, got {fields['limit']!r}")
    limit = int(fields["limit"])
  if not fields.get("seed", "0").isdigit():
    raise SpecError(f"{text!r}: seed must be a non-negative integer, got {fields['seed']!r}")
  return Spec(tuple(chosen), fields["split"], limit, int(fields.get("seed", "0")))


@functools.cache
def family_params(family: str, seed: int = 0) -> tuple[Params, ...]:
  """Every problem of `family` (all splits, `split` and `novelty` set), in generation order."""
  if family not in _BUILDERS:
    raise SpecError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")
  return tuple(splits.assign(family, _BUILDERS[family](seed), seed))


def select(spec: Spec) -> list[Params]:
  """The problems a spec names, in its documented order (by a hash of the id)."""
  wanted = _UNION.get(spec.split, (spec.split,))
  chosen = [p for f in spec.families for p in family_params(f, spec.seed) if p.split in wanted]
  chosen.sort(key=lambda p: hashlib.sha256(p.problem_id.encode()).digest())
  return chosen[:spec.limit] if spec.limit else chosen


def record(p: Params) -> dict[str, object]:
  """One problem as a DICE infilling record (`id`, `level`, `pytorch_code`, `cuda_code`, the split),
  plus `split` (splits.SPLITS) and `novelty` (why a held-out problem is held out: "op" or "combination")."""
  good = render.candidate(p)
  prefix, middle, suffix = render.split_candidate(good)
  return {"id": p.problem_id, "level": _LEVEL[p.family], "pytorch_code": render.reference(p), "cuda_code": good,
          "prefix": prefix, "middle": middle, "suffix": suffix, "split": p.split,
          "novelty": p.novelty}


def records(text: str) -> list[dict[str, object]]:
  """The DICE-format records of a `synthetic:` spec (`dice_jax.data.problems` turns them into Problems)."""
  return [record(p) for p in select(parse_spec(text))]
