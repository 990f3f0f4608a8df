"""Metrics logger: TensorBoard scalars, JSONL records, resume truncation, summary table."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from train_tb_events import read_scalars

from dice_jax.config import ConfigError
from dice_jax.metrics_log import LoggingConfig, MetricsLogger, read_jsonl


def _console():
  return Console(file=io.StringIO(), width=120)


def test_tensorboard_jsonl_console_and_summary(tmp_path):
  console = _console()
  with MetricsLogger(str(tmp_path), total_steps=4, cfg=LoggingConfig(every_steps=1),
                     config_text="a: 1", console=console) as logger:
    for step in range(1, 5):
      logger.advance(step)
      logger.write(step, {"loss": 5.0 - step, "lr": 1e-4})
    logger.histogram(4, "speedup", [0.5, 1.0, 2.0])
  scalars = read_scalars(tmp_path / "tensorboard")
  assert scalars["loss"] == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]
  records = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2, 3, 4] and records[-1]["loss"] == 1.0
  text = console.file.getvalue()
  assert "step 4/4  loss=1.0000  lr=1.000e-04" in text  # not a terminal: plain lines
  assert "loss" in text and "4.0000" in text and "2.5000" in text  # summary: first and mean


def test_resume_drops_records_after_restored_step(tmp_path):
  with MetricsLogger(str(tmp_path), total_steps=10, console=_console()) as logger:
    for step in range(1, 7):
      logger.write(step, {"loss": float(step)})
  # Killed after step 6, checkpoint at step 4: steps 5 and 6 are redone by the resumed run.
  with MetricsLogger(str(tmp_path), total_steps=10, start_step=4, console=_console()) as logger:
    for step in range(5, 8):
      logger.write(step, {"loss": 10.0 * step})
  records = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r["loss"]) for r in records] == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0), (7, 70.0)]
  # TensorBoard keeps both event files; purge_step tells readers to drop the stale steps 5-6.
  steps = [s for s, _ in read_scalars(tmp_path / "tensorboard")["loss"]]
  assert steps[-3:] == [5, 6, 7]


def test_disabled_logger_writes_nothing(tmp_path):
  with MetricsLogger(str(tmp_path / "run"), total_steps=2, enabled=False) as logger:
    logger.write(1, {"loss": 1.0})
  assert not (tmp_path / "run").exists()


def test_logging_config_validation():
  with pytest.raises(ConfigError, match="every_steps: must be > 0"):
    LoggingConfig(every_steps=0)
