"""The RL input pipeline: problems → shuffled, repeated stream of prompt items, checkpointable.

Each item is a dict with the columns the rollout and the reward functions need (`ITEM_COLUMNS`):
  problem_id, phase (1 infilling | 2 end to end), level (-1 when unknown), reference_source,
  prefix and suffix (the phase-1 scaffold; "" in phase 2), messages (the chat prompt).

One `ProblemStream` per phase; `BiPhaseStream` draws a given number of items from each per step,
so the curriculum (how many of each, decided by the trainer's schedule from the step) stays out of
the data. The stream's state is a small JSON-able dict: saved with the checkpoint, restored with
`set_state`, the run continues with exactly the items it would have seen.

Backend: grain (`MapDataset.source(...).shuffle(seed)[shard::count].repeat()`: a fresh permutation
per epoch, deterministic in the seed). Where grain is not installed (the GPU image ships without
it), `backend="auto"` falls back to an equivalent numpy permutation per epoch; the two orders
differ, so a state records its backend and restoring it on the other one is an error, not a
silently different run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from dice_jax.data import prompts
from dice_jax.data.problems import Problem

try:
  import grain
except ImportError:  # the GPU image has no grain; see the module docstring
  grain = None

# The item columns reward functions get (`**item_columns`; README.md, "Reward shaping"), and all of them.
REWARD_COLUMNS = ("problem_id", "phase", "level", "reference_source", "prefix", "suffix")
ITEM_COLUMNS = (*REWARD_COLUMNS, "messages")
Backend = Literal["auto", "grain", "numpy"]
_log = logging.getLogger(__name__)


def make_item(problem: Problem, phase: int, *, infilling: prompts.PromptTemplate = prompts.INFILLING,
              end_to_end: prompts.PromptTemplate = prompts.END_TO_END,
              target: prompts.TargetSpec | None = None) -> dict[str, Any]:
  """The item dict for one problem in one phase (see ITEM_COLUMNS)."""
  return {
      "problem_id": problem.id,
      "phase": phase,
      "level": -1 if problem.level is None else problem.level,
      "reference_source": problem.reference_source,
      "prefix": problem.prefix if phase == 1 else "",
      "suffix": problem.suffix if phase == 1 else "",
      "messages": prompts.build_messages(problem, phase, infilling=infilling, end_to_end=end_to_end,
                                         target=target),
  }


def collate(items: Sequence[Mapping[str, Any]], repeat: int = 1,
            keys: Sequence[str] = ITEM_COLUMNS) -> dict[str, list[Any]]:
  """Items → columns (`{"phase": [1, 1, 2], ...}`); with `keys=REWARD_COLUMNS`, the
  `**item_columns` of reward functions.

  `repeat=G` repeats each item's values G times in a row, matching G completions per prompt.
  """
  if repeat < 1:
    raise ValueError(f"repeat must be >= 1, got {repeat}")
  return {key: [item[key] for item in items for _ in range(repeat)] for key in keys}


def _resolve_backend(backend: Backend) -> str:
  if backend == "auto":
    if grain is None:
      _log.warning("grain is not installed: the RL data stream uses its numpy fallback")
    return "grain" if grain is not None else "numpy"
  if backend == "grain" and grain is None:
    raise ImportError("backend='grain' needs the grain package (pip install 'grain>=0.2.18,<0.3')")
  if backend not in ("grain", "numpy"):
    raise ValueError(f"backend must be 'auto', 'grain' or 'numpy', got {backend!r}")
  return backend


class ProblemStream:
  """An endless, shuffled, sharded stream of one phase's items with get_state/set_state.

  Every `shard_count` hosts use the same seed, so they share one permutation per epoch and take
  disjoint slices of it.
  """

  def __init__(self, problems: Sequence[Problem], *, phase: int, seed: int, shard_index: int = 0,
               shard_count: int = 1, infilling: prompts.PromptTemplate = prompts.INFILLING,
               end_to_end: prompts.PromptTemplate = prompts.END_TO_END,
               target: prompts.TargetSpec | None = None, backend: Backend = "auto"):
    if phase not in (1, 2):
      raise ValueError(f"phase must be 1 or 2, got {phase!r}")
    if not problems:
      raise ValueError(f"phase {phase}: no problems to stream")
    if phase == 1:
      missing = [p.id for p in problems if not p.has_scaffold]
      if missing:
        raise ValueError(f"phase 1 needs problems with a prefix/middle/suffix scaffold; these have none: "
                         f"{missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if not 0 <= seed < 2**32:
      raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    if not 0 <= shard_index < shard_count:
      raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
    if shard_count > len(problems):
      raise ValueError(f"{len(problems)} problems cannot be split over {shard_count} shards")
    self.phase, self._seed = phase, seed
    self._shard = (shard_index, shard_count)
    self._problems = list(problems)
    self._backend = _resolve_backend(backend)

    def to_item(problem: Problem) -> dict[str, Any]:
      return make_item(problem, phase, infilling=infilling, end_to_end=end_to_end, target=target)

    self._to_item = to_item
    if self._backend == "grain":
      dataset = (grain.MapDataset.source(self._problems).shuffle(seed=seed)[shard_index::shard_count]
                 .repeat().map(to_item))
      # Items are cheap to build: read synchronously, no prefetch threads to drain on restore.
      self._it = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)).__iter__()
    else:
      self._next_index = 0

  def _numpy_item(self, index: int) -> dict[str, Any]:
    shard_index, shard_count = self._shard
    per_epoch = len(range(shard_index, len(self._problems), shard_count))
    epoch, offset = divmod(index, per_epoch)
    order = np.random.default_rng([self._seed, epoch]).permutation(len(self._problems))
    return self._to_item(self._problems[order[shard_index::shard_count][offset]])

  def __iter__(self) -> ProblemStream:
    return self

  def __next__(self) -> dict[str, Any]:
    if self._backend == "grain":
      return next(self._it)
    item = self._numpy_item(self._next_index)
    self._next_index += 1
    return item

  def take(self, n: int) -> list[dict[str, Any]]:
    """The next `n` items."""
    return [next(self) for _ in range(n)]

  def get_state(self) -> dict[str, Any]:
    """JSON-able position in the stream, plus what it must be restored into."""
    position = self._it.get_state() if self._backend == "grain" else {"next_index": self._next_index}
    return {"backend": self._backend, "phase": self.phase, "seed": self._seed,
            "num_problems": len(self._problems), "shard": list(self._shard), "position": position}

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Continues from a `get_state()`; refuses a state taken from a different stream."""
    mine = self.get_state()
    for key in ("backend", "phase", "seed", "num_problems", "shard"):
      if key not in state:
        raise ValueError(f"data stream state lacks {key!r}: not a ProblemStream state ({sorted(state)})")
      if (list(state[key]) if key == "shard" else state[key]) != mine[key]:
        raise ValueError(f"data stream state is for {key}={state[key]!r} but this stream has "
                         f"{key}={mine[key]!r}; a resumed run must use the same data settings")
    position = dict(state["position"])
    if self._backend == "grain":
      self._it.set_state(position)
    else:
      index = position.get("next_index")
      if not isinstance(index, int) or index < 0:
        raise ValueError(f"data stream state has an invalid next_index {index!r}")
      self._next_index = index


