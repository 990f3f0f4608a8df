"""verifier_service: compiles, checks and times KernelBench-format CUDA candidates over gRPC.

The folders follow a candidate through the stages and show where candidate code may run:

  cli.py        `dice-verifier`: serve, check (locally or against a server), cache
  service/      the server process: gRPC front, scheduler, worker pool, verdict store, settings
  compile/      stages 1-2 on the source text: static checks, then the cached fast build
  run/          stages 3-4 across the trust boundary: the worker process, its sandbox, the wire,
                and what both sides of the boundary compute alike
  trusted/      the side that decides: the judge process, the comparison, the verdict
  untrusted/    the candidate's process and the observers that run beside candidate code
  singleflight.py  one task per key (compile and request deduplication)

Never imports jax. service/ and compile/ never execute candidate code; only the forked children
of the worker processes (worker/process.py) do. ARCHITECTURE.md, "Trust boundary", has the picture.
"""

import importlib.metadata

try:
  __version__ = importlib.metadata.version("dice-jax")
except importlib.metadata.PackageNotFoundError:  # running from a source tree without install
  __version__ = "0.0.0+source"
