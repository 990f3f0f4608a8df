"""Run metrics to TensorBoard, a JSONL file and the console, with a summary table at the end
(of every metric, or of the few a command names; the files always have all of them).

`<run_dir>/metrics.jsonl` holds one JSON object per logged step (`{"step": 10, "time": ...,
"loss": ...}`), easy to plot without TensorBoard; `<run_dir>/tensorboard/` holds the event files.
On a resumed run both are cut back to the restored step first (TensorBoard through `purge_step`),
so curves have no duplicate or orphaned points from the steps that were lost.

Only one process of a multi-host run should write: pass `enabled=jax.process_index() == 0`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from dice_jax.config import require

if TYPE_CHECKING:
  import numpy as np


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  # Fetch metrics to the host and write them every N steps (each fetch waits for the device).
  every_steps: int = 10
  tensorboard: bool = True
  jsonl: bool = True
  # A rich progress bar on a terminal; plain lines when output is not a terminal.
  progress: bool = True
  # Metrics shown beside the progress bar (all metrics go to the files).
  console_metrics: tuple[str, ...] = ("loss", "grad_norm", "lr")

  def __post_init__(self):
    require(self.every_steps > 0, "every_steps", f"must be > 0, got {self.every_steps}")


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch.

  tensorboardX imports torch at import time when it is installed (it is, on the verifier side of
  the same environment): seven seconds, and dice_jax must not import torch. Its torch support is
  optional (`try: import torch / except ImportError`), so torch is hidden for that one import.
  """
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # makes `import torch` raise ImportError
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def _format(value: float) -> str:
  return f"{value:.3e}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5) else f"{value:.4f}"


def truncate_jsonl(path: str, last_step: int) -> None:
  """Drops records after `last_step` (steps that a resumed run will redo); atomic rewrite."""
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= last_step]
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(kept)
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The records of a metrics.jsonl file (for plots and tests)."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


class MetricsLogger:
  """Writes scalar metrics of one run; use as a context manager or call `close()`."""

  def __init__(self, run_dir: str, *, total_steps: int, start_step: int = 0,
               cfg: LoggingConfig = LoggingConfig(), title: str = "train",
               config_text: str | None = None, enabled: bool = True,
               console: Console | None = None, summary_keys: Sequence[str] | None = None):
    """`summary_keys`: the metrics the closing table shows (None: every metric logged; () none)."""
    self.run_dir = run_dir
    self.summary_keys = summary_keys
    self.cfg = cfg
    self.enabled = enabled
    self.total_steps = total_steps
    self.start_step = start_step
    self.jsonl_path = os.path.join(run_dir, "metrics.jsonl")
    self._history: dict[str, list[float]] = {}
    self._start_time = time.time()
    self._last_step = start_step
    self._writer = None
    self._jsonl = None
    self._progress = None
    self.console = console or Console(stderr=True)
    if not enabled:
      return
    os.makedirs(run_dir, exist_ok=True)
    if cfg.tensorboard:
      self._writer = _summary_writer_class()(os.path.join(run_dir, "tensorboard"),
                                   purge_step=start_step + 1 if start_step else None)
      if config_text:
        self._writer.add_text("config", f"```\n{config_text}\n```", start_step)
    if cfg.jsonl:
      truncate_jsonl(self.jsonl_path, start_step)
      self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
    if cfg.progress and self.console.is_terminal:
      self._progress = Progress(
          TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
          TimeRemainingColumn(), TextColumn("{task.fields[metrics]}"), console=self.console)
      self._task = self._progress.add_task(title, total=total_steps, completed=start_step,
                                           metrics="")
      self._progress.start()

  def advance(self, step: int) -> None:
    """Moves the progress bar to `step` (cheap; no device sync)."""
    self._last_step = step
    if self._progress is not None:
      self._progress.update(self._task, completed=step)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Logs scalar `metrics` (host numbers or 0-d arrays; fetch device arrays once beforehand)."""
    if not self.enabled:
      return
    values = {k: float(v) for k, v in metrics.items()}
    for key, value in values.items():
      self._history.setdefault(key, []).append(value)
      if self._writer is not None:
        self._writer.add_scalar(key, value, step)
    if self._jsonl is not None:
      record = {"step": int(step), "time": round(time.time(), 3), **values}
      self._jsonl.write(json.dumps(record) + "\n")
      self._jsonl.flush()
    shown = "  ".join(f"{k}={_format(values[k])}" for k in self.cfg.console_metrics if k in values)
    if self._progress is not None:
      self._progress.update(self._task, completed=step, metrics=shown)
    else:
      self.console.print(f"step {step}/{self.total_steps}  {shown}", highlight=False)
    self._last_step = step

  def histogram(self, step: int, name: str, values: Sequence[float] | np.ndarray) -> None:
    """A distribution (e.g. speedups of one RL step) to TensorBoard."""
    if self.enabled and self._writer is not None and len(values):
      import numpy as np

      self._writer.add_histogram(name, np.asarray(values, np.float64), step)

  def summary_table(self) -> Table:
    """First, last, min, max and mean of every metric logged by this process in this run."""
    elapsed = time.time() - self._start_time
    steps = self._last_step - self.start_step
    rate = f"{steps / elapsed:.2f} steps/s" if elapsed > 0 and steps > 0 else ""
    table = Table(title=f"steps {self.start_step}->{self._last_step} in {elapsed:.1f} s {rate}")
    for column in ("metric", "first", "last", "min", "max", "mean"):
      table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=column == "metric")
    keys = self._history if self.summary_keys is None else [k for k in self.summary_keys if k in self._history]
    for key in keys:
      series = self._history[key]
      finite = [v for v in series if math.isfinite(v)] or [math.nan]
      table.add_row(key, _format(series[0]), _format(series[-1]), _format(min(finite)),
                    _format(max(finite)), _format(sum(finite) / len(finite)))
    return table

  def close(self) -> None:
    """Flushes the files, stops the progress bar, prints the summary table."""
    if self._progress is not None:
      self._progress.stop()
      self._progress = None
    if self._writer is not None:
      self._writer.close()
      self._writer = None
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self.enabled and self._history and self.summary_keys != ():
      self.console.print(self.summary_table())

  def __enter__(self) -> MetricsLogger:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
