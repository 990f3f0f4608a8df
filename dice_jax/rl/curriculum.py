"""The bi-phase curriculum: how many phase-1 (infilling) and phase-2 (end-to-end) prompts each step.

Before the switch every prompt is phase 1. The switch comes
  - `schedule: steps`: at step `phase1_steps` (DICE: 20 infilling steps, then end to end);
  - `schedule: metric`: at the first step decided after the mean of `metric` (e.g.
    `phase1/reward/total`) over the last `window` observed steps reaches `threshold`, once at least
    `min_phase1_steps` steps are done; `phase1_steps` (if set) forces it at that step anyway.
After the switch, phase 2's share grows linearly over `ramp_steps` steps (0: all at once), so
phase 2 does not start cold: share(s) = min(1, (s - switch + 1) / (ramp_steps + 1)).
Counts are rounded to multiples of the process count (every process draws the same number of
items from each phase, so the data streams stay in step across hosts).

Decisions are made when a rollout is *started*, observations arrive when its rewards are known; a
pipelined loop therefore decides step k+1 before it observes step k. The state (switch step,
trigger, metric window) is a small dict saved with every checkpoint, so a resumed run makes the
same decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dice_jax.rl.config import CurriculumSection


class Curriculum:
  """Phase counts per step, and the metric history that may trigger the switch."""

  def __init__(self, cfg: CurriculumSection, prompts_per_step: int, unit: int = 1):
    if prompts_per_step % unit:
      raise ValueError(f"prompts_per_step={prompts_per_step} must be a multiple of the process count {unit}")
    self.cfg, self.prompts, self.unit = cfg, prompts_per_step, unit
    self.switch_step: int | None = None  # first step with phase-2 prompts
    self.triggered = False  # the metric condition held (switch at the next decision)
    self.history: list[float] = []  # last `window` values of the metric

  def counts(self, step: int) -> tuple[int, int]:
    """(phase-1 prompts, phase-2 prompts) for rollout `step`; call once per step, in order."""
    cfg = self.cfg
    if self.switch_step is None:
      forced = cfg.phase1_steps is not None and step >= cfg.phase1_steps
      if forced or (cfg.schedule == "metric" and self.triggered):
        self.switch_step = step
    if self.switch_step is None or step < self.switch_step:
      return self.prompts, 0
    share = min(1.0, (step - self.switch_step + 1) / (cfg.ramp_steps + 1))
    units = self.prompts // self.unit
    n2 = min(units, max(1, int(share * units + 0.5))) * self.unit
    return self.prompts - n2, n2

  def observe(self, step: int, metrics: Mapping[str, float]) -> None:
    """Records step `step`'s metrics (the metric schedule watches `cfg.metric` on phase-1 steps)."""
    cfg = self.cfg
    if cfg.schedule != "metric" or self.switch_step is not None or self.triggered or cfg.metric not in metrics:
      return
    self.history = (self.history + [float(metrics[cfg.metric])])[-cfg.window:]
    done = step + 1
    if (len(self.history) == cfg.window and done >= cfg.min_phase1_steps
        and sum(self.history) / cfg.window >= cfg.threshold):
      self.triggered = True

  def state_dict(self) -> dict[str, Any]:
    return {"switch_step": self.switch_step, "triggered": self.triggered, "history": list(self.history)}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.switch_step = state.get("switch_step")
    self.triggered = bool(state.get("triggered", False))
    self.history = [float(v) for v in state.get("history", [])]
