"""`dice train` end to end: the tiny config against a REAL verifier (a `dice-verifier serve`
subprocess on loopback, compile-only here), a user reward composed in through the config, SIGKILL
and resume continuing identically, `dice plot`, and clear errors for bad configs and data.

Runs are subprocesses (`python -m dice_jax.cli.main train`, i.e. `dice train`) on one CPU device,
sharing a JAX compilation cache so that the resumed runs reuse the first run's compiled programs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from safetensors.numpy import load_file

from dice_jax.cli import plot as plot_cli
from dice_jax.cli import train as train_cli
from dice_jax.config import to_dict, to_yaml
from dice_jax.rl.config import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT_S = 420
# RLConfig()'s small run (not the built-in run, whose model and batches are larger), as a config file
# (_small_config), with the random model and no warm start (tests/rl/test_rl_default_learns.py runs
# the built-in run with its warm start); four steps:
# two infilling, two end to end; a checkpoint every two; short prompts and responses; two sampler
# calls of 4 rows per step.
TEST_OVERRIDES = ["warm_start.steps=0", "data.phase1_files=[bundled:tiny]", "data.phase2_files=[bundled:tiny]",
                  "train.steps=4", "checkpoint.every_steps=2", "curriculum.phase1_steps=2",
                  "rollout.gen_length=16", "rollout.batch_size=4", "data.max_prompt_length=640",
                  "rewards.custom=[rl_test_rewards:letter_fraction]"]  # the README's short form
NOT_REPRODUCIBLE = ("timing/", "wait_frac", "time")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("rl_train")
  (root / "infill.yaml").write_text('system: null\nuser: "{scaffold}"\n')
  (root / "e2e.yaml").write_text('system: null\nuser: "{reference}"\n')
  _small_config(root)
  return root


def _small_config(folder: pathlib.Path) -> pathlib.Path:
  """RLConfig()'s defaults without the warm start, as a --config file in `folder`."""
  cfg = RLConfig()
  path = folder / "small.yaml"
  path.write_text(to_yaml(dataclasses.replace(cfg, warm_start=dataclasses.replace(cfg.warm_start, steps=0))))
  return path


def _env(workdir: pathlib.Path) -> dict[str, str]:
  env = os.environ.copy()
  env.pop("XLA_FLAGS", None)  # one CPU device, as on a laptop
  env["JAX_COMPILATION_CACHE_DIR"] = str(workdir / "jax_cache")
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  return env


def _command(workdir: pathlib.Path, run_dir: pathlib.Path, *extra: str) -> list[str]:
  # -P: the working directory is not put on sys.path, as for the `dice` console script; the runs
  # start in HERE, so the user module rl_test_rewards.py is found as a user's would be (no PYTHONPATH).
  return [sys.executable, "-P", "-m", "dice_jax.cli.main", "train", "--config", str(workdir / "small.yaml"),
          f"run_dir={run_dir}", *TEST_OVERRIDES,
          f"data.infilling_template={workdir / 'infill.yaml'}", f"data.end_to_end_template={workdir / 'e2e.yaml'}",
          *extra]


def _train(workdir: pathlib.Path, run_dir: pathlib.Path) -> subprocess.CompletedProcess:
  done = subprocess.run(_command(workdir, run_dir), env=_env(workdir), capture_output=True, text=True,
                        timeout=TIMEOUT_S, cwd=HERE)
  assert done.returncode == 0, done.stderr[-4000:]
  return done


