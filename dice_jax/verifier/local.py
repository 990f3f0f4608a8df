"""`--verifier local`: a real verifier server on loopback, started as a child process for one run.

Decision: a child process (`python -m verifier_service.cli serve --listen 127.0.0.1:<port>`), not
the verifier's scheduler inside our process. It is the same server and the same gRPC path a remote
farm uses (so there is one client code path and one set of verdict semantics); dice_jax keeps
never importing verifier_service or torch (ARCHITECTURE.md); compile processes and GPU workers
cannot take the caller down; and it is stopped (SIGTERM, then SIGKILL) when the run ends. It needs the
verifier's install (`pip install "dice-jax[verify]"`, torch and nvcc); without a GPU it gives
compile-only NO_GPU verdicts, which every report states plainly.

Decision: the server's life is tied to ours by a pipe, not by PR_SET_PDEATHSIG. The child's
standard input is a pipe whose write end only this process holds; `serve --stop-on-stdin-eof`
drains and exits when it reads end of file, which the kernel delivers however we end (SIGKILL
included). PR_SET_PDEATHSIG follows the *thread* that started the child: `dice train` starts the
server from a short-lived thread, whose exit SIGTERMed the server right after its preflight, so
every rollout's verdicts came back "not reachable" (and no reward was ever earned). Without a
`preexec_fn`, subprocess also starts the child with vfork + exec, running no Python in a forked
copy of a multithreaded (JAX) process.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc

_STOP_TIMEOUT_S = 45.0  # the server drains for up to 30 s on SIGTERM


class LocalVerifierError(RuntimeError):
  """The local verifier could not be started."""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class LocalVerifier:
  """A loopback verifier server for the lifetime of a `with` block (or start() ... stop())."""

  def __init__(self, *, cache_dir: str | os.PathLike[str] | None = None,
               compile_workers: int | None = None, log_path: str | os.PathLike[str] | None = None,
               startup_timeout_s: float = 180.0, extra_args: tuple[str, ...] = ()):
    self.cache_dir = cache_dir
    self.compile_workers = compile_workers
    self.log_path = pathlib.Path(log_path) if log_path else pathlib.Path(
        tempfile.mkstemp(prefix="dice-local-verifier-", suffix=".log")[1])
    self.startup_timeout_s = startup_timeout_s
    self.extra_args = tuple(extra_args)
    self.target: str | None = None
    self._proc: subprocess.Popen | None = None

  def _command(self, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "verifier_service.cli", "serve", "--listen", f"127.0.0.1:{port}",
           "--log-level", "WARNING", "--stop-on-stdin-eof"]
    if self.cache_dir is not None:
      cmd += ["--cache-dir", str(self.cache_dir)]
    if self.compile_workers is not None:
      cmd += ["--compile-workers", str(self.compile_workers)]
    return cmd + list(self.extra_args)

  def start(self) -> str:
    """Starts the server and waits until it accepts connections; returns its HOST:PORT."""
    for name in ("verifier_service", "torch"):
      if importlib.util.find_spec(name) is None:
        raise LocalVerifierError(f"--verifier local needs the verifier installed ({name} is missing): "
                                 "pip install 'dice-jax[verify]', or give --verifier HOST:PORT")
    self.log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
      return self._start()
    except BaseException:  # Ctrl-C or SIGTERM while waiting: never leave the server behind
      self.stop()
      raise

  def _start(self) -> str:
    for _ in range(3):  # a port taken between picking and binding: try another
      port = free_port()
      with open(self.log_path, "ab") as log:
        self._proc = subprocess.Popen(self._command(port), stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.PIPE, start_new_session=True)
      if self._wait_ready(f"127.0.0.1:{port}"):
        self.target = f"127.0.0.1:{port}"
        atexit.register(self.stop)  # a last resort if the caller's own cleanup never runs
        return self.target
      if "bind" not in self._log_tail().lower():
        break
    raise LocalVerifierError(f"the local verifier did not start (log: {self.log_path}):\n"
                             f"{self._log_tail()}")

  def _wait_ready(self, target: str) -> bool:
    deadline = time.monotonic() + self.startup_timeout_s
    with grpc.insecure_channel(target) as channel:
      while time.monotonic() < deadline:
        if self._proc.poll() is not None:
          return False
        try:
          grpc.channel_ready_future(channel).result(timeout=1.0)
          return True
        except grpc.FutureTimeoutError:
          continue
    self.stop()
    raise LocalVerifierError(f"the local verifier did not accept connections within "
                             f"{self.startup_timeout_s:g}s (log: {self.log_path})")

  def _log_tail(self, lines: int = 20) -> str:
    try:
      return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
      return ""

  def stop(self) -> None:
    """SIGTERM (the server drains), then SIGKILL of its whole process group if it lingers."""
    proc, self._proc, self.target = self._proc, None, None
    atexit.unregister(self.stop)
    if proc is None:
      return
    if proc.stdin is not None:
      proc.stdin.close()
    if proc.poll() is not None:
      return
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(timeout=_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()

  def __enter__(self) -> LocalVerifier:
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.stop()
