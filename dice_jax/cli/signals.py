"""How the commands turn signals into clean stops.

`StopFlag` (dice train, dice sft): SIGTERM or a first Ctrl-C sets a flag the training loop polls;
it saves a checkpoint and returns. `sigterm_as_interrupt` (dice eval, dice generate): SIGTERM
raises KeyboardInterrupt like Ctrl-C, so `finally` blocks stop a local verifier and the command
exits with its INTERRUPTED code.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading


class StopFlag:
  """Set by SIGTERM (and the first Ctrl-C) while installed; the loop saves and returns.

  Single-process runs only: processes of a pod would see the signal at different steps, and
  JAX's own preemption notice (synchronised by jax.distributed, honoured through orbax's
  `reached_preemption`) must keep its SIGTERM handler. `enabled=False` installs nothing.
  """

  def __init__(self, enabled: bool = True):
    self.enabled = enabled
    self.signal: int | None = None
    self._previous = {}

  def __call__(self) -> bool:
    return self.signal is not None

  def _handle(self, signum, frame):
    del frame
    self.signal = signum
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: stop now
    logging.getLogger(__name__).warning("signal %d: saving a checkpoint, then stopping", signum)

  def __enter__(self) -> StopFlag:
    if self.enabled and threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


@contextlib.contextmanager
def sigterm_as_interrupt():
  """Within the block, SIGTERM (e.g. `timeout`, a batch scheduler) raises KeyboardInterrupt like
  Ctrl-C, so `finally` blocks run: a local verifier is stopped instead of being orphaned, and
  the interrupted command exits with its documented code. No-op outside the main thread."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def interrupt(signum, frame):
    del signum, frame
    raise KeyboardInterrupt

  previous = signal.signal(signal.SIGTERM, interrupt)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)
