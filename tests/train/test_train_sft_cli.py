"""`dice sft` end to end in subprocesses: the tiny config, errors and exit codes, kill and resume."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from train_tb_events import read_scalars

from dice_jax.cli import sft
from dice_jax.metrics_log import read_jsonl

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "sft_tiny.yaml")
# Runs `dice sft` through the subcommand's own add_parser/run (what dice_jax.cli.main dispatches to).
RUNNER = ("import argparse, sys\n"
          "from dice_jax.cli import sft\n"
          "p = argparse.ArgumentParser(prog='dice'); sft.add_parser(p.add_subparsers())\n"
          "sys.exit(sft.run(p.parse_args(['sft', *sys.argv[1:]])))\n")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Subprocess environment: 2 fake devices, and a compilation cache shared by the runs."""
  cache = tmp_path_factory.mktemp("jax_cache")
  return {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
          "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


@pytest.fixture(scope="module")
def short_data(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "short.jsonl"
  records = [{"prompt": f"square {i}", "response": f"y = {i} * {i};"} for i in range(12)]
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def _start(env, *args):
  return subprocess.Popen([sys.executable, "-c", RUNNER, "--config", TINY, *args,
                           "--log-level", "WARNING"], env=env, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(env, *args, timeout=240):
  proc = _start(env, *args)
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


def _cli(*argv) -> int:
  parser = argparse.ArgumentParser(prog="dice")
  sft.add_parser(parser.add_subparsers())
  return sft.run(parser.parse_args(["sft", *argv]))


def test_tiny_config_end_to_end(tmp_path, env):
  run_dir = tmp_path / "run"
  code, out = _run(env, f"run_dir={run_dir}", "train.steps=3", "data.batch_size=2",
                   "checkpoint.every_steps=2", "logging.every_steps=1")
  assert code == 0, out
  assert f"done at step 3 in {run_dir}" in out
  assert sorted(os.listdir(run_dir / "checkpoints")) == ["2", "3"]
  losses = read_scalars(run_dir / "tensorboard")["loss"]
  assert [s for s, _ in losses] == [1, 2, 3] and all(np.isfinite([v for _, v in losses]))
  records = read_jsonl(str(run_dir / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2, 3]
  assert [r["loss"] for r in records] == pytest.approx([v for _, v in losses])
  assert {"grad_norm", "lr", "masked_nll", "masked_tokens"} <= set(records[0])
  # The final model in Hugging Face layout, with the tokenizer, loads back.
  from dice_jax.model.hf_io import load_pretrained
  from dice_jax.model.tokenizer import load_tokenizer
  model = load_pretrained(run_dir / "hf")
  assert model.config.architecture == "sdar" and model.config.num_layers == 2
  assert load_tokenizer(run_dir / "hf").mask_id == model.config.mask_token_id == 259
  assert "train:\n  steps: 3" in (run_dir / "config.yaml").read_text()
  # The same command again finds the run complete: nothing to train, exit 0.
  code, out = _run(env, f"run_dir={run_dir}", "train.steps=3", "data.batch_size=2")
  assert code == 0 and "done at step 3" in out, out
  assert [r["step"] for r in read_jsonl(str(run_dir / "metrics.jsonl"))] == [1, 2, 3]


def _wait_for(proc, predicate, timeout=180.0):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    if proc.poll() is not None:
      raise AssertionError(f"exited early with {proc.returncode}: {proc.stdout.read()}")
    time.sleep(0.05)
  proc.kill()
  raise AssertionError("timed out")


def _logged_steps(run_dir):
  path = run_dir / "metrics.jsonl"
  return [r["step"] for r in read_jsonl(str(path))] if path.exists() else []


def _committed(run_dir):
  ckpt = run_dir / "checkpoints"
  return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def _kill(proc):
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  proc.stdout.close()


def _resume_args(short_data):
  return ["train.steps=2000", f"data.train_files=[{short_data}]", "data.max_length=64",
          "data.batch_size=4", "checkpoint.every_steps=3", "checkpoint.keep=2",
          "logging.every_steps=1", "train.export_hf=false", "optimizer.warmup_steps=2"]


def test_kill_and_resume_gives_identical_losses(tmp_path, env, short_data):
  """SIGKILL mid-run, restart the same command: the resumed losses equal an uninterrupted run's.

  Equality is exact (bitwise): the resumed process restores the same float32 params, AdamW
  moments, RNG key and data position, and runs the same compiled program on the same devices,
  and XLA:CPU is deterministic for a fixed program. Any difference would be a resume bug.
  """
  args = _resume_args(short_data)
  resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
  # 1. Run until a checkpoint past step 3 is committed, then SIGKILL (possibly mid-save).
  proc = _start(env, f"run_dir={resumed}", *args)
  _wait_for(proc, lambda: any(s >= 3 for s in _committed(resumed)))
  _kill(proc)
  restart = max(_committed(resumed))
  # 2. The same command resumes from that checkpoint; SIGKILL it a few steps later.
  proc = _start(env, f"run_dir={resumed}", *args)
  _wait_for(proc, lambda: max(_logged_steps(resumed), default=0) >= restart + 4)
  _kill(proc)
  # 3. An uninterrupted run of the same config.
  proc = _start(env, f"run_dir={fresh}", *args)
  _wait_for(proc, lambda: max(_logged_steps(fresh), default=0) >= restart + 4)
  _kill(proc)
  got = {r["step"]: r["loss"] for r in read_jsonl(str(resumed / "metrics.jsonl"))}
  want = {r["step"]: r["loss"] for r in read_jsonl(str(fresh / "metrics.jsonl"))}
  steps = list(range(1, restart + 5))
  assert [got[s] for s in steps] == [want[s] for s in steps]
  assert len(set(got[s] for s in steps)) > 1  # losses change from step to step


def test_sigterm_saves_and_exits_75(tmp_path, env, short_data):
  run_dir = tmp_path / "run"
  # Same config as the kill test: its programs are in the compilation cache already.
  proc = _start(env, f"run_dir={run_dir}", *_resume_args(short_data))
  _wait_for(proc, lambda: len(_logged_steps(run_dir)) >= 2)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 75, out
  assert "run the same command to resume" in out
  step = _committed(run_dir)[-1]  # the step it stopped at, saved off the 3-step interval too
  assert step >= 2 and f"stopped at step {step}" in out
  assert max(_logged_steps(run_dir)) == step


def test_divergence_exits_5_without_saving_the_bad_state(tmp_path, env, short_data):
  run_dir = tmp_path / "run"
  code, out = _run(env, f"run_dir={run_dir}", *_resume_args(short_data), "optimizer.lr=1e30")
  assert code == 5, out  # Exit.DIVERGED (dice_jax.cli.exit_codes)
  found = re.search(r"training diverged: loss is (nan|inf) at step (\d+)", out)
  assert found, out
  assert all(s < int(found.group(2)) for s in _committed(run_dir))  # no checkpoint of a NaN state


def test_help_explains_every_flag(capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli("--help")
  assert exit_info.value.code == 0
  text = capsys.readouterr().out
  for flag in ("--config", "KEY=VALUE", "--print-config", "--log-level", "exit codes"):
    assert flag in text


@pytest.mark.parametrize("overrides, message", [
    (["optimizer.lr=-1e-5"], "optimizer.lr: must be > 0"),
    (["data.train_files=[/no/such/file.jsonl]"], "file not found: '/no/such/file.jsonl'"),
    (["model.path=/no/such/dir"], "model.path: directory not found"),
    (["train.stepz=3"], "did you mean 'train.steps'"),
    (["mesh.fsdp=0"], "mesh.fsdp: must be > 0 or -1"),
])
def test_bad_config_exits_2_with_clear_message(overrides, message, capsys):
  assert _cli("--config", TINY, *overrides) == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


def test_bad_inputs_found_at_start_exit_2(tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "x"}\n')
  assert _cli("--config", TINY, f"run_dir={tmp_path / 'a'}", f"data.train_files=[{bad}]") == 2
  assert "bad.jsonl:1: needs string fields 'prompt' and 'response'" in capsys.readouterr().err
  wrong = tmp_path / "model"
  wrong.mkdir()
  (wrong / "config.json").write_text('{"model_type": "gpt2"}')
  assert _cli("--config", TINY, f"run_dir={tmp_path / 'b'}", f"model.path={wrong}", "model.init=null",
              "model.tokenizer=builtin:bytes") == 2
  assert "model_type='gpt2'" in capsys.readouterr().err
  assert _cli("--config", str(tmp_path / "missing.yaml")) == 2
  assert "config file not found" in capsys.readouterr().err


def test_print_config_resolves_overrides(capsys):
  assert _cli("--config", TINY, "--print-config", "optimizer.lr=1e-6") == 0
  out = capsys.readouterr().out
  assert "lr: 1.0e-06" in out and "model_type: sdar" in out


def test_trainer_never_imports_torch(tmp_path):
  code = ("import sys\n"
          "import dice_jax.cli.sft, dice_jax.train.sft_loop\n"
          "from dice_jax.metrics_log import MetricsLogger\n"
          f"MetricsLogger({str(tmp_path)!r}, total_steps=1).close()\n"
          "assert 'torch' not in sys.modules, 'torch was imported'\n")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
