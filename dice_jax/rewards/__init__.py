"""Verifier client (gRPC) and reward shaping: from generations to verdicts to scalar rewards."""
