"""The KL spike guard: what the loop does when one update moved the policy too far.

After every update the loop hands its metrics to `KLGuard.check`. When the update's mean KL (the
`kl` metric: `algo.kl_estimator` per valid token, against `algo.kl_reference`) exceeds
`kl_guard.max_kl`:
  cut_lr  the learning rate is multiplied by `kl_guard.lr_factor` for the rest of the run (the
          adjustable optimizer's scale, dice_jax.train.optim.scale_lr: no recompile), and the
          loop goes on. Cuts compound: each spike cuts again.
  stop    the run ends with `KLSpike` (a TrainingDiverged: `dice train` exits 5); the update that
          spiked is not saved, the last checkpoint is kept.
Either way one WARNING line says the step, the KL, the threshold and what was done, and the
metrics of that step carry `kl_guard/trips` (spikes so far) and `kl_guard/lr_scale`.

Decision: the guard reads a metric the update already computes (no second forward pass), so it
reacts one update late: the KL of update k is measured while update k's minibatches run from
the params update k-1 produced. A collapsed run logged a mean k3 of 1,420 at its second step,
orders of magnitude above a healthy run's 1e-3 to 1e-1, so a threshold of 1 separates the two.
The scale is part of the optimizer state, so it is checkpointed and a resumed run keeps its cut.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from dice_jax.rl.config import KLGuardSection
from dice_jax.train.optim import lr_scale, scale_lr
from dice_jax.train.step import TrainingDiverged
from dice_jax.train.train_state import TrainState

log = logging.getLogger(__name__)


class KLSpike(TrainingDiverged):
  """An update's KL exceeded kl_guard.max_kl and kl_guard.action is `stop`."""


class KLGuard:
  """Watches each update's KL; cuts the learning rate or stops (see the module docstring)."""

  def __init__(self, cfg: KLGuardSection):
    self.cfg = cfg
    self.trips = 0

  def check(self, step: int, metrics: Mapping[str, float], state: TrainState, *,
            last_checkpoint: int | None = None) -> tuple[TrainState, dict[str, float]]:
    """(the state to continue with, the guard's metrics) after update `step`; raises KLSpike."""
    kl = float(metrics.get("kl", 0.0))
    cfg = self.cfg
    if cfg.max_kl is not None and kl > cfg.max_kl:
      self.trips += 1
      if cfg.action == "stop":
        kept = f"the last checkpoint is step {last_checkpoint}" if last_checkpoint else "no checkpoint was saved"
        log.warning("KL spike at step %d: kl %.4g > kl_guard.max_kl %g; stopping (%s)", step, kl, cfg.max_kl, kept)
        raise KLSpike(f"KL spike at step {step}: kl {kl:.4g} > kl_guard.max_kl {cfg.max_kl:g}; {kept}")
      cut = scale_lr(state.opt_state, cfg.lr_factor)
      before = float(lr_scale(state.opt_state))
      state = dataclasses.replace(state, opt_state=cut)
      log.warning("KL spike at step %d: kl %.4g > kl_guard.max_kl %g; learning-rate scale %.4g -> %.4g",
                  step, kl, cfg.max_kl, before, before * cfg.lr_factor)
    scale = lr_scale(state.opt_state)
    return state, {"kl_guard/trips": float(self.trips), "kl_guard/lr_scale": 1.0 if scale is None else float(scale)}
