"""From completions to verdicts: extract and assemble each candidate, verify the ones that exist.

A completion with no usable code never reaches the verifier: it gets a local *format verdict*
(REJECTED at STAGE_PARSE, message "format: ...", no exploit findings), which every default reward
scores 0 and which is not a hack. Phase-1 candidates are assembled as prefix + middle + suffix.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import extract
from dice_jax.verifier.client import VerifyItem
from dice_jax.verifier.sync_client import VerifierClient


def format_verdict(failure: str) -> pb.Verdict:
  """The verdict of a completion from which no candidate could be extracted."""
  return pb.Verdict(outcome=pb.REJECTED, stage=pb.STAGE_PARSE, message=failure)


def is_format_verdict(verdict: pb.Verdict) -> bool:
  """True for a `format_verdict` (made here, never by a verifier: it has no request id)."""
  return (verdict.outcome == pb.REJECTED and verdict.stage == pb.STAGE_PARSE
          and not verdict.request_id and verdict.message.startswith(f"{extract.FORMAT}:"))


def extract_all(completions: Sequence[str], *, phase: Sequence[int], prefix: Sequence[str],
                suffix: Sequence[str]) -> list[extract.Extraction]:
  """`extract.extract_candidate` per completion, with the per-completion item columns."""
  if not len(completions) == len(phase) == len(prefix) == len(suffix):
    raise ValueError(f"{len(completions)} completions but {len(phase)} phase, {len(prefix)} prefix and "
                     f"{len(suffix)} suffix entries; item columns must be repeated per completion")
  return [extract.extract_candidate(text, phase=ph, prefix=pre, suffix=suf)
          for text, ph, pre, suf in zip(completions, phase, prefix, suffix)]


def submit_completions(client: VerifierClient, completions: Sequence[str], *, phase: Sequence[int],
                       reference_source: Sequence[str], prefix: Sequence[str], suffix: Sequence[str],
                       options: pb.VerifyOptions | None = None,
                       **_) -> concurrent.futures.Future[list[pb.Verdict]]:
  """A future of one verdict per completion (format verdicts filled in locally).

  Takes the item columns as keywords (extra columns are ignored), so a trainer can pass
  `**columns` straight from the data stream.
  """
  if len(reference_source) != len(completions):
    raise ValueError(f"{len(completions)} completions but {len(reference_source)} references")
  found = extract_all(completions, phase=phase, prefix=prefix, suffix=suffix)
  sent = [i for i, f in enumerate(found) if f.ok]
  inner = client.submit([VerifyItem(reference_source[i], found[i].candidate, options) for i in sent])
  outer: concurrent.futures.Future[list[pb.Verdict]] = concurrent.futures.Future()

  def merge(done: concurrent.futures.Future) -> None:
    if done.cancelled():
      outer.cancel()
      return
    if done.exception() is not None:
      outer.set_exception(done.exception())
      return
    verdicts = [format_verdict(f.failure) if not f.ok else None for f in found]
    for i, verdict in zip(sent, done.result()):
      verdicts[i] = verdict
    outer.set_result(verdicts)

  inner.add_done_callback(merge)
  return outer
