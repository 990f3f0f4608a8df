"""Stages 3 and 4 across the trust boundary: the worker process and what both sides share.

- `worker.py`: one process per GPU slot; forks the judge (trusted/) and the candidate's process
  (untrusted/) for each job, serves both, and merges their reports into a verdict.
- `sandbox.py`: what each forked child may do (namespaces, rlimits, Landlock, seccomp).
- `wire.py`: the bytes that cross between the two children.
- `job.py`: the options a job runs with (`JobOptions`), typed on both sides of the worker boundary.
- `problem.py`, `ops.py`, `timing.py`, `policy.py`: what both sides compute alike (inputs from
  seeds, op families, the timer, who did the work).

Nothing here except worker.py imports either side (tests check it).
"""
