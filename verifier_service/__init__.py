"""verifier_service: compiles, checks and times KernelBench-format CUDA candidates over gRPC."""
