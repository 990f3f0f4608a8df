"""Session fixtures: one compile cache (and precompiled header) shared by every verifier test,
so CI compiles each tiny kernel once."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from verifier_service.compile import toolchain as toolchain_lib  # noqa: E402

import verifier_harness  # noqa: E402


@pytest.fixture(scope="session")
def toolchain() -> toolchain_lib.Toolchain:
  return toolchain_lib.discover()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
  path = tmp_path_factory.getbasetemp() / "verifier-cache"  # shared with tests/adversarial
  path.mkdir(exist_ok=True)
  return path


@pytest.fixture(scope="session")
def server(cache_dir, toolchain):
  """The default server: no GPU here, so compiled candidates end NO_GPU."""
  srv = verifier_harness.ServerThread(verifier_harness.make_config(cache_dir), toolchain)
  yield srv
  srv.stop()


@pytest.fixture(scope="session")
def cpu_server(cache_dir, toolchain):
  """CPU test mode: C++-only candidates run on CPU worker children."""
  srv = verifier_harness.ServerThread(
      verifier_harness.make_config(cache_dir, cpu_test_mode=True, slots_per_gpu=2), toolchain)
  yield srv
  srv.stop()