class BiPhaseStream:
  """Phase-1 and phase-2 streams drawn together; the trainer's schedule says how many of each."""

  def __init__(self, phase1: ProblemStream | None, phase2: ProblemStream | None):
    if phase1 is None and phase2 is None:
      raise ValueError("BiPhaseStream needs at least one of the phase-1 and phase-2 streams")
    for want, stream in ((1, phase1), (2, phase2)):
      if stream is not None and stream.phase != want:
        raise ValueError(f"the phase{want} argument is a phase-{stream.phase} stream")
    self._streams = {1: phase1, 2: phase2}

  def next_batch(self, num_phase1: int, num_phase2: int) -> list[dict[str, Any]]:
    """`num_phase1` phase-1 items then `num_phase2` phase-2 items."""
    items = []
    for phase, n in ((1, num_phase1), (2, num_phase2)):
      if n < 0:
        raise ValueError(f"num_phase{phase} must be >= 0, got {n}")
      if n and self._streams[phase] is None:
        raise ValueError(f"{n} phase-{phase} items requested but there is no phase-{phase} stream")
      if n:
        items += self._streams[phase].take(n)
    return items

  def get_state(self) -> dict[str, Any]:
    return {f"phase{p}": (s.get_state() if s is not None else None) for p, s in self._streams.items()}

  def set_state(self, state: Mapping[str, Any]) -> None:
    for phase, stream in self._streams.items():
      saved = state.get(f"phase{phase}")
      if (saved is None) != (stream is None):
        raise ValueError(f"data state {'has' if saved is not None else 'lacks'} a phase-{phase} stream "
                         f"but this run {'does not' if stream is None else 'does'}")
      if stream is not None:
        stream.set_state(saved)
