"""Project-wide pytest setup: GPU tests skip with a visible reason where no CUDA device exists."""

from __future__ import annotations

import functools
import os
import pathlib

# Sharding tests need several devices; on CPU, XLA fakes them. Must be set before JAX initialises.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@functools.cache
def _cuda_available() -> tuple[bool, str]:
  try:
    import torch  # only the verifier side and its GPU tests need torch
  except ImportError:
    return False, "torch is not installed"
  if not torch.cuda.is_available():
    return False, "no CUDA device on this machine (GPU tests run on the device machine)"
  return True, ""


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if "gpu" in item.keywords:
      ok, why = _cuda_available()
      if not ok:
        item.add_marker(pytest.mark.skip(reason=f"gpu: {why}"))


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
  """../shared beside the checkout: DICE data, SDAR config and tokenizer files."""
  if not SHARED.is_dir():
    pytest.fail(f"{SHARED} is missing: CI and development expect ../shared beside the checkout")
  return SHARED
