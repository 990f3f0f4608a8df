"""Synthetic KernelBench-format problems with known-good CUDA answers and phase-1 scaffolds.

Written for dice-jax (nothing copied from DICE or KernelBench). Four families (families.py,
reductions.py): `elementwise` expression chains over two inputs, `activation`s, `bias_act` (a
bias parameter fused with an activation) and `reduction`s over rows (sum, max, softmax, layernorm,
...). Each problem is a DICE-style record: the PyTorch reference and a known-good candidate split
into prefix (imports) + middle (`source = \"\"\"...\"\"\"`) + suffix (`cpp_src`, `load_inline`, `ModelNew`).

Selected anywhere a problem path is accepted (`data.phase1_files`, `data.phase2_files`,
`dice eval --problems`) by a spec:

    synthetic:<family>[+<family>...]?split=train|heldout|all[&limit=N]
    synthetic:all?split=heldout           every family's held-out problems
    synthetic:elementwise+reduction?split=train&limit=40

`split` is required (so a run never trains on held-out problems by omission). The split is a
deterministic function of each family's parameters (see families.py): held-out problems use op
combinations, activations and reduction kinds that no training problem uses, not only other sizes.
Order: sorted by a hash of the problem id, so `limit=N` is a fixed pseudo-random sample of the
selection, with the families in about their proportions; the same spec always gives the same list.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from dice_jax.data.synthetic import families as families_lib
from dice_jax.data.synthetic import reductions, render
from dice_jax.data.synthetic.families import FAMILIES, Params

PREFIX = "synthetic:"
SPLITS = ("train", "heldout", "all")
_LEVEL = {"activation": 1, "reduction": 1, "elementwise": 2, "bias_act": 2}
_BUILDERS = {"elementwise": families_lib.elementwise, "activation": families_lib.activation,
             "bias_act": families_lib.bias_act, "reduction": reductions.reduction}
_USAGE = (f"expected {PREFIX}<family>[+<family>...]?split=train|heldout|all[&limit=N] with families "
          f"{', '.join(FAMILIES)} or all")


class SpecError(ValueError):
  """A malformed `synthetic:` spec; the message shows the accepted form."""


@dataclasses.dataclass(frozen=True)
class Spec:
  families: tuple[str, ...]
  split: str
  limit: int | None = None


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
    if not eq or key in fields or key not in ("split", "limit"):
      raise SpecError(f"{text!r}: bad or repeated option {part!r}; {_USAGE}")
    fields[key] = value
  if fields.get("split") not in SPLITS:
    raise SpecError(f"{text!r}: split must be given as one of {', '.join(SPLITS)}; {_USAGE}")
  limit = None
  if "limit" in fields:
    if not fields["limit"].isdigit() or int(fields["limit"]) < 1:
      raise SpecError(f"{text!r}: limit must be a positive integer, got {fields['limit']!r}")
    limit = int(fields["limit"])
  return Spec(tuple(chosen), fields["split"], limit)


@functools.cache
def family_params(family: str) -> tuple[Params, ...]:
  """Every problem of `family` (both splits), in the order the family generates them."""
  if family not in _BUILDERS:
    raise SpecError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")
  return tuple(_BUILDERS[family]())


def select(spec: Spec) -> list[Params]:
  """The problems a spec names, in its documented order (by a hash of the id)."""
  chosen = [p for f in spec.families for p in family_params(f)
            if spec.split == "all" or p.heldout == (spec.split == "heldout")]
  chosen.sort(key=lambda p: hashlib.sha256(p.problem_id.encode()).digest())
  return chosen[:spec.limit] if spec.limit else chosen


def record(p: Params) -> dict[str, object]:
  """One problem as a DICE infilling record (`id`, `level`, `pytorch_code`, `cuda_code`, the split),
  plus `split` and `novelty` (why a held-out problem is held out: "op" or "combination")."""
  good = render.candidate(p)
  prefix, middle, suffix = render.split_candidate(good)
  return {"id": p.problem_id, "level": _LEVEL[p.family], "pytorch_code": render.reference(p), "cuda_code": good,
          "prefix": prefix, "middle": middle, "suffix": suffix, "split": "heldout" if p.heldout else "train",
          "novelty": p.novelty}


def records(text: str) -> list[dict[str, object]]:
  """The DICE-format records of a `synthetic:` spec (`dice_jax.data.problems` turns them into Problems)."""
  return [record(p) for p in select(parse_spec(text))]