def _records(run_dir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def first_run(workdir):
  run_dir = workdir / "a"
  return run_dir, _train(workdir, run_dir)


def test_tiny_run_end_to_end_with_a_real_verifier_and_a_custom_reward(first_run):
  run_dir, done = first_run
  records = _records(run_dir)
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  # Curriculum: two infilling steps, then end to end; metrics per phase.
  assert [r["curriculum/phase2_share"] for r in records] == [0.0, 0.0, 1.0, 1.0]
  assert "phase1/format" in records[0] and "phase2/format" in records[3] and "phase1/format" not in records[3]
  # The verifier started on loopback has no GPU: the auto preset is compile-only (format + compile),
  # and the user's component is composed in with its weight, each logged on its own.
  assert "no GPU (compile-only)" in done.stderr and (run_dir / "verifier.log").is_file()
  assert "reward components: formatx0.2, compilex1, letter_fractionx1" in done.stderr
  for r in records:
    assert {"reward/format", "reward/compile", "reward/letter_fraction", "loss", "kl", "entropy", "clip_frac",
            "grad_norm", "ratio_mean", "wait_frac", "adv/zero_var_groups"} <= set(r)
    assert 0 < r["reward/letter_fraction"] < 1 and r["reward/compile"] == 0.0
    assert r["reward/total"] == pytest.approx(r["reward/letter_fraction"], abs=1e-6)  # format/compile earn 0
    assert r["grad_norm"] > 0 and r["adv/zero_var_groups"] == 0
  # The second minibatch of a step is off-policy (from step 2: step 1's first update is the warm-up's lr 0).
  assert records[1]["kl"] > 0 and records[1]["ratio_mean"] != 1.0
  # What happened, per step: outcome counts (every response of a random model has no code: FORMAT,
  # never sent) and a few sampled completions per phase with their verdicts.
  for r in records:
    assert r["outcomes/FORMAT"] == 8 and r["outcomes/UNREACHABLE"] == 0 and r["outcomes/NO_GPU"] == 0
  samples = [json.loads(line) for line in (run_dir / "samples" / "step_3.jsonl").read_text().splitlines()]
  assert len(samples) == 2 and {s["phase"] for s in samples} == {2} and samples[0]["outcome"] == "FORMAT"
  assert {"problem_id", "message", "components", "reward", "completion"} <= set(samples[0])
  assert sorted(p.name for p in (run_dir / "samples").iterdir()) == [f"step_{n}.jsonl" for n in (1, 2, 3, 4)]
  assert "responses by outcome" in done.stderr and "No response earned" not in done.stderr  # letters
  # Outputs: checkpoints, TensorBoard, the resolved config, the policy in HF layout, the summary table.
  assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]
  assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
  assert (run_dir / "config.yaml").is_file() and (run_dir / "hf" / "config.json").is_file()
  assert "means per curriculum phase" in done.stderr and "dice train: done at step 4" in done.stderr


def test_sigkill_and_resume_continue_identically(workdir, first_run):
  first_dir, _ = first_run
  run_dir = workdir / "b"
  proc = subprocess.Popen(_command(workdir, run_dir), env=_env(workdir), stdout=subprocess.DEVNULL,
                          stderr=open(workdir / "b_killed.log", "w"), cwd=HERE)
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while not (run_dir / "checkpoints" / "2").is_dir():
      assert proc.poll() is None, (workdir / "b_killed.log").read_text()[-3000:]
      assert time.monotonic() < deadline, "no checkpoint at step 2"
      time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)  # the verifier it started
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The loopback verifier must not outlive a trainer killed without any chance to clean up.
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, f"orphaned after SIGKILL of the trainer: {alive}"
  finally:
    for child in children if "children" in dir() else []:
      try:
        child.kill()
      except psutil.NoSuchProcess:
        pass
  assert not (run_dir / "checkpoints" / "4").exists(), "the run finished before it could be killed"
  done = _train(workdir, run_dir)
  assert "resumed from" in done.stderr
  first, resumed = _records(first_dir), _records(run_dir)
  assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the lost steps were redone, not duplicated
  for a, b in zip(first, resumed):
    same = {k: v for k, v in a.items() if not k.startswith(NOT_REPRODUCIBLE)}
    assert same == {k: b[k] for k in same}, f"step {a['step']} differs"
  for name, array in load_file(first_dir / "hf" / "model.safetensors").items():
    np.testing.assert_array_equal(array, load_file(run_dir / "hf" / "model.safetensors")[name], err_msg=name)


