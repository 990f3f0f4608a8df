"""The untrusted side of the trust boundary: code that runs in the candidate's process.

Everything here shares an address space with candidate code, which can change any of it (Python
functions, torch's operator registrations, memory). So nothing here decides a verdict: it answers
the judge's commands with bytes (the candidate's outputs) and reports evidence against the
candidate (exploit findings, torch ops, kernel launches) that the trusted side weighs.

- `child.py`: the candidate's process of each job (forked by worker/process.py beside the judge).
- `guards.py`, `probes.py`, `dispatch.py`: observers and tripwires that run beside the candidate.
"""
