"""What a request asks the verifier for (`VerifyOptions`), from the names users write.

Every command builds its options here: `dice train` and `dice rewards check` from the config's
`verifier` section, `dice eval` and `dice generate` from their flags, `KernelGenerator` from its
arguments. So a precision is spelled `fp32`/`fp16`/`bf16` everywhere and maps to the proto enum in
one place. A zero (trials, tolerances) or an unset policy leaves the server's default.
"""

from __future__ import annotations

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.verifier.defaults import POLICY_NAMES, PRECISION_NAMES

PRECISIONS: dict[str, pb.Precision] = {name: pb.Precision.Value(name.upper()) for name in PRECISION_NAMES}
POLICIES: dict[str, pb.Policy] = {name: pb.Policy.Value(f"POLICY_{name.upper()}") for name in POLICY_NAMES}


def precision_enum(name: str) -> pb.Precision:
  """`fp32` -> pb.FP32; ValueError naming the choices for anything else."""
  if name not in PRECISIONS:
    raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {name!r}")
  return PRECISIONS[name]


def verify_options(*, precision: str = "fp32", trials: int = 0, atol: float = 0.0, rtol: float = 0.0,
                   skip_timing: bool = False, policy: str | None = None,
                   timing_trials: int = 0) -> pb.VerifyOptions:
  """The request options. `trials`: correctness trials; `timing_trials`: timed trials per side (each a
  cold and a warm call); `policy`: partial replacement, `default` or `strict` (None: the server's)."""
  if policy is not None and policy not in POLICIES:
    raise ValueError(f"policy must be one of {sorted(POLICIES)} (or unset), got {policy!r}")
  if trials < 0 or timing_trials < 0:
    raise ValueError(f"trials must be >= 0 (0: the server's default), got {trials} and {timing_trials}")
  return pb.VerifyOptions(precision=precision_enum(precision), num_correctness_trials=trials, atol=atol,
                          rtol=rtol, skip_timing=skip_timing, num_timing_trials=timing_trials,
                          policy=POLICIES[policy] if policy else pb.POLICY_UNSPECIFIED)
