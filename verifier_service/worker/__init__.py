"""Stages 3 and 4 for one GPU slot: the worker process, above both sides of the trust boundary.

- `process.py`: one process per GPU slot (`python -m verifier_service.worker`); forks the judge
  (trusted/) and the candidate's process (untrusted/) for each job, serves both, and merges their
  reports into a verdict (trusted/verdict.py).
- `pair.py`: a job's two processes, from fork to reaping.
- `job_process.py`: the body of each forked process, up to its role's run (trusted/judge.py or
  untrusted/child.py).

Decision: this package is the only one that imports both trusted/ and untrusted/, and it sits
above both (tests/test_import_direction.py), so run/ below them holds only what both sides share.
"""
