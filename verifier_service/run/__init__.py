"""What both sides of the trust boundary share in stages 3 and 4, below both of them.

- `sandbox.py`: what each forked child may do (namespaces, rlimits, Landlock, seccomp).
- `wire.py`: the bytes that cross between the two children.
- `job.py`: the options a job runs with (`JobOptions`), typed on both sides of the worker boundary.
- `envelope.py`: the job, the envelope the worker hands its two processes, and their reports:
  typed values, refused where they are read when a field is missing, unknown or of a wrong type.
- `problem.py`, `ops.py`, `timing.py`, `policy.py`, `budget.py`: what both sides compute alike
  (inputs from seeds, op families, the timer, who did the work, the run stage's time budget).

Nothing here imports either side: the worker that forks both is above them (verifier_service/worker/;
tests/test_import_direction.py checks it).
"""
