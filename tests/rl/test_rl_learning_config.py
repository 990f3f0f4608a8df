"""The defaults of the RL update's fixes, and the learning experiment's recipes: what the built-in run
gets without asking (dual clip, a KL gradient that stays bounded, the stale-rollout correction, a
short warm-up, the KL guard) and what configs/synthetic_*.yaml opt into, sized for their data."""

import pathlib

import jax
import numpy as np
import pytest

from dice_jax.config import load_config
from dice_jax.data.problems import load_problems
from dice_jax.rl import advantages
from dice_jax.rl.config import RLConfig
from dice_jax.rl.data import PromptBook
from dice_jax.train import model_setup
from dice_jax.train.sft_loop import SFTConfig

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
FAMILIES = "synthetic:elementwise+activation+bias_act"


def test_the_built_in_run_gets_the_safe_choices():
  cfg = RLConfig()
  assert cfg.algo.dual_clip == 3.0 and cfg.algo.kl_estimator == "k2"
  assert cfg.algo.stale_correction == "decoupled" and cfg.pipeline.overlap
  assert 0 < cfg.optimizer.warmup_steps <= cfg.train.num_minibatches  # at most the first step
  assert cfg.kl_guard.max_kl == 1.0 and cfg.kl_guard.action == "cut_lr"
  assert not cfg.rollout.dynamic_sampling  # a random model's groups all score 0: refills would buy nothing


@pytest.fixture(scope="module")
def rl_cfg(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("recipes")
  (tmp / "rl.json").write_text("[]")
  return load_config(RLConfig, str(CONFIGS / "synthetic_rl.yaml"), [
      f"model.path={tmp}", f"data.phase1_files=[{tmp / 'rl.json'}]", f"data.phase2_files=[{tmp / 'rl.json'}]"])


def test_the_experiment_opts_into_the_rest(rl_cfg):
  a = rl_cfg.algo
  assert (a.advantage, a.kl_reference, a.kl_estimator, a.dual_clip) == ("drgrpo", "reference", "k2", 3.0)
  assert rl_cfg.rewards.preset == "dice_binary"
  assert rl_cfg.rollout.dynamic_sampling and rl_cfg.rollout.max_refills == 1
  assert rl_cfg.optimizer.warmup_steps > 0 and rl_cfg.optimizer.lr <= 2e-5
  r = rl_cfg.rollout
  assert r.prompts_per_step * r.group_size * rl_cfg.train.steps == 60 * 128  # the verdict budget
  assert rl_cfg.checkpoint.every_steps == 20  # the curve's points
  # Why Dr. GRPO: a group scoring [0.3, 0.3, 0.3, 0.1] (format and compile credit, nothing correct)
  # is a full-size update under GRPO's z-score, and moves by the reward gap under Dr. GRPO.
  rewards, valid = np.array([[0.3, 0.3, 0.3, 0.1]], np.float32), np.ones((1, 4), bool)
  grpo = np.asarray(advantages.compute("grpo", rewards, valid)[0])
  chosen = np.asarray(advantages.compute(a.advantage, rewards, valid)[0])
  assert np.abs(grpo).max() > 1.4 and np.abs(chosen).max() < 0.16


def test_recipes_fit_their_data(rl_cfg, tmp_path):
  """The longest prompt fits data.max_prompt_length, the longest fenced answer rollout.gen_length, and
  the longest SFT example data.max_length; the SFT model has 20-30 M parameters."""
  tokenizer, _ = model_setup.tokenizer_for(RLConfig().model, str(tmp_path))  # the byte tokenizer SFT trains
  book = PromptBook(rl_cfg.data, tokenizer)
  problems = load_problems(f"{FAMILIES}?split=all")
  prompt = {phase: max(len(tokenizer.encode(book.render(p, phase))) for p in problems) for phase in (1, 2)}
  fenced = {1: max(len(tokenizer.encode(f"```python\n{p.middle}\n```")) + 1 for p in problems),
            2: max(len(tokenizer.encode(f"```python\n{p.known_good}\n```")) + 1 for p in problems)}
  assert max(prompt.values()) <= rl_cfg.data.max_prompt_length
  assert max(fenced.values()) <= rl_cfg.rollout.gen_length
  (tmp_path / "sft.json").write_text("[]")
  sft = load_config(SFTConfig, str(CONFIGS / "synthetic_sft.yaml"), [f"data.train_files=[{tmp_path / 'sft.json'}]"])
  assert max(prompt[p] + fenced[p] for p in (1, 2)) <= sft.data.max_length
  mesh = model_setup.sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  _, abstract, _ = model_setup.abstract_params(model_setup.model_config(sft.model), mesh)
  assert 20e6 <= sum(x.size for x in jax.tree.leaves(abstract)) <= 30e6
