from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OK: _ClassVar[Outcome]
    COMPILE_ERROR: _ClassVar[Outcome]
    INCORRECT: _ClassVar[Outcome]
    RUNTIME_ERROR: _ClassVar[Outcome]
    TIMEOUT: _ClassVar[Outcome]
    REJECTED: _ClassVar[Outcome]
    INFRA_ERROR: _ClassVar[Outcome]
    NO_GPU: _ClassVar[Outcome]
    BAD_REFERENCE: _ClassVar[Outcome]

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_QUEUE: _ClassVar[Stage]
    STAGE_PARSE: _ClassVar[Stage]
    STAGE_STATIC_CHECK: _ClassVar[Stage]
    STAGE_COMPILE: _ClassVar[Stage]
    STAGE_LOAD: _ClassVar[Stage]
    STAGE_CORRECTNESS: _ClassVar[Stage]
    STAGE_TIMING: _ClassVar[Stage]
    STAGE_DONE: _ClassVar[Stage]

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_UNSPECIFIED: _ClassVar[Precision]
    FP32: _ClassVar[Precision]
    FP16: _ClassVar[Precision]
    BF16: _ClassVar[Precision]

class Exploit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPLOIT_UNSPECIFIED: _ClassVar[Exploit]
    TORCH_FALLBACK: _ClassVar[Exploit]
    NO_CUSTOM_KERNEL_LAUNCHED: _ClassVar[Exploit]
    TRY_EXCEPT_FALLBACK: _ClassVar[Exploit]
    INHERITS_REFERENCE: _ClassVar[Exploit]
    OUTPUT_REUSE: _ClassVar[Exploit]
    INPUT_MUTATION: _ClassVar[Exploit]
    OUTPUT_CACHING: _ClassVar[Exploit]
    SIDE_STREAM: _ClassVar[Exploit]
    MONKEY_PATCH: _ClassVar[Exploit]
    TENSOR_SUBCLASS: _ClassVar[Exploit]
    FILE_ACCESS: _ClassVar[Exploit]
    NETWORK_ACCESS: _ClassVar[Exploit]
    PROCESS_SPAWN: _ClassVar[Exploit]
    RESOURCE_EXHAUSTION: _ClassVar[Exploit]
    IMPLAUSIBLE_SPEEDUP: _ClassVar[Exploit]
    HANG: _ClassVar[Exploit]
    CRASH: _ClassVar[Exploit]
    SANDBOX_VIOLATION: _ClassVar[Exploit]
    DISPATCH_OVERRIDE: _ClassVar[Exploit]
    FOREIGN_KERNEL: _ClassVar[Exploit]

class Policy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_UNSPECIFIED: _ClassVar[Policy]
    POLICY_DEFAULT: _ClassVar[Policy]
    POLICY_STRICT: _ClassVar[Policy]
OUTCOME_UNSPECIFIED: Outcome
OK: Outcome
COMPILE_ERROR: Outcome
INCORRECT: Outcome
RUNTIME_ERROR: Outcome
TIMEOUT: Outcome
REJECTED: Outcome
INFRA_ERROR: Outcome
NO_GPU: Outcome
BAD_REFERENCE: Outcome
STAGE_UNSPECIFIED: Stage
STAGE_QUEUE: Stage
STAGE_PARSE: Stage
STAGE_STATIC_CHECK: Stage
STAGE_COMPILE: Stage
STAGE_LOAD: Stage
STAGE_CORRECTNESS: Stage
STAGE_TIMING: Stage
STAGE_DONE: Stage
PRECISION_UNSPECIFIED: Precision
FP32: Precision
FP16: Precision
BF16: Precision
EXPLOIT_UNSPECIFIED: Exploit
TORCH_FALLBACK: Exploit
NO_CUSTOM_KERNEL_LAUNCHED: Exploit
TRY_EXCEPT_FALLBACK: Exploit
INHERITS_REFERENCE: Exploit
OUTPUT_REUSE: Exploit
INPUT_MUTATION: Exploit
OUTPUT_CACHING: Exploit
SIDE_STREAM: Exploit
MONKEY_PATCH: Exploit
TENSOR_SUBCLASS: Exploit
FILE_ACCESS: Exploit
NETWORK_ACCESS: Exploit
PROCESS_SPAWN: Exploit
RESOURCE_EXHAUSTION: Exploit
IMPLAUSIBLE_SPEEDUP: Exploit
HANG: Exploit
CRASH: Exploit
SANDBOX_VIOLATION: Exploit
DISPATCH_OVERRIDE: Exploit
FOREIGN_KERNEL: Exploit
POLICY_UNSPECIFIED: Policy
POLICY_DEFAULT: Policy
POLICY_STRICT: Policy

