"""One verdict from the two sides of a job: the judge's report, the candidate's report, their exits.

Runs in the worker (trusted; it never executes candidate code). The judge's report is trusted:
trials, timing, the reference's ops, its own findings. The candidate's report is evidence the
candidate may have withheld or bent, never a way to an OK: an OK needs the judge to have finished
every stage and the candidate's process to have reported. Failures are attributed:

  judge without a report (it never runs candidate code)          INFRA_ERROR (retried once)
  judge: BAD_REFERENCE / INFRA_ERROR                             that
  candidate's process failed before candidate code was loaded    INFRA_ERROR
  candidate's process killed by SIGXCPU / SIGXFSZ                RUNTIME_ERROR, RESOURCE_EXHAUSTION
  ... by SIGKILL (not the verifier: the kernel's OOM killer)     RUNTIME_ERROR, RESOURCE_EXHAUSTION
  ... by SIGSYS (seccomp)                                        RUNTIME_ERROR, SANDBOX_VIOLATION
  ... by another signal                                          RUNTIME_ERROR, CRASH, with the log
  ... exited without a report once loaded                        RUNTIME_ERROR, CRASH
  ... reported an error (its raise, or verifier code it broke)   that (RUNTIME_ERROR)
  judge: INCORRECT (its own comparison; checked before the rows above)   INCORRECT
  judge: the candidate's side stopped answering or answered nonsense   RUNTIME_ERROR
Then the exploit findings of both sides, the seccomp supervisor's and the partial-replacement
policy's (run/policy.py) go to `exploits.apply_policy`, which REJECTS clear hacks whatever the run
ended in. Timeouts are the pool's to classify (it kills both processes).

A RUNTIME_ERROR that was the device allocator running out of memory in the candidate's process,
on a problem large for that process's share (`short_of_memory`), carries SHORT_OF_MEMORY: the
scheduler then runs the job once more alone on its GPU, and that run's verdict stands. So does the
INFRA_ERROR of a problem whose timing copies the judge found too large for that share.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier_service import enums
from verifier_service.run import envelope
from verifier_service.run import job as job_lib
from verifier_service.run import policy
from verifier_service.trusted import exploits

# Internal key of a merged verdict (never sent): the run deserves a retry alone on its GPU.
SHORT_OF_MEMORY = "short_of_memory"
# Decision: a candidate's process that ran out of GPU memory where the verifier's own work in it
# (the problem's inputs and outputs; in the timing stage the outputs it keeps, judge.timing_bytes)
# takes at least this part of its share may have run out of memory that is ours to give. Besides
# the candidate's work the verifier keeps several output-sized tensors there (the allocator's NaN
# blocks, the outputs it encodes, the caching probe's two calls): DICE 3497 (4.5 GB of inputs and
# outputs) ran out in our code at 4 slots per GPU (15.7 GiB), and again in the timing stage at a
# 31.5 GiB share (H200, 2026-12-04: kept timed outputs were not counted then). Otherwise running
# out is the candidate's doing.
MEMORY_RETRY_SHARE = 0.25

_SIGNAL_CAUSES = {
    "SIGXCPU": (enums.RESOURCE_EXHAUSTION, "CPU time limit (RLIMIT_CPU) exceeded"),
    "SIGXFSZ": (enums.RESOURCE_EXHAUSTION, "file size limit (RLIMIT_FSIZE) exceeded"),
    "SIGKILL": (enums.RESOURCE_EXHAUSTION, "killed by SIGKILL, not by the verifier: the kernel's "
                "out-of-memory killer"),
    "SIGSYS": (enums.SANDBOX_VIOLATION, "killed by seccomp (SIGSYS)"),
}


def _tail(text: str) -> str:
  fatal = text.find("Fatal Python error")
  return (text[fatal:fatal + 600] if fatal >= 0 else text[-600:]).strip()


def _candidate_failure(cand: dict[str, Any], stage: str) -> tuple[str, str, list] | None:
  """(outcome, message, findings) when the candidate's process ended the run, else None."""
  report: envelope.CandidateReport | None = cand.get("report")
  status = cand.get("status", {})
  if report is None:
    if cand.get("refused"):
      status = dict(status, report_refused=cand["refused"])
    if not cand.get("loading"):
      return enums.INFRA_ERROR, (f"the candidate's process failed before the candidate was loaded "
                             f"({status}): {_tail(cand.get('log_tail', ''))}"), []
    if status.get("killed_by_worker"):
      return enums.RUNTIME_ERROR, (f"the candidate's process neither reported nor exited after the "
                               f"judge ended the run in {stage}"), []
    if "signal" in status:
      kind, cause = _SIGNAL_CAUSES.get(status["signal_name"], (enums.CRASH, status["signal_name"]))
      return enums.RUNTIME_ERROR, (f"ModelNew killed the worker with {status['signal_name']} in "
                               f"{stage} ({cause}): {_tail(cand.get('log_tail', ''))}"), [
                                   (kind, cause)]
    return enums.RUNTIME_ERROR, (f"the candidate's process exited ({status}) without reporting, in "
                             f"{stage}: {_tail(cand.get('log_tail', ''))}"), [
                                 (enums.CRASH, f"exited with {status} in {stage}")]
  if report.infra:  # only credible before candidate code could have written the report
    outcome = enums.RUNTIME_ERROR if cand.get("loading") else enums.INFRA_ERROR
    return outcome, f"candidate's process: {report.infra}", []
  if report.error is not None:
    return report.error.outcome, report.error.message, []
  return None


