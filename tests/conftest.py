"""Project-wide pytest setup: GPU tests skip with a visible reason where no CUDA device exists, and
tests that read DICE's data or SDAR's files skip, saying what is missing and how to get it, where
../shared is not beside the checkout (a fresh clone)."""

from __future__ import annotations

import functools
import os
import pathlib

# Sharding tests need several devices; on CPU, XLA fakes them. Must be set before JAX initialises.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
# What tests read from ../shared: DICE's RL data files and SDAR-4B-Chat's config and tokenizer files
# (no weights). README.md, "Getting real data", says where each comes from.
SHARED_FILES = (
    "data/dice/kernel_infilling_evaluation.json", "data/dice/end_to_end_kernel_generation_4000.json",
    "models/sdar-4b-chat/config.json", "models/sdar-4b-chat/model.safetensors.index.json",
    "models/sdar-4b-chat/tokenizer_config.json", "models/sdar-4b-chat/vocab.json",
    "models/sdar-4b-chat/merges.txt", "models/sdar-4b-chat/added_tokens.json")
SHARED_MISSING = "needs ../shared"  # how every skip for want of ../shared starts (.ci/run selects by it)
# .ci/run's first pass names a file here; the ids of tests skipped for want of ../shared are written to
# it, and its second pass runs exactly those where ../shared exists.
SKIPS_FILE_ENV = "DICE_SHARED_SKIPS_FILE"


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


def shared_missing(root: pathlib.Path = SHARED) -> list[str]:
  """The files of SHARED_FILES that are not under `root`."""
  return [name for name in SHARED_FILES if not (root / name).is_file()]


def skip_reason(root: pathlib.Path, missing: list[str]) -> str:
  """Why a test that reads ../shared cannot run, and how to get what it needs (one line: -ra prints it
  for every such test)."""
  what = f"{root} is missing" if not root.is_dir() else f"{root} lacks {', '.join(missing)}"
  return (f"{SHARED_MISSING}: {what} (DICE's RL data files in data/dice/, SDAR-4B-Chat's config and tokenizer "
          "files, no weights, in models/sdar-4b-chat/ from https://huggingface.co/JetLM/SDAR-4B-Chat; README.md, "
          "'Getting real data')")


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
  """../shared beside the checkout: DICE data, SDAR config and tokenizer files. Skips (never fails)
  where any of them is missing, as on a fresh clone."""
  missing = shared_missing()
  if missing:
    pytest.skip(skip_reason(SHARED, missing))
  return SHARED


def pytest_runtest_logreport(report):
  path = os.environ.get(SKIPS_FILE_ENV)
  if not path or not report.skipped:
    return
  reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
  if SHARED_MISSING in reason:
    with open(path, "a", encoding="utf-8") as f:
      f.write(report.nodeid + "\n")