class VerifyRequest(_message.Message):
    __slots__ = ("request_id", "reference_source", "candidate_source", "options")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reference_source: str
    candidate_source: str
    options: VerifyOptions
    def __init__(self, request_id: _Optional[str] = ..., reference_source: _Optional[str] = ..., candidate_source: _Optional[str] = ..., options: _Optional[_Union[VerifyOptions, _Mapping]] = ...) -> None: ...

class VerifyOptions(_message.Message):
    __slots__ = ("precision", "num_correctness_trials", "atol", "rtol", "skip_timing", "num_timing_trials", "compile_timeout_s", "run_timeout_s", "seed", "policy", "min_custom_kernel_fraction")
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    NUM_CORRECTNESS_TRIALS_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    RTOL_FIELD_NUMBER: _ClassVar[int]
    SKIP_TIMING_FIELD_NUMBER: _ClassVar[int]
    NUM_TIMING_TRIALS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MIN_CUSTOM_KERNEL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    precision: Precision
    num_correctness_trials: int
    atol: float
    rtol: float
    skip_timing: bool
    num_timing_trials: int
    compile_timeout_s: float
    run_timeout_s: float
    seed: int
    policy: Policy
    min_custom_kernel_fraction: float
    def __init__(self, precision: _Optional[_Union[Precision, str]] = ..., num_correctness_trials: _Optional[int] = ..., atol: _Optional[float] = ..., rtol: _Optional[float] = ..., skip_timing: _Optional[bool] = ..., num_timing_trials: _Optional[int] = ..., compile_timeout_s: _Optional[float] = ..., run_timeout_s: _Optional[float] = ..., seed: _Optional[int] = ..., policy: _Optional[_Union[Policy, str]] = ..., min_custom_kernel_fraction: _Optional[float] = ...) -> None: ...

class CompileResult(_message.Message):
    __slots__ = ("compiled", "log", "log_truncated", "cache_hit", "kernel_names", "exported_functions", "cache_key")
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    LOG_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    KERNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    EXPORTED_FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    compiled: bool
    log: str
    log_truncated: bool
    cache_hit: bool
    kernel_names: _containers.RepeatedScalarFieldContainer[str]
    exported_functions: _containers.RepeatedScalarFieldContainer[str]
    cache_key: str
    def __init__(self, compiled: _Optional[bool] = ..., log: _Optional[str] = ..., log_truncated: _Optional[bool] = ..., cache_hit: _Optional[bool] = ..., kernel_names: _Optional[_Iterable[str]] = ..., exported_functions: _Optional[_Iterable[str]] = ..., cache_key: _Optional[str] = ...) -> None: ...

class TrialResult(_message.Message):
    __slots__ = ("seed", "passed", "max_abs_error", "max_rel_error", "message")
    SEED_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_REL_ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    seed: int
    passed: bool
    max_abs_error: float
    max_rel_error: float
    message: str
    def __init__(self, seed: _Optional[int] = ..., passed: _Optional[bool] = ..., max_abs_error: _Optional[float] = ..., max_rel_error: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class RuntimeStats(_message.Message):
    __slots__ = ("median_us", "mean_us", "min_us", "max_us", "p10_us", "p90_us", "stddev_us", "num_trials")
    MEDIAN_US_FIELD_NUMBER: _ClassVar[int]
    MEAN_US_FIELD_NUMBER: _ClassVar[int]
    MIN_US_FIELD_NUMBER: _ClassVar[int]
    MAX_US_FIELD_NUMBER: _ClassVar[int]
    P10_US_FIELD_NUMBER: _ClassVar[int]
    P90_US_FIELD_NUMBER: _ClassVar[int]
    STDDEV_US_FIELD_NUMBER: _ClassVar[int]
    NUM_TRIALS_FIELD_NUMBER: _ClassVar[int]
    median_us: float
    mean_us: float
    min_us: float
    max_us: float
    p10_us: float
    p90_us: float
    stddev_us: float
    num_trials: int
    def __init__(self, median_us: _Optional[float] = ..., mean_us: _Optional[float] = ..., min_us: _Optional[float] = ..., max_us: _Optional[float] = ..., p10_us: _Optional[float] = ..., p90_us: _Optional[float] = ..., stddev_us: _Optional[float] = ..., num_trials: _Optional[int] = ...) -> None: ...

class TimingResult(_message.Message):
    __slots__ = ("reference", "candidate", "speedup", "reference_warm", "candidate_warm", "speedup_warm")
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_WARM_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_WARM_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_WARM_FIELD_NUMBER: _ClassVar[int]
    reference: RuntimeStats
    candidate: RuntimeStats
    speedup: float
    reference_warm: RuntimeStats
    candidate_warm: RuntimeStats
    speedup_warm: float
    def __init__(self, reference: _Optional[_Union[RuntimeStats, _Mapping]] = ..., candidate: _Optional[_Union[RuntimeStats, _Mapping]] = ..., speedup: _Optional[float] = ..., reference_warm: _Optional[_Union[RuntimeStats, _Mapping]] = ..., candidate_warm: _Optional[_Union[RuntimeStats, _Mapping]] = ..., speedup_warm: _Optional[float] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "duration_s")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    duration_s: float
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., duration_s: _Optional[float] = ...) -> None: ...