def _strings(value: tuple[str, ...], limit: int) -> tuple[str, ...]:
  return tuple(v[:300] for v in value[:limit])


def _untrusted(report: envelope.CandidateReport | None) -> envelope.CandidateReport | None:
  """The candidate's report with its values bounded: its process may have written anything of
  the report's types into it, and nothing it wrote may break the verdict (an unknown exploit name,
  a huge list). Its claimed failure is a RUNTIME_ERROR, whatever outcome it names."""
  if report is None:
    return None
  raw = report.evidence
  evidence = None if raw is None else envelope.Evidence(
      launched=None if raw.launched is None else _strings(raw.launched, 64),
      own_fraction=None if raw.own_fraction is None else min(1.0, max(0.0, raw.own_fraction)),
      library=tuple((n[:200], d) for n, d in raw.library[:3]),
      compute_ops={k[:120]: v for k, v in list(raw.compute_ops.items())[:256]},
      kernel_names=_strings(raw.kernel_names, 64), foreign_kernels=_strings(raw.foreign_kernels, 8),
      note=raw.note[:300])
  error = report.error
  return dataclasses.replace(
      report, evidence=evidence, forward_ops=_strings(report.forward_ops, 64),
      findings=tuple((k, e[:500]) for k, e in report.findings if k in enums.EXPLOITS)[:32],
      infra=report.infra[:500],
      error=None if error is None else envelope.CandidateFailure(
          outcome=enums.RUNTIME_ERROR, message=error.message[:2000],
          out_of_memory=error.out_of_memory))


def short_of_memory(outcome: str, judge_report: envelope.JudgeReport | None,
                    cand_report: envelope.CandidateReport | None) -> bool:
  """A RUNTIME_ERROR: the candidate's process ran out of device memory (its own word: at worst it
  buys itself one more run) on a problem the judge measured at MEMORY_RETRY_SHARE of that
  process's share or more (the judge's word, which decides). An INFRA_ERROR: the judge found the
  verifier's own copies larger than the share (judge.timing_plan) and timed nothing."""
  memory = judge_report.memory if judge_report is not None else None
  if memory is None or memory.share_bytes <= 0:
    return False
  if outcome == enums.INFRA_ERROR:
    return memory.problem_bytes > memory.share_bytes
  if outcome != enums.RUNTIME_ERROR or cand_report is None or cand_report.error is None:
    return False
  return cand_report.error.out_of_memory and (
      memory.problem_bytes >= MEMORY_RETRY_SHARE * memory.share_bytes)


