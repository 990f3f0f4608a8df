"""Session fixtures: the shared loopback verifier and tiny model (see eval_testlib)."""

import pytest

import eval_testlib


@pytest.fixture(scope="session")
def verifier_target(request, tmp_path_factory):
  return eval_testlib.verifier_target(request, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
  return eval_testlib.tiny_model_dir(tmp_path_factory)
