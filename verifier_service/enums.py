"""The proto's enum value names, as the constants the verifier's internals use.

Jobs, options and results cross the worker's process boundaries as plain dicts (JSON over pipes
and sockets) that the scheduler merges into a `Verdict` with `json_format.ParseDict`; inside them
outcomes, stages, exploit kinds, precisions and policies are the proto's enum value *names*
("INFRA_ERROR", "STAGE_LOAD", "HANG"). Code writes them as `enums.INFRA_ERROR`, never as string
literals, so a misspelt name fails where it is read (and in tests/verifier/test_verifier_layout.py,
which resolves every `enums.X` read in the package) instead of becoming INFRA_ERROR at run time.

Decision: plain `str` constants, not Python enums or proto ints: the dicts on the wire stay
byte for byte what they were, and a name compares equal to what the other process sent.
Each group is checked against the proto at import: a value added to or renamed in the proto
without a change here fails every import of the verifier.
"""

from __future__ import annotations

from dice.verifier.v1 import verifier_pb2 as pb

# Outcome
OK = "OK"
COMPILE_ERROR = "COMPILE_ERROR"
INCORRECT = "INCORRECT"
RUNTIME_ERROR = "RUNTIME_ERROR"
TIMEOUT = "TIMEOUT"
REJECTED = "REJECTED"
INFRA_ERROR = "INFRA_ERROR"
NO_GPU = "NO_GPU"
BAD_REFERENCE = "BAD_REFERENCE"

# Stage
STAGE_QUEUE = "STAGE_QUEUE"
STAGE_PARSE = "STAGE_PARSE"
STAGE_STATIC_CHECK = "STAGE_STATIC_CHECK"
STAGE_COMPILE = "STAGE_COMPILE"
STAGE_LOAD = "STAGE_LOAD"
STAGE_CORRECTNESS = "STAGE_CORRECTNESS"
STAGE_TIMING = "STAGE_TIMING"
STAGE_DONE = "STAGE_DONE"

# Exploit
TORCH_FALLBACK = "TORCH_FALLBACK"
NO_CUSTOM_KERNEL_LAUNCHED = "NO_CUSTOM_KERNEL_LAUNCHED"
TRY_EXCEPT_FALLBACK = "TRY_EXCEPT_FALLBACK"
INHERITS_REFERENCE = "INHERITS_REFERENCE"
OUTPUT_REUSE = "OUTPUT_REUSE"
INPUT_MUTATION = "INPUT_MUTATION"
OUTPUT_CACHING = "OUTPUT_CACHING"
SIDE_STREAM = "SIDE_STREAM"
MONKEY_PATCH = "MONKEY_PATCH"
TENSOR_SUBCLASS = "TENSOR_SUBCLASS"
FILE_ACCESS = "FILE_ACCESS"
NETWORK_ACCESS = "NETWORK_ACCESS"
PROCESS_SPAWN = "PROCESS_SPAWN"
RESOURCE_EXHAUSTION = "RESOURCE_EXHAUSTION"
IMPLAUSIBLE_SPEEDUP = "IMPLAUSIBLE_SPEEDUP"
HANG = "HANG"
CRASH = "CRASH"
SANDBOX_VIOLATION = "SANDBOX_VIOLATION"
DISPATCH_OVERRIDE = "DISPATCH_OVERRIDE"
FOREIGN_KERNEL = "FOREIGN_KERNEL"

# Precision
FP32 = "FP32"
FP16 = "FP16"
BF16 = "BF16"

# Policy
POLICY_DEFAULT = "POLICY_DEFAULT"
POLICY_STRICT = "POLICY_STRICT"

OUTCOMES = frozenset({OK, COMPILE_ERROR, INCORRECT, RUNTIME_ERROR, TIMEOUT, REJECTED, INFRA_ERROR,
                      NO_GPU, BAD_REFERENCE})
STAGES = frozenset({STAGE_QUEUE, STAGE_PARSE, STAGE_STATIC_CHECK, STAGE_COMPILE, STAGE_LOAD,
                    STAGE_CORRECTNESS, STAGE_TIMING, STAGE_DONE})
EXPLOITS = frozenset({TORCH_FALLBACK, NO_CUSTOM_KERNEL_LAUNCHED, TRY_EXCEPT_FALLBACK,
                      INHERITS_REFERENCE, OUTPUT_REUSE, INPUT_MUTATION, OUTPUT_CACHING, SIDE_STREAM,
                      MONKEY_PATCH, TENSOR_SUBCLASS, FILE_ACCESS, NETWORK_ACCESS, PROCESS_SPAWN,
                      RESOURCE_EXHAUSTION, IMPLAUSIBLE_SPEEDUP, HANG, CRASH, SANDBOX_VIOLATION,
                      DISPATCH_OVERRIDE, FOREIGN_KERNEL})
PRECISIONS = frozenset({FP32, FP16, BF16})
POLICIES = frozenset({POLICY_DEFAULT, POLICY_STRICT})


def _check(group: frozenset[str], enum, unspecified: str) -> None:
  """Every group is exactly its proto enum's names but the UNSPECIFIED one, and each constant's
  value is its own name (so `enums.X == "X"`)."""
  want = set(enum.keys()) - {unspecified}
  if group != want:
    raise ImportError(f"verifier_service.enums is out of step with the proto's "
                      f"{enum.DESCRIPTOR.name}: missing {sorted(want - group)}, "
                      f"unknown {sorted(group - want)}")
  for name in group:
    if globals().get(name) != name:
      raise ImportError(f"verifier_service.enums.{name} is not {name!r}")


for _group, _enum, _unspecified in ((OUTCOMES, pb.Outcome, "OUTCOME_UNSPECIFIED"),
                                    (STAGES, pb.Stage, "STAGE_UNSPECIFIED"),
                                    (EXPLOITS, pb.Exploit, "EXPLOIT_UNSPECIFIED"),
                                    (PRECISIONS, pb.Precision, "PRECISION_UNSPECIFIED"),
                                    (POLICIES, pb.Policy, "POLICY_UNSPECIFIED")):
  _check(_group, _enum, _unspecified)
