"""Dynamic sampling (DAPO): groups whose rewards are all equal are dropped and the batch refilled from
more rollouts of the same step, within a bounded number of them, and the counts are reported.

The rollouts are real (the tiny model, the jitted sampler, decoding, submission: a random model
writes no code, so every verdict is a local format verdict and no verifier needs to run) and so is
the reward path (dice_jax.rl.rewarding with a shaper); the reward is a user reward function that
varies within the groups of chosen problems only, so which groups carry a signal is known."""

import jax
import numpy as np
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.config import load_config
from dice_jax.data.rl_data import REWARD_COLUMNS, collate
from dice_jax.rewards import candidates
from dice_jax.rewards.shaping import RewardComponent, RewardShaper
from dice_jax.rl import dynamic, rewarding
from dice_jax.rl.config import RLConfig
from dice_jax.rl.data import PromptBook
from dice_jax.rl.rollout import RolloutEngine, eos_ids_for, sampler_config
from dice_jax.sampler.config import resolve
from dice_jax.train import model_setup
from dice_jax.train.optim import cast_floating
from dice_jax.verifier.channels import ClientConfig
from dice_jax.verifier.sync_client import VerifierClient

G = 4


def load(path, overrides):
  """RLConfig()'s small run (not `dice train`'s built-in run, which is larger), then the overrides."""
  return load_config(RLConfig, path, overrides)


def test_informative_groups_follow_the_advantage_rule():
  rewards = np.array([1, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.2, 1, 0, 0, 0], np.float32)
  valid = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0], bool)  # group 3: one valid response
  assert dynamic.informative(rewards, valid, G).tolist() == [True, False, True, False]


def test_choose_takes_informative_groups_in_sampling_order_then_fills():
  signal = [np.array([False, True, False]), np.array([True, True, False])]
  assert dynamic.choose(signal, 3) == [(0, 1), (1, 0), (1, 1)]
  assert dynamic.choose([np.array([False, False, True])], 3) == [(0, 2), (0, 0), (0, 1)]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
  run_dir = tmp_path_factory.mktemp("dynamic")
  (run_dir / "e2e.yaml").write_text('system: null\nuser: "{reference}"\n')
  cfg = load(None, [f"run_dir={run_dir}", "rollout.gen_length=8", "rollout.mode=static", "rollout.prompts_per_step=2",
                    f"rollout.group_size={G}", "data.max_prompt_length=512",
                    f"data.end_to_end_template={run_dir / 'e2e.yaml'}", "curriculum.phase1_steps=0"])
  tokenizer, _ = model_setup.tokenizer_for(cfg.model, str(run_dir))
  config = model_setup.model_config(cfg.model)
  sampling = sampler_config(cfg, eos_ids_for(config.eos_token_id, tokenizer))
  mesh = model_setup.sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  params = cast_floating(model_setup.load_params(cfg.model, config, mesh), np.float32)
  book = PromptBook(cfg.data, tokenizer)
  client = VerifierClient(ClientConfig(targets=("127.0.0.1:9",), connect_timeout_s=0.5, max_attempts=1))
  engine = RolloutEngine(cfg, model_setup.abstract_params(config, mesh)[0], resolve(sampling, config), sampling,
                         mesh, tokenizer, book, client, pb.VerifyOptions())
  yield engine, params, book, cfg
  client.close()


def _shaper(varied: set[str]) -> RewardShaper:
  """Rewards 0, 1, 0, 1 within a group of a problem in `varied`, all 0 elsewhere."""
  def alternating(prompts, completions, verdicts, problem_id, **columns):
    del prompts, completions, verdicts, columns
    return [float(i % 2) if pid in varied else 0.0 for i, pid in enumerate(problem_id)]
  return RewardShaper([RewardComponent("alternating", alternating)], exclude=frozenset())


def _sampled(engine, params, items, shaper, refill=0) -> dynamic.Sampled:
  rollout = engine.start(0, params, items, refill=refill)
  verdicts = rollout.verdicts.result()
  assert all(candidates.is_format_verdict(v) for v in verdicts)  # decided locally: no verifier ran
  return dynamic.Sampled(rollout, rewarding.score(shaper, rollout.prompts, rollout.completions, verdicts,
                                                  collate(rollout.items, G, REWARD_COLUMNS),
                                                  [i // G for i in range(len(rollout.completions))]))


def _run(parts, varied_of, max_refills):
  engine, params, book, cfg = parts
  stream = book.stream((), cfg.data.phase2_files, need_phase1=False, need_phase2=True)
  first_items = stream.next_batch(0, 2)
  shaper = _shaper(varied_of([i["problem_id"] for i in first_items]))
  made = []

  def more(refill):
    made.append(_sampled(engine, params, stream.next_batch(0, 2), shaper, refill))
    return made[-1]

  first = _sampled(engine, params, first_items, shaper)
  filled = dynamic.fill(first, more, groups=2, group_size=G, max_refills=max_refills,
                        reward_array=engine.reward_array)
  return first, made, filled


def test_all_equal_groups_are_dropped_and_refilled_from_the_stream(parts):
  """Step's rollout: problems A (varied) and B (all equal); the refill's two problems are varied.
  The batch holds A's group, then the refill's first group; B is dropped; one refill sufficed."""
  every = {p.id for p in parts[2].problems(2, parts[3].data.phase2_files)}
  first, made, filled = _run(parts, lambda first_ids: (every - {first_ids[1]}), max_refills=2)
  assert len(made) == 1
  assert filled.metrics == {"dynamic/dropped_groups": 1.0, "dynamic/refills": 1.0, "dynamic/filled_groups": 0.0,
                            "dynamic/sampled_rows": 16.0}
  batch = filled.batch
  expect = np.concatenate([np.asarray(first.rollout.batch.tokens)[:G], np.asarray(made[0].rollout.batch.tokens)[:G]])
  np.testing.assert_array_equal(np.asarray(batch.tokens), expect)
  np.testing.assert_array_equal(np.asarray(batch.prompt)[G:], np.asarray(made[0].rollout.batch.prompt)[:G])
  np.testing.assert_array_equal(np.asarray(batch.rewards), [0, 1, 0, 1, 0, 1, 0, 1])
  assert dynamic.informative(np.asarray(batch.rewards), np.asarray(batch.reward_valid), G).all()
  # The refill was sampled with its own key: the same prompts give other tokens than round 0 would.
  again = engine_tokens(parts, made[0].rollout.items, refill=0)
  assert not np.array_equal(again, np.asarray(made[0].rollout.batch.tokens))


def engine_tokens(parts, items, refill):
  engine, params = parts[0], parts[1]
  return np.asarray(engine.start(0, params, items, refill=refill).batch.tokens)


def test_refills_are_bounded_and_the_step_keeps_its_own_groups(parts):
  first, made, filled = _run(parts, lambda first_ids: set(), max_refills=2)
  assert len(made) == 2  # nothing informative anywhere: exactly max_refills extra rollouts
  assert filled.metrics == {"dynamic/dropped_groups": 6.0, "dynamic/refills": 2.0, "dynamic/filled_groups": 2.0,
                            "dynamic/sampled_rows": 24.0}
  np.testing.assert_array_equal(np.asarray(filled.batch.tokens), np.asarray(first.rollout.batch.tokens))
  first, made, filled = _run(parts, lambda first_ids: set(first_ids), max_refills=2)
  assert not made and filled.metrics["dynamic/refills"] == 0.0  # both groups informative: no refill
  _, made, filled = _run(parts, lambda first_ids: set(), max_refills=0)
  assert not made and filled.metrics["dynamic/dropped_groups"] == 2.0
