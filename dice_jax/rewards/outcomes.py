"""What happened to each completion, as one label: the verdict's outcome, or why there is none.

Every completion of a rollout ends in exactly one of:
  FORMAT        no candidate could be extracted, so nothing was sent (a local "format" verdict,
                dice_jax.rewards.candidates; `dice eval` reports use the same label);
  UNREACHABLE   sent, but no verifier answered (a verdict the client made: unreachable targets,
                broken streams, deadlines, a closed client);
  <OUTCOME>     the verifier's own verdict: OK, COMPILE_ERROR, INCORRECT, ..., INFRA_ERROR.
A verdict counts as the verifier's when it carries the server's `environment.server_version`,
which every verdict a server's pipeline makes does; a client-made one never does. These labels
are what `dice train` counts per step (`outcomes/<label>`), writes beside sampled completions and
reads back to explain a run whose rewards are all zero, so the explanation is a measurement.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.rewards.candidates import is_format_verdict

FORMAT = "FORMAT"
UNREACHABLE = "UNREACHABLE"
# Every label, in the order reports list them.
LABELS: tuple[str, ...] = (
    "OK", "NO_GPU", "INCORRECT", "COMPILE_ERROR", "RUNTIME_ERROR", "TIMEOUT", "REJECTED", FORMAT,
    "BAD_REFERENCE", "INFRA_ERROR", UNREACHABLE)
_DESCRIPTIONS = {
    "OK": "correct", "NO_GPU": "compiled (no GPU: not run)", "INCORRECT": "compiled, wrong output",
    "COMPILE_ERROR": "did not compile", "RUNTIME_ERROR": "crashed when run", "TIMEOUT": "timed out",
    "REJECTED": "rejected by the verifier's checks", FORMAT: "no code found, never sent",
    "BAD_REFERENCE": "the reference itself failed", "INFRA_ERROR": "verifier failure (ours)",
    UNREACHABLE: "no verifier answered"}


def from_server(verdict: pb.Verdict) -> bool:
  """Whether a verifier server made `verdict` (rather than the client or the trainer)."""
  return bool(verdict.environment.server_version)


def label(verdict: pb.Verdict) -> str:
  """The completion's label (see the module docstring)."""
  if is_format_verdict(verdict):
    return FORMAT
  if verdict.outcome == pb.INFRA_ERROR and not from_server(verdict):
    return UNREACHABLE
  return pb.Outcome.Name(verdict.outcome)


def counts(verdicts: Iterable[pb.Verdict]) -> collections.Counter[str]:
  return collections.Counter(label(v) for v in verdicts)


def describe(counted: Mapping[str, int | float]) -> str:
  """"12 COMPILE_ERROR (did not compile), 4 FORMAT (no code found, never sent)", largest first."""
  order = {name: i for i, name in enumerate(LABELS)}
  items = sorted(((name, int(n)) for name, n in counted.items() if n),
                 key=lambda item: (-item[1], order.get(item[0], len(order))))
  return ", ".join(f"{n} {name} ({_DESCRIPTIONS.get(name, name.lower())})" for name, n in items)


def metrics(labels: Sequence[str], phases: Sequence[int] | None = None) -> dict[str, float]:
  """`outcomes/<label>` counts of every label (zeros included, so curves are complete), and
  `phase<p>/outcomes/<label>` per phase present when `phases` is given."""
  def count(selected: Iterable[str], prefix: str) -> dict[str, float]:
    counted = collections.Counter(selected)
    return {f"{prefix}outcomes/{name}": float(counted.get(name, 0))
            for name in (*LABELS, *sorted(set(counted) - set(LABELS)))}

  out = count(labels, "")
  for phase in sorted(set(phases if phases is not None else ())):
    out |= count([lab for lab, p in zip(labels, phases) if p == phase], f"phase{phase}/")
  return out


def from_metrics(record: Mapping[str, float], prefix: str = "") -> dict[str, float]:
  """The `{label: count}` logged in one metrics record (see `metrics`)."""
  head = f"{prefix}outcomes/"
  return {k[len(head):]: v for k, v in record.items() if k.startswith(head)}
