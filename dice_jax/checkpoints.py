"""Orbax checkpoints of a training run: state pytree, data-iterator position, and JSON metadata.

One step directory holds three items:
  `state`  the train state pytree (params, optimizer state, RNG, step), saved sharded by every
           process and restored straight onto the shardings of the target given to `restore`;
  `data`   the input pipeline's position: `data_iterator.get_state()` as JSON (a grain
           DatasetIterator, or any object with `get_state() -> dict` and `set_state(dict)`);
  `meta`   JSON the caller wants back (the resolved config, curriculum phase, wall time ...).

Saves are atomic (orbax writes a temporary directory and renames it once every process has
finished; leftovers of a killed save are removed at start-up) and may run in the background while
training continues. `keep` bounds how many step directories stay on disk.

The data state is written once (by the primary process), so it must be the same on every process:
true for pipelines where all processes share one seeded order and each takes its own slice of
every global batch (the SFT pipeline and the RL problem streams both work that way).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import orbax.checkpoint as ocp

from dice_jax.config import require

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
  """A checkpoint is missing, incomplete, or does not match the run restoring it."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  # Where step directories go; None: `<run_dir>/checkpoints`.
  dir: str | None = None
  every_steps: int = 500
  keep: int = 3
  # Write in the background while the next steps run (the save's device-to-host copy still blocks).
  async_save: bool = True
  # Continue from the latest checkpoint in `dir` when there is one.
  resume: bool = True

  def __post_init__(self):
    require(self.every_steps > 0, "every_steps", f"must be > 0, got {self.every_steps}")
    require(self.keep > 0, "keep", f"must be > 0, got {self.keep}")


@dataclasses.dataclass(frozen=True)
class Restored:
  step: int
  state: Any
  meta: dict[str, Any]


class Checkpointer:
  """Saves and restores a run's checkpoints under one directory (an orbax CheckpointManager)."""

  def __init__(self, directory: str, *, every_steps: int = 500, keep: int = 3,
               async_save: bool = True):
    self.directory = os.path.abspath(os.path.expanduser(directory))
    # An explicit interval rule: orbax's default also saves the first step of a fresh run.
    options = ocp.CheckpointManagerOptions(
        should_save_fn=lambda step, _last: step % every_steps == 0, max_to_keep=keep,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "data", "meta"))

  @classmethod
  def from_config(cls, cfg: CheckpointConfig, run_dir: str) -> Checkpointer:
    return cls(cfg.dir or os.path.join(run_dir, "checkpoints"), every_steps=cfg.every_steps,
               keep=cfg.keep, async_save=cfg.async_save)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def should_save(self, step: int) -> bool:
    """True on the save interval, and on every process when a preemption notice arrived."""
    return self._manager.should_save(step)

  def reached_preemption(self, step: int) -> bool:
    """True (on all processes at the same step) when the cluster announced a preemption."""
    return self._manager.reached_preemption(step)

  def save(self, step: int, state: Any, *, data_iterator: Any = None,
           meta: dict[str, Any] | None = None, force: bool = False) -> bool:
    """Saves when the interval (or a preemption, or `force`) says so; returns whether it did.

    The data iterator's position is read now, synchronously, so it matches `state` even when the
    array writes finish in the background. Call it after the step that consumed the last batch.
    """
    items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta or {})}
    if data_iterator is not None:
      items["data"] = ocp.args.JsonSave(data_iterator.get_state())
    saved = self._manager.save(step, args=ocp.args.Composite(**items), force=force)
    if saved:
      log.info("checkpoint step %d -> %s", step, self.directory)
    return saved

  def restore(self, target: Any, *, step: int | None = None,
              data_iterator: Any = None) -> Restored:
    """Restores `step` (default: the latest) onto `target`'s shapes, dtypes and shardings.

    `target` is a pytree of `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` (or of arrays)
    with the structure that was saved. A given `data_iterator` is moved in place to the saved
    position.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    if step not in self.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory} "
                            f"(have: {self.all_steps()})")
    items = {"state": ocp.args.StandardRestore(target), "meta": ocp.args.JsonRestore()}
    if data_iterator is not None:
      if not os.path.isdir(os.path.join(self.directory, str(step), "data")):
        raise CheckpointError(f"checkpoint {self.directory}/{step} holds no data-iterator state")
      items["data"] = ocp.args.JsonRestore()
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointError(f"checkpoint {self.directory}/{step} does not match this run "
                            f"(different model or optimizer config?): {e}") from e
    if data_iterator is not None:
      data_iterator.set_state(restored["data"])
    return Restored(step=step, state=restored["state"], meta=dict(restored["meta"] or {}))

  def wait(self) -> None:
    """Blocks until background saves are committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