class ExploitFinding(_message.Message):
    __slots__ = ("kind", "evidence")
    KIND_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    kind: Exploit
    evidence: str
    def __init__(self, kind: _Optional[_Union[Exploit, str]] = ..., evidence: _Optional[str] = ...) -> None: ...

class Environment(_message.Message):
    __slots__ = ("gpu_name", "driver_version", "cuda_runtime_version", "nvcc_version", "torch_version", "gpu_arch", "python_version", "server_version", "hostname", "timing_lock")
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    NVCC_VERSION_FIELD_NUMBER: _ClassVar[int]
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPU_ARCH_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    TIMING_LOCK_FIELD_NUMBER: _ClassVar[int]
    gpu_name: str
    driver_version: str
    cuda_runtime_version: str
    nvcc_version: str
    torch_version: str
    gpu_arch: str
    python_version: str
    server_version: str
    hostname: str
    timing_lock: str
    def __init__(self, gpu_name: _Optional[str] = ..., driver_version: _Optional[str] = ..., cuda_runtime_version: _Optional[str] = ..., nvcc_version: _Optional[str] = ..., torch_version: _Optional[str] = ..., gpu_arch: _Optional[str] = ..., python_version: _Optional[str] = ..., server_version: _Optional[str] = ..., hostname: _Optional[str] = ..., timing_lock: _Optional[str] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("request_id", "outcome", "stage", "message", "compile", "trials", "timing", "stage_timings", "environment", "exploits", "launched_kernels", "attempts", "total_s", "custom_kernel_time_fraction", "forward_ops", "policy")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    STAGE_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    EXPLOITS_FIELD_NUMBER: _ClassVar[int]
    LAUNCHED_KERNELS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_KERNEL_TIME_FRACTION_FIELD_NUMBER: _ClassVar[int]
    FORWARD_OPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    outcome: Outcome
    stage: Stage
    message: str
    compile: CompileResult
    trials: _containers.RepeatedCompositeFieldContainer[TrialResult]
    timing: TimingResult
    stage_timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    environment: Environment
    exploits: _containers.RepeatedCompositeFieldContainer[ExploitFinding]
    launched_kernels: _containers.RepeatedScalarFieldContainer[str]
    attempts: int
    total_s: float
    custom_kernel_time_fraction: float
    forward_ops: _containers.RepeatedScalarFieldContainer[str]
    policy: Policy
    def __init__(self, request_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., stage: _Optional[_Union[Stage, str]] = ..., message: _Optional[str] = ..., compile: _Optional[_Union[CompileResult, _Mapping]] = ..., trials: _Optional[_Iterable[_Union[TrialResult, _Mapping]]] = ..., timing: _Optional[_Union[TimingResult, _Mapping]] = ..., stage_timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., environment: _Optional[_Union[Environment, _Mapping]] = ..., exploits: _Optional[_Iterable[_Union[ExploitFinding, _Mapping]]] = ..., launched_kernels: _Optional[_Iterable[str]] = ..., attempts: _Optional[int] = ..., total_s: _Optional[float] = ..., custom_kernel_time_fraction: _Optional[float] = ..., forward_ops: _Optional[_Iterable[str]] = ..., policy: _Optional[_Union[Policy, str]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "name", "memory_total_bytes", "arch", "slots")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    memory_total_bytes: int
    arch: str
    slots: int
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., arch: _Optional[str] = ..., slots: _Optional[int] = ...) -> None: ...

class CacheStats(_message.Message):
    __slots__ = ("entries", "hits", "misses", "size_bytes")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    entries: int
    hits: int
    misses: int
    size_bytes: int
    def __init__(self, entries: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("server_version", "gpus", "environment", "queue_depth", "queue_capacity", "running", "compile_workers", "compile_cache", "verdict_cache", "max_source_bytes", "verdicts_total")
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    COMPILE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_CACHE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_CACHE_FIELD_NUMBER: _ClassVar[int]
    MAX_SOURCE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    environment: Environment
    queue_depth: int
    queue_capacity: int
    running: int
    compile_workers: int
    compile_cache: CacheStats
    verdict_cache: CacheStats
    max_source_bytes: int
    verdicts_total: int
    def __init__(self, server_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., environment: _Optional[_Union[Environment, _Mapping]] = ..., queue_depth: _Optional[int] = ..., queue_capacity: _Optional[int] = ..., running: _Optional[int] = ..., compile_workers: _Optional[int] = ..., compile_cache: _Optional[_Union[CacheStats, _Mapping]] = ..., verdict_cache: _Optional[_Union[CacheStats, _Mapping]] = ..., max_source_bytes: _Optional[int] = ..., verdicts_total: _Optional[int] = ...) -> None: ...
