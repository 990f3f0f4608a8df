"""Reaching the verifier for every command: targets, preflight, what it can do.

A spec is `local` (a loopback server started for this run, see local.py) or one or more
`HOST:PORT` / gRPC target URIs separated by commas. Before any work is queued, every target is
asked for its ServerInfo, so an unreachable or unauthorised verifier is one clear error at the
start instead of a run of INFRA_ERROR verdicts, and the reports can say up front whether the
verifier has a GPU (if not, verdicts are compile-only) and which architecture it builds for.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.verifier.channels import ClientConfig
from dice_jax.verifier.defaults import EVALUATION, UseDefaults
from dice_jax.verifier.local import LocalVerifier, LocalVerifierError
from dice_jax.verifier.sync_client import VerifierClient

_log = logging.getLogger(__name__)
LOCAL = "local"


class VerifierUnreachable(RuntimeError):
  """No verifier target answered the preflight."""


# What `connect` raises when there is no verifier to use (the commands' exit code VERIFIER);
# ValueError means a malformed spec or unreadable token/TLS files (a usage error).
UNAVAILABLE = (VerifierUnreachable, LocalVerifierError)


@dataclasses.dataclass
class Connection:
  """A verifier client plus what its servers said about themselves."""

  client: VerifierClient
  info: dict[str, pb.ServerInfo]  # the targets that answered
  local: LocalVerifier | None = None

  @property
  def has_gpu(self) -> bool:
    return any(i.gpus for i in self.info.values())

  @property
  def archs(self) -> list[str]:
    """Architectures the servers run on (their GPUs), else the one they compile for."""
    found = {g.arch for i in self.info.values() for g in i.gpus if g.arch}
    if not found:
      found = {i.environment.gpu_arch for i in self.info.values() if i.environment.gpu_arch}
    return sorted(found)

  def describe(self) -> str:
    parts = []
    for target, info in self.info.items():
      env = info.environment
      gpus = ", ".join(f"{g.name} ({g.arch})" for g in info.gpus) or "no GPU (compile-only)"
      where = f"local ({target})" if self.local is not None else target
      parts.append(f"{where}: {gpus}; nvcc {env.nvcc_version or '?'}, torch "
                   f"{env.torch_version or '?'}, server {info.server_version or '?'}")
    return "; ".join(parts)

  def close(self) -> None:
    try:
      self.client.close()
    finally:
      if self.local is not None:
        self.local.stop()


def parse_targets(spec: str) -> tuple[str, ...]:
  targets = tuple(t.strip() for t in spec.split(",") if t.strip())
  if not targets:
    raise ValueError("--verifier needs HOST:PORT (or several, comma-separated) or 'local'")
  for t in targets:
    if "://" not in t and ":" not in t.lstrip("["):
      raise ValueError(f"verifier target {t!r} has no port; write HOST:PORT, e.g. 127.0.0.1:50051")
  return targets


def connect(spec: str, *, use: UseDefaults = EVALUATION, local_cache_dir: str | os.PathLike[str] | None = None,
            local_log: str | os.PathLike[str] | None = None, **client_settings) -> Connection:
  """A preflighted connection; raises one of UNAVAILABLE (or ValueError for a bad spec or files).

  `use`: the timeouts and in-flight window (defaults.TRAINING or EVALUATION); `client_settings`
  are ClientConfig fields that override them or add to them (auth_token_file, TLS, ...).
  """
  local = LocalVerifier(cache_dir=local_cache_dir, log_path=local_log) if spec.strip() == LOCAL else None
  client = None
  try:  # whatever goes wrong (Ctrl-C included), a started local server is stopped
    targets = (local.start(),) if local is not None else parse_targets(spec)
    client = VerifierClient(ClientConfig(targets=targets, **(dataclasses.asdict(use) | client_settings)))
    answers = client.info()
    info = {t: a for t, a in answers.items() if isinstance(a, pb.ServerInfo)}
    errors = {t: a for t, a in answers.items() if not isinstance(a, pb.ServerInfo)}
    if not info:
      detail = "; ".join(f"{t}: {e}" for t, e in errors.items())
      raise VerifierUnreachable(f"cannot reach the verifier ({detail}). Start one with "
                                "`dice-verifier serve --listen HOST:PORT`, or pass --verifier local")
  except BaseException:
    if client is not None:
      client.close()
    if local is not None:
      local.stop()
    raise
  for target, error in errors.items():
    _log.warning("verifier %s did not answer (%s); continuing with the others", target, error)
  return Connection(client, info, local)
