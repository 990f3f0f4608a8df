"""A fresh clone has no ../shared: tests that read DICE's data or SDAR's files skip there, saying
what is missing and how to get it, and .ci/run's first pass records which ones did.

Each case runs pytest for real, in a subprocess, on a scratch checkout holding this repository's
tests/conftest.py and one test that asks for `shared_dir`, with ../shared absent, partial or whole.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

# This directory's conftest.py, by path: `import conftest` names whichever of the suite's conftest
# modules pytest imported last (tests/adversarial and tests/verifier have their own).
_spec = importlib.util.spec_from_file_location("dice_tests_conftest", pathlib.Path(__file__).with_name("conftest.py"))
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)

_TEST = """\
def test_reads_shared(shared_dir):
  assert (shared_dir / "data/dice/kernel_infilling_evaluation.json").read_text() == "[]"
"""


def _checkout(root: pathlib.Path) -> pathlib.Path:
  repo = root / "dice-jax"
  (repo / "tests").mkdir(parents=True)
  shutil.copy(conftest.__file__, repo / "tests" / "conftest.py")
  (repo / "tests" / "test_reads_shared.py").write_text(_TEST)
  return repo


def _shared(root: pathlib.Path, files=conftest.SHARED_FILES) -> None:
  for name in files:
    path = root / "shared" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("[]")


def _pytest(repo: pathlib.Path, skips: pathlib.Path | None = None) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != conftest.SKIPS_FILE_ENV}
  if skips is not None:
    env[conftest.SKIPS_FILE_ENV] = str(skips)
  return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"], cwd=repo,
                        env=env, capture_output=True, text=True, timeout=120, check=False)


def test_without_shared_the_test_skips_saying_what_is_missing_and_is_recorded(tmp_path):
  repo = _checkout(tmp_path)
  skips = tmp_path / "skips.txt"
  done = _pytest(repo, skips)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "1 skipped" in done.stdout and "error" not in done.stdout.lower()
  assert f"{conftest.SHARED_MISSING}: {tmp_path / 'shared'} is missing (DICE's RL data files" in done.stdout
  assert "huggingface.co/JetLM/SDAR-4B-Chat" in done.stdout and "Getting real data" in done.stdout
  assert skips.read_text().splitlines() == ["tests/test_reads_shared.py::test_reads_shared"]


def test_a_partial_shared_names_the_missing_files(tmp_path):
  repo = _checkout(tmp_path)
  _shared(tmp_path, conftest.SHARED_FILES[:2])  # DICE's data only
  done = _pytest(repo)
  assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout + done.stderr
  assert "lacks models/sdar-4b-chat/config.json" in done.stdout


@pytest.mark.parametrize("record", [False, True])
def test_with_shared_the_test_runs_and_nothing_is_recorded(tmp_path, record):
  repo = _checkout(tmp_path)
  _shared(tmp_path)
  skips = tmp_path / "skips.txt" if record else None
  done = _pytest(repo, skips)
  assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
  assert skips is None or not skips.exists()
