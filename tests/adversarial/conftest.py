"""Session fixtures shared with tests/verifier: the toolchain and ONE compile cache, so the C++
family both suites use is compiled once per session."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "verifier"))

from verifier_service.compile import toolchain as toolchain_lib  # noqa: E402


@pytest.fixture(scope="session")
def toolchain() -> toolchain_lib.Toolchain:
  return toolchain_lib.discover()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
  path = tmp_path_factory.getbasetemp() / "verifier-cache"
  path.mkdir(exist_ok=True)
  return path