def test_dice_plot_writes_the_curves(first_run, tmp_path):
  run_dir, _ = first_run
  parser = argparse.ArgumentParser()
  plot_cli.add_parser(parser.add_subparsers())
  assert plot_cli.run(parser.parse_args(["plot", str(run_dir), "--out", str(tmp_path)])) == 0
  names = sorted(p.name for p in tmp_path.glob("*.png"))
  assert names == ["entropy.png", "kl.png", "phase_rates.png", "rewards.png", "speedup.png", "training.png"]
  assert plot_cli.run(parser.parse_args(["plot", str(tmp_path / "nothing")])) == 2


def _run_in_process(*argv: str) -> int:
  parser = argparse.ArgumentParser()
  train_cli.add_parser(parser.add_subparsers())
  return train_cli.run(parser.parse_args(["train", *argv]))


def test_bad_configs_and_data_give_clear_errors(tmp_path, capsys):
  broken = tmp_path / "broken.json"
  broken.write_text('[{"id": "x", "pytorch_code": "import torch\\n"')
  cases = [
      (["rollout.group_sze=4"], "did you mean 'rollout.group_size'"),
      (["rollout.group_size=1"], "rollout.group_size: group advantages need >= 2"),
      (["algo.logprob=one_step"], "needs old_logprobs=recompute"),
      (["data.phase1_files=[/no/such/problems.json]"], "phase1_files[0]: no such file or directory"),
      (["data.infilling_template=/no/such.yaml"], "infilling_template: file not found"),
      (["model.path=/no/such/ckpt", "model.init=null"], "directory not found"),
      (["rollout.prompts_per_step=3", "train.num_minibatches=2", "rollout.group_size=3"], "must divide the 9 rows"),
      ([f"data.phase1_files=[{broken}]", f"run_dir={tmp_path / 'r1'}"], "invalid JSON"),
      (["rewards.custom.mine.fn=no_such_module:fn", f"run_dir={tmp_path / 'r2'}"], "cannot import"),
      (["data.max_prompt_length=100", f"run_dir={tmp_path / 'r3'}"], "none of the 6 problems has a prompt"),
      (["rollout.batch_size=4", f"run_dir={tmp_path / 'r4'}"], "must be a multiple of the data x fsdp mesh size 8"),
  ]
  small = str(_small_config(tmp_path))
  for overrides, message in cases:
    assert _run_in_process("--config", small, *overrides) == 2, overrides
    assert message in capsys.readouterr().err, overrides
  assert _run_in_process("--config", str(tmp_path / "missing.yaml")) == 2
  assert "config file not found" in capsys.readouterr().err


def test_the_built_in_run_checks_rl_prompts_before_its_warm_start(tmp_path, capsys):
  """A prompt width no RL problem fits is reported once the warm start's tokenizer is fitted,
  before its SFT (minutes on a laptop) starts: nothing of the SFT run is written."""
  run_dir = tmp_path / "run"
  assert _run_in_process(f"run_dir={run_dir}", "data.max_prompt_length=100") == 2
  assert "none of the 8 problems has a prompt of at most data.max_prompt_length=100" in capsys.readouterr().err
  assert (run_dir / "warm_start" / "tokenizer" / "tokenizer.json").is_file()
  assert not (run_dir / "warm_start" / "checkpoints").exists()
  assert not (run_dir / "verifier.log").exists()  # nor is the verifier started


def test_the_verifier_starts_before_the_warm_starts_sft_and_a_stop_during_it_closes_it(tmp_path):
  """The built-in run starts its local verifier once the warm start's inputs are checked, before the
  SFT, so that the server's start-up (torch, header tiers, precompiled headers) runs beside it; a
  stop during the SFT stops that server too. (The check before it: a bad prompt width starts no
  verifier, test_the_built_in_run_checks_rl_prompts_before_its_warm_start.)"""
  from dice_jax.rl import warm_start_run  # pylint: disable=import-outside-toplevel

  cfg = train_cli.load(None, [f"run_dir={tmp_path}", "warm_start.steps=4", "warm_start.batch_size=8"])  # 8 test devices
  log = tmp_path / "verifier.log"
  asked = []

  def stop() -> bool:  # the SFT asks before each step
    asked.append(log.is_file())
    return True

  def servers() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "verifier_service.cli" in " ".join(p.cmdline())}

  before = servers()  # other tests' session-scoped servers (tests/eval's loopback verifier) stay up
  result = warm_start_run.train(cfg, should_stop=stop)
  assert result.status == "stopped" and asked and asked[0], (result.status, asked)
  assert "serving on 127.0.0.1:" in log.read_text()  # it had started, and was then stopped:
  assert not servers() - before, servers() - before


