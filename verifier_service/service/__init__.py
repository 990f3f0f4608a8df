"""The server process: everything that serves requests and never executes candidate code.

- `server.py`: the gRPC front (Verify, VerifyStream, GetInfo, health, reflection, auth).
- `scheduler.py`: one request through the stages; admission, deduplication, verdict caching.
- `pool.py`: the worker processes (worker/process.py), N slots per GPU, time limits, restarts.
- `config.py`: server settings and the options a job runs with.
- `verdict_store.py`, `metrics.py`, `logs.py`: verdicts on disk, Prometheus, structured logs.
- `remote.py`: the client side `dice-verifier check --server` uses.
"""
