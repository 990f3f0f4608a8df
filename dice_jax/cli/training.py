"""What `dice train` and `dice sft` share: their common flags, the resolved config (or
--print-config), and a training loop run under StopFlag with its outcome turned into an exit code.

Each command keeps what is its own: its config schema and loader, the loop it runs, the errors
only it can meet (`dice train`'s verifier), and what it prints at the end.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dice_jax.cli.exit_codes import Exit
from dice_jax.cli.signals import StopFlag

CODES = (Exit.OK, Exit.USAGE, Exit.DIVERGED, Exit.CHECKPOINT, Exit.PREEMPTED, Exit.INTERRUPTED)
WORDING = dict(USAGE="bad config/data/model dir", INTERRUPTED="Ctrl-C after saving")


def add_run_flags(parser: argparse.ArgumentParser, overrides_example: str) -> None:
  """KEY=VALUE overrides, --print-config and --log-level."""
  parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                      help=f"dotted overrides applied after the file, e.g. {overrides_example} (values are "
                           "YAML: [a,b], null, 1e-6)")
  parser.add_argument("--print-config", action="store_true",
                      help="print the resolved config as YAML and exit without training")
  parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                      help="Python logging level on stderr (default: INFO)")


def configure_logging(level: str, quiet: tuple[str, ...]) -> None:
  """Timestamped logs on stderr; the `quiet` loggers (orbax's absl, JAX's start-up chatter such as
  "no TPU backend") only from WARNING unless DEBUG/INFO is below that anyway."""
  logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
  for noisy in quiet:
    logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def resolve(prog: str, load: Callable[[], Any], print_config: bool, where: str = "") -> tuple[Any, Exit | None]:
  """(the config, None) to train with, or (None, the exit code) after a config error or --print-config."""
  from dice_jax.config import ConfigError, to_yaml  # deferred: `dice --help` stays fast

  try:
    cfg = load()
  except ConfigError as e:
    print(f"{prog}: config error: {where}{e}", file=sys.stderr)
    return None, Exit.USAGE
  if print_config:
    print(to_yaml(cfg), end="")
    return None, Exit.OK
  return cfg, None


def run(prog: str, loop: Callable[..., Any], cfg: Any, stop: StopFlag, *,
        usage_errors: tuple[type[BaseException], ...] = (),
        errors: Mapping[type[BaseException] | tuple[type[BaseException], ...], tuple[Exit, str]] | None = None,
        finished: Callable[[Any], Exit | None] | None = None, exported: str = "model") -> Exit:
  """Runs `loop(cfg, should_stop=stop)` and returns the exit code of its result or failure.

  `usage_errors` (beside config, model and missing-file errors) exit USAGE; `errors` maps other
  exceptions to (code, message prefix). `finished(result)` runs first on a result and may decide
  the code itself; `exported` names what `hf_dir` holds in the final message.
  """
  from dice_jax.checkpoints import CheckpointError  # pylint: disable=import-outside-toplevel
  from dice_jax.config import ConfigError  # pylint: disable=import-outside-toplevel
  from dice_jax.model.config import UnsupportedModelError  # pylint: disable=import-outside-toplevel
  from dice_jax.model.hf_io import CheckpointError as HFCheckpointError  # pylint: disable=import-outside-toplevel
  from dice_jax.train.step import TrainingDiverged  # pylint: disable=import-outside-toplevel

  known: dict[type[BaseException] | tuple[type[BaseException], ...], tuple[Exit, str]] = {
      (ConfigError, UnsupportedModelError, FileNotFoundError, *usage_errors): (Exit.USAGE, ""),
      **(errors or {}), TrainingDiverged: (Exit.DIVERGED, "training diverged: "),
      (CheckpointError, HFCheckpointError): (Exit.CHECKPOINT, "checkpoint error: ")}
  try:
    with stop:
      result = loop(cfg, should_stop=stop)
  except tuple(t for kinds in known for t in (kinds if isinstance(kinds, tuple) else (kinds,))) as e:
    code, prefix = next(v for kinds, v in known.items() if isinstance(e, kinds))
    print(f"{prog}: {prefix}{e}", file=sys.stderr)
    return code
  decided = finished(result) if finished is not None else None
  if decided is not None:
    return decided
  if result.status == "done":
    where = f"; {exported} in Hugging Face layout: {result.hf_dir}" if result.hf_dir else ""
    print(f"{prog}: done at step {result.step} in {result.run_dir}{where}", file=sys.stderr)
    return Exit.OK
  print(f"{prog}: {result.status} at step {result.step} (checkpoint saved); run the same command to resume",
        file=sys.stderr)
  return Exit.INTERRUPTED if stop.signal == signal.SIGINT else Exit.PREEMPTED