def test_tiny_yaml_is_the_built_in_default_and_recipes_load(tmp_path):
  root = pathlib.Path(__file__).resolve().parents[2]
  assert train_cli.load(str(root / "configs" / "tiny.yaml"), []) == train_cli.load(None, [])
  (tmp_path / "p1.json").write_text("[]")
  (tmp_path / "p2.json").write_text("[]")
  for recipe in sorted((root / "configs").glob("dice_sdar_*.yaml")):
    cfg = train_cli.load(str(recipe), [f"model.path={tmp_path}", f"data.phase1_files=[{tmp_path / 'p1.json'}]",
                                       f"data.phase2_files=[{tmp_path / 'p2.json'}]"])
    d = to_dict(cfg)
    assert (d["rollout"]["prompts_per_step"], d["rollout"]["group_size"], d["rollout"]["gen_length"]) == (64, 16, 4096)
    assert (d["optimizer"]["lr"], d["algo"]["clip_eps"], d["algo"]["kl_beta"]) == (1e-6, 0.2, 0.01)
    assert d["rewards"]["preset"] == "dice_binary" and d["curriculum"]["phase1_steps"] == 20
    assert d["train"]["steps"] == 120 and d["rollout"]["threshold"] == 0.9


def test_custom_reward_forms_and_import_from_the_working_directory(tmp_path, monkeypatch):
  from dice_jax.config import ConfigError

  (tmp_path / "first_hour_rewards.py").write_text(
      "def short(prompts, completions, verdicts, **columns):\n"
      "  return [-float(len(c)) for c in completions]\n")
  monkeypatch.chdir(tmp_path)  # as `dice train` run beside the file: the folder is not on sys.path
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
  monkeypatch.delitem(sys.modules, "first_hour_rewards", raising=False)
  entry = {"fn": "first_hour_rewards:short", "weight": 1.0, "normalize": "none"}
  for overrides in (["rewards.custom=[first_hour_rewards:short]"], ["rewards.custom=first_hour_rewards:short"],
                    ["rewards.custom={short: {fn: 'first_hour_rewards:short'}}"]):
    assert to_dict(train_cli.load(None, overrides).rewards)["custom"] == {"short": entry}, overrides
  # Weights and normalisation of a short-form component, two ways; a later override keeps the list's entries.
  for extra in ("rewards.weights.short=0.1", "rewards.custom.short.weight=0.1"):
    cfg = train_cli.load(None, ["rewards.custom=[first_hour_rewards:short]", extra, "rewards.normalize.short=group"])
    [component] = cfg.rewards.custom_components()
    assert (component.name, component.weight, component.normalize) == ("short", 0.1, "group"), extra
    assert component.fn([], ["ab", "c"], []) == [-2.0, -1.0]
  with pytest.raises(ConfigError, match=r"rewards.custom\[1\]: .* gives the name 'short' twice"):
    train_cli.load(None, ["rewards.custom=[first_hour_rewards:short,other:short]"])
  with pytest.raises(ConfigError, match=r"rewards.custom.nocolon.fn: must be 'module:function'"):
    train_cli.load(None, ["rewards.custom=[nocolon]"])
  with pytest.raises(ConfigError, match="cannot import 'absent_module_xyz:fn' .*No module named"):
    train_cli.load(None, ["rewards.custom=[absent_module_xyz:fn]"]).rewards.custom_components()
