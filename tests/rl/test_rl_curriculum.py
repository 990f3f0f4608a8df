"""The bi-phase curriculum: switch by step count or by a metric threshold, the mixing ramp, state."""

import pytest

from dice_jax.rl.config import CurriculumSection
from dice_jax.rl.curriculum import Curriculum


def test_switch_by_step_count():
  c = Curriculum(CurriculumSection(schedule="steps", phase1_steps=2), prompts_per_step=4)
  assert [c.counts(s) for s in range(4)] == [(4, 0), (4, 0), (0, 4), (0, 4)]


def test_mixing_ramp():
  c = Curriculum(CurriculumSection(phase1_steps=1, ramp_steps=3), prompts_per_step=4)
  assert [c.counts(s)[1] for s in range(6)] == [0, 1, 2, 3, 4, 4]


def test_ramp_respects_the_process_unit():
  c = Curriculum(CurriculumSection(phase1_steps=0, ramp_steps=3), prompts_per_step=4, unit=2)
  # Shares 1/4, 2/4, 3/4, 1 of 2 units of 2 prompts: 1, 1, 2 (rounded half up), 2 units.
  assert [c.counts(s) for s in range(4)] == [(2, 2), (2, 2), (0, 4), (0, 4)]
  with pytest.raises(ValueError, match="multiple of the process count"):
    Curriculum(CurriculumSection(), prompts_per_step=3, unit=2)


def test_switch_by_metric_threshold_and_its_state():
  cfg = CurriculumSection(schedule="metric", phase1_steps=None, metric="phase1/compile", threshold=0.5, window=2,
                          min_phase1_steps=3)
  c = Curriculum(cfg, prompts_per_step=2)
  seen = []
  for step, value in enumerate([0.9, 0.9, 0.9, 0.1, 0.1]):
    seen.append(c.counts(step))
    c.observe(step, {"phase1/compile": value})
  # The window mean reaches 0.5 after step 1, but min_phase1_steps=3 holds it until step 2 is observed;
  # the switch happens at the next decision (step 3), and later metrics cannot undo it.
  assert seen == [(2, 0), (2, 0), (2, 0), (0, 2), (0, 2)]
  saved = c.state_dict()
  again = Curriculum(cfg, prompts_per_step=2)
  again.load_state_dict(saved)
  assert again.counts(5) == (0, 2) and again.switch_step == 3


def test_metric_schedule_upper_bound_and_missing_metric():
  c = Curriculum(CurriculumSection(schedule="metric", phase1_steps=2, metric="phase1/correct", window=1),
                 prompts_per_step=1)
  for step in range(2):
    assert c.counts(step) == (1, 0)
    c.observe(step, {"reward": 1.0})  # the watched metric is absent: nothing triggers
  assert c.counts(2) == (0, 1)  # forced by phase1_steps
