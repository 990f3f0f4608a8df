"""verifier_service: compiles, checks and times KernelBench-format CUDA candidates over gRPC.

Never imports jax. The server and scheduler never execute candidate code; only the forked children
of the worker processes do (see `worker.py`).
"""

import importlib.metadata

try:
  __version__ = importlib.metadata.version("dice-jax")
except importlib.metadata.PackageNotFoundError:  # running from a source tree without install
  __version__ = "0.0.0+source"