def merge(options: job_lib.JobOptions, judge: dict[str, Any], cand: dict[str, Any],
          violations: list[dict[str, str]]) -> dict[str, Any]:
  """The Verdict-shaped dict (proto field names) for one job."""
  verdict: dict[str, Any] = {"policy": options.policy, "stage_timings": [], "trials": []}
  found: list[tuple[str, str]] = []
  cand = dict(cand, report=_untrusted(cand.get("report")))
  report: envelope.JudgeReport | None = judge.get("report")
  if report is None:
    refused = f"; its report was refused: {judge['refused']}" if judge.get("refused") else ""
    verdict.update(outcome=enums.INFRA_ERROR, stage=judge.get("phase", enums.STAGE_LOAD), message=(
        f"the judge process exited ({judge.get('status')}) without a report{refused}: "
        f"{_tail(judge.get('log_tail', ''))}"))
  else:
    stage = report.stage
    verdict.update(stage=stage, trials=[dataclasses.asdict(t) for t in report.trials],
                   stage_timings=[dataclasses.asdict(t) for t in report.stage_timings],
                   environment=dict(report.environment))
    if report.timing is not None:
      verdict["timing"] = dict(report.timing)
    found += list(report.findings)
    outcome = report.outcome
    # The judge's own comparison decides INCORRECT: whatever the candidate's process did after
    # (the judge closes its socket on a wrong answer, which that process may report as an error).
    failure = None if outcome in (enums.BAD_REFERENCE, enums.INFRA_ERROR, enums.INCORRECT) else (
        _candidate_failure(cand, stage))
    if failure is not None:
      verdict.update(outcome=failure[0], message=failure[1])
      found += failure[2]
    elif outcome in (enums.OK, enums.INCORRECT, enums.BAD_REFERENCE, enums.INFRA_ERROR):
      verdict.update(outcome=outcome, message=report.message)
    else:  # the candidate's side stopped answering: a rejecting finding, or the candidate's doing
      verdict.update(outcome=enums.RUNTIME_ERROR, message=(
          f"the candidate's process ended the run in {stage}: {report.candidate_ended}"))
      verdict["stopped"] = True
  evidence_of: envelope.CandidateReport | None = cand["report"]
  evidence = evidence_of.evidence if evidence_of is not None else None
  if evidence_of is not None:
    found += list(evidence_of.findings)
  if evidence_of is not None and evidence is not None:
    verdict["forward_ops"] = list(evidence_of.forward_ops)
    verdict["launched_kernels"] = list(evidence.launched or [])
    if evidence.own_fraction is not None:
      verdict["custom_kernel_time_fraction"] = float(evidence.own_fraction)
    if evidence.note:
      verdict["message"] = verdict.get("message") or evidence.note
    if report is not None and verdict["outcome"] not in (enums.BAD_REFERENCE, enums.INFRA_ERROR):
      found += policy.findings(options.policy, options.min_custom_kernel_fraction,
                               dataclasses.asdict(evidence),
                               None if report.reference_ops is None else list(report.reference_ops))
  speedup = verdict.get("timing", {}).get("speedup", 0.0)
  if speedup > options.plausible_speedup:
    found.append((enums.IMPLAUSIBLE_SPEEDUP, f"speedup {speedup:.1f}x"))
  verdict["exploits"] = [{"kind": k, "evidence": str(e)} for k, e in found] + list(violations)
  if verdict.pop("stopped", False) and any(f["kind"] in exploits.REJECTING
                                           for f in verdict["exploits"]):
    verdict.update(outcome=enums.REJECTED, message="")  # stopped for that finding: it is the reason
  verdict = exploits.apply_policy(verdict)
  if short_of_memory(verdict["outcome"], report, cand["report"]):
    verdict[SHORT_OF_MEMORY] = True
  return verdict
