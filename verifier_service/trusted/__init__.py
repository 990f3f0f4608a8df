"""The trusted side of the trust boundary: code that decides verdicts, never beside candidate code.

- `judge.py`: the judge process of each job (forked by worker/process.py beside the candidate's
  process): the reference's outputs and timings, inputs regenerated from seeds, and the
  comparison of the candidate's outputs, which arrive as bytes (run/wire.py).
- `compare.py`: the comparison rules, run only in the judge.
- `verdict.py`: run in the worker, merges both processes' reports and exits into one verdict.
- `exploits.py`: which findings reject a verdict whatever the run ended in (the worker's merge
  and the pool's timeouts apply it).

Nothing in this package may import from `verifier_service.untrusted` (tests check it): what runs
beside candidate code must not be what judges it.
"""
