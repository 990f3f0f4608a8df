"""`KernelGenerator`: best-of-N CUDA kernels for a user's PyTorch module, each one verified.

    gen = dj.KernelGenerator("ckpt/", verifier="10.0.0.5:50051", arch="sm_90", precision="fp32")
    result = gen.generate("my_model.py", num_samples=8)
    if result.verified:
      result.write("ModelNew.py")        # correct on every trial, and the fastest such candidate
    for c in result.candidates:          # everything, best first, with verdicts
      print(c.name, c.outcome, c.speedup, c.verdict.message)

All samples come from one batched sampler call and are verified concurrently; identical
candidates are verified once (the client's cache). `extra_candidates` are verified and ranked
with the samples (e.g. a known-good kernel, to check the pipeline end to end).

Description-only mode (`generate(description="...")`, no reference): there is nothing to prove
the kernels equal to, so the verifier is sent a placeholder reference whose `Model` refuses to be
built. Candidates are parsed, statically checked and compiled; none is ever called verified
(`result.verified` is False, `result.best` is None), and the result's notes say so.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
from collections.abc import Callable, Sequence

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data import extract
from dice_jax.data import prompts
from dice_jax.data.problems import check_reference
from dice_jax.generation import arch as arch_lib
from dice_jax.generation import prompting
from dice_jax.sampler.completion import CompletionModel
from dice_jax.sampler.config import DICE_SAMPLING, SamplerConfig
from dice_jax.generation.ranking import INJECTED, SAMPLE, Candidate, best_compiled, best_verified, rank
from dice_jax.rewards.candidates import format_verdict
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.client import VerifyItem
from dice_jax.verifier.defaults import EVALUATION
from dice_jax.verifier.options import precision_enum
# Sent in description-only mode: passes the verifier's static reference check, so candidates are
# compiled, and fails when built, so no candidate is ever run against it or reported correct.
PLACEHOLDER_REFERENCE = '''\
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("description-only request: there is no reference to check against")


def get_inputs():
    return []


def get_init_inputs():
    return []
'''
REFERENCE, DESCRIPTION = "reference", "description"
UNVERIFIED_HEADER = ("# dice generate: UNVERIFIED. This kernel compiled and passed static checks, but "
                     "{why}, so nothing shows it is correct.\n")


@dataclasses.dataclass
class GenerationResult:
  """Every candidate, best first; `best` only when the verifier proved it correct."""

  mode: str  # REFERENCE or DESCRIPTION
  candidates: list[Candidate]
  best: Candidate | None
  arch: str
  precision: str
  correctness_available: bool  # a reference was given and the verifier has a GPU
  messages: list[dict[str, str]]
  notes: list[str]

  @property
  def verified(self) -> bool:
    return self.best is not None

  @property
  def verdict(self) -> pb.Verdict | None:
    return None if self.best is None else self.best.verdict

  @property
  def others(self) -> list[Candidate]:
    return [c for c in self.candidates if c is not self.best]

  def winner(self) -> tuple[Candidate | None, bool]:
    """(the candidate to hand out, whether it is verified): the best verified one, else the best
    compiled one when correctness could not be checked at all, else None."""
    if self.best is not None:
      return self.best, True
    if not self.correctness_available:
      # Compiled and got as far as checking could go: NO_GPU, or (description-only on a GPU
      # verifier) imported fine and stopped at the placeholder reference.
      clean = [c for c in self.candidates
               if c.compiled and c.source is not None and c.outcome in ("NO_GPU", "BAD_REFERENCE")]
      return (clean[0] if clean else best_compiled(self.candidates)), False
    return None, False

  def write(self, path: str | os.PathLike[str]) -> pathlib.Path:
    """Writes the winner as a KernelBench-format file; an unverified one gets a header saying so."""
    winner, verified = self.winner()
    if winner is None:
      raise ValueError("no candidate to write: none was proven correct"
                       if self.correctness_available else "no candidate compiled")
    text = winner.source
    if not verified:
      why = ("there was no reference to compare it with" if self.mode == DESCRIPTION
             else "the verifier has no GPU to run it")
      text = UNVERIFIED_HEADER.format(why=why) + text
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def read_reference(reference: str | os.PathLike[str]) -> str:
  """Source text from a path or the source itself; checked for Model/get_inputs/get_init_inputs."""
  if isinstance(reference, os.PathLike) or (
      isinstance(reference, str) and "\n" not in reference and reference.endswith(".py")):
    path = pathlib.Path(reference)
    try:
      text = path.read_bytes().decode("utf-8")
    except OSError as e:
      raise ValueError(f"{path}: cannot read the reference ({e.strerror})") from None
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}: the reference is not UTF-8 text ({e})") from None
    where = str(path)
  else:
    text, where = reference, "reference"
  check_reference(text, where)
  return text


class KernelGenerator:
  """A model, a verifier and a target: `generate` turns PyTorch code into verified CUDA kernels."""

  def __init__(self, model: str | os.PathLike[str] | CompletionModel, *,
               verifier: str | connect_lib.Connection = connect_lib.LOCAL, arch: str | None = None,
               precision: str = "fp32", decode: SamplerConfig = DICE_SAMPLING,
               template: prompts.PromptTemplate = prompts.END_TO_END,
               description_template: prompts.PromptTemplate = prompting.DESCRIPTION,
               options: pb.VerifyOptions | None = None,
               connect_timeout_s: float = EVALUATION.connect_timeout_s):
    """`verifier`: HOST:PORT (comma-separated for several), "local" (a loopback server started
    here), or an open Connection. `arch`: None means the verifier's GPU. `decode`: how to sample
    (a dj.SamplerConfig; default DICE's rollout settings). `options`: verifier options (trials,
    tolerances); precision is set from `precision`."""
    precision_value = precision_enum(precision)  # an unknown precision fails before anything starts
    if arch is not None:
      arch_lib.parse(arch)  # an unknown architecture fails before anything is started
    self._owns_connection = not isinstance(verifier, connect_lib.Connection)
    self.connection: connect_lib.Connection = (
        verifier if isinstance(verifier, connect_lib.Connection)
        else connect_lib.connect(verifier, use=EVALUATION, connect_timeout_s=connect_timeout_s))
    try:
      nvcc = [i.environment.nvcc_version for i in self.connection.info.values()]
      resolved = arch or (self.connection.archs[0] if self.connection.archs else None)
      if resolved is None:
        raise arch_lib.ArchError("the verifier reports no GPU architecture; pass arch='sm_90'-style")
      self.arch = arch_lib.check_arch(resolved, self.connection.archs, nvcc)
      self.precision = precision
      self.decode = decode
      self.template, self.description_template = template, description_template
      self.options = pb.VerifyOptions()
      if options is not None:
        self.options.CopyFrom(options)
      self.options.precision = precision_value
      self.model = model if isinstance(model, CompletionModel) else CompletionModel(model)
    except BaseException:
      self.close()
      raise

  def messages(self, reference_source: str | None, description: str | None) -> list[dict[str, str]]:
    if reference_source is not None:
      return prompting.reference_messages(reference_source, arch=self.arch, precision=self.precision,
                                          template=self.template)
    return prompting.description_messages(description, arch=self.arch, precision=self.precision,
                                          template=self.description_template)

  def generate(self, reference: str | os.PathLike[str] | None = None, *, description: str | None = None,
               num_samples: int = 8, extra_candidates: Sequence[str] = (), seed: int = 0,
               on_verdict: Callable[[Candidate], None] | None = None,
               on_sampled: Callable[[], None] | None = None) -> GenerationResult:
    """Samples `num_samples` candidates in one batched call, verifies them (and the extras)
    concurrently, and ranks them. `on_sampled()` fires when sampling is done and `on_verdict(c)`
    as each verdict arrives (for progress bars)."""
    if (reference is None) == (description is None):
      raise ValueError("give exactly one of a reference (PyTorch source or a path to it) and a "
                       "description")
    if num_samples < 0 or num_samples + len(extra_candidates) < 1:
      raise ValueError("nothing to verify: num_samples must be >= 1 (or give extra_candidates)")
    reference_source = read_reference(reference) if reference is not None else None
    mode = REFERENCE if reference_source is not None else DESCRIPTION
    messages = self.messages(reference_source, description)
    completions: list[str] = []
    if num_samples:
      prompt = self.model.encode(messages)
      self.model.check_fits([prompt], self.decode, ["the prompt"])
      completions = self.model.complete([prompt] * num_samples, self.decode, seed=seed,
                                        batch_size=num_samples)
    if on_sampled is not None:
      on_sampled()
    drafts = [(i, SAMPLE, extract.extract_end_to_end(text), text) for i, text in enumerate(completions)]
    drafts += [(num_samples + j, INJECTED, extract.Extraction(candidate=src), None)
               for j, src in enumerate(extra_candidates)]
    candidates = self._verify(drafts, reference_source, on_verdict)
    ranked = rank(candidates)
    available = mode == REFERENCE and self.connection.has_gpu
    result = GenerationResult(mode=mode, candidates=ranked, best=best_verified(ranked) if available else None,
                              arch=self.arch, precision=self.precision, correctness_available=available,
                              messages=messages, notes=[])
    result.notes = _notes(result, self.connection)
    return result

  def _verify(self, drafts, reference_source: str | None,
              on_verdict: Callable[[Candidate], None] | None) -> list[Candidate]:
    options = pb.VerifyOptions()
    options.CopyFrom(self.options)
    if reference_source is None:
      options.skip_timing = True
    reference = reference_source if reference_source is not None else PLACEHOLDER_REFERENCE
    out: list[Candidate] = []
    futures = {}
    for index, origin, found, text in drafts:
      if not found.ok:
        candidate = Candidate(index, origin, None, format_verdict(found.failure), text)
        out.append(candidate)
        if on_verdict is not None:
          on_verdict(candidate)
        continue
      item = VerifyItem(reference, found.candidate, options)
      futures[self.connection.client.submit([item])] = (index, origin, found.candidate, text)
    try:
      for future in concurrent.futures.as_completed(futures):
        index, origin, source, text = futures[future]
        candidate = Candidate(index, origin, source, future.result()[0], text)
        out.append(candidate)
        if on_verdict is not None:
          on_verdict(candidate)
    finally:
      for future in futures:
        future.cancel()
    return out

  def close(self) -> None:
    if self._owns_connection and getattr(self, "connection", None) is not None:
      self.connection.close()
      self.connection = None

  def __enter__(self) -> KernelGenerator:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _notes(result: GenerationResult, connection: connect_lib.Connection) -> list[str]:
  notes = []
  if result.mode == DESCRIPTION:
    notes.append("Description-only: there is no reference, so no candidate can be proven correct. "
                 "Candidates were parsed, statically checked and compiled only; none is verified.")
  elif not connection.has_gpu:
    notes.append("The verifier has no GPU: candidates were compiled and statically checked only. "
                 "Correctness and speed are unavailable; none is verified.")
  elif result.best is None:
    notes.append("No candidate was proven correct.")
  infra = sum(1 for c in result.candidates if c.outcome == "INFRA_ERROR")
  if infra:
    notes.append(f"{infra} candidate(s) got INFRA_ERROR (the verifier failed, not the candidate); "
                 "run again to retry them.")
  return notes
