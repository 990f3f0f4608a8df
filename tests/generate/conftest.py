"""Session fixtures shared with tests/eval: one loopback verifier and one tiny model per session."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "eval"))

import eval_testlib  # noqa: E402


@pytest.fixture(scope="session")
def verifier_target(request, tmp_path_factory):
  return eval_testlib.verifier_target(request, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
  return eval_testlib.tiny_model_dir(tmp_path_factory)
