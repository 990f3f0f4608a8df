"""Rewards flow from a rollout to the update: an RL step whose rollout holds known-good completions
gets their verdicts from a real loopback verifier (compile-only here) and a non-zero compile reward.

Until 2026-12-01 no RL run ever earned a reward: `dice train` starts its loopback verifier from a
short-lived thread, and the server's PR_SET_PDEATHSIG (which follows the starting *thread*) killed
it as soon as that thread ended, right after the start-up check had reached it; every verdict of
every rollout then came back "not reachable". This test builds the run exactly as `dice train` does
(dice_jax.rl.setup.Run, which starts the verifier that way) and failed on that code.

The rollout is one group: the problem's known-good answer twice, an answer whose CUDA does not
compile and a response with no code, decoded and verified by the real engine and scored by the real shaper; the
update step is the run's compiled one. One-step log-probs (recomputed under the current params)
keep the update cheap on a 2-core CPU with ~800-token responses.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.config import load_config
from dice_jax.data import problems as problems_lib
from dice_jax.metrics_log import MetricsLogger
from dice_jax.rewards import defaults, outcomes
from dice_jax.rl import loop as loop_lib
from dice_jax.rl import setup
from dice_jax.rl.batch import RLBatch
from dice_jax.rl.config import RLConfig
from dice_jax.rl.rollout import RolloutEngine
from dice_jax.train.optim import cast_floating


def load(path, overrides):
  """RLConfig()'s small run (not `dice train`'s built-in run, which is larger), then the overrides."""
  return load_config(RLConfig, path, overrides)

GEN = 768  # byte tokens: the problem's fenced answer (752 with <|im_end|>)
PROBLEM = "tiny_relu"


def _problem_file(tmp: pathlib.Path) -> pathlib.Path:
  chosen = [p for p in problems_lib.load_bundled("tiny") if p.id == PROBLEM]
  records = [{"id": p.id, "pytorch_code": p.reference_source, "prefix": p.prefix, "middle": p.middle,
              "suffix": p.suffix, "cuda_code": p.known_good} for p in chosen]
  path = tmp / "one.json"
  path.write_text(json.dumps(records))
  return path


def _responses(problem: problems_lib.Problem) -> list[str]:
  """Group of 4: the known-good answer twice, a CUDA body that cannot compile, and no code at all."""
  good = f"```python\n{problem.middle}\n```"
  broken = good.replace("__global__", "__global__ bad", 1)
  return [good, good, broken, "I would write a kernel here."]


def _teacher_forced_batch(engine: RolloutEngine, params, items, texts: list[str]) -> tuple[RLBatch, jax.Array]:
  """The rollout arrays `RolloutEngine.start` would build had the sampler written `texts` (one
  token per step, in order), old log-probs recomputed under `params` (algo.old_logprobs=recompute),
  and which rows ended with EOS (all)."""
  tok, spec, rows = engine.tokenizer, engine.spec, len(texts)
  tokens = np.full((rows, GEN), spec.pad_id, np.int32)
  valid = np.zeros((rows, GEN), bool)
  for r, text in enumerate(texts):
    ids = tok.encode(text) + [tok.im_end_id]
    assert len(ids) <= GEN, (len(ids), GEN)
    tokens[r, :len(ids)], valid[r, :len(ids)] = ids, True
  ids, lengths = engine.prompt_arrays(items)
  block = spec.block_size
  batch = RLBatch(prompt=jnp.asarray(ids), prompt_lengths=jnp.asarray(lengths), tokens=jnp.asarray(tokens),
                  valid=jnp.asarray(valid),
                  commit_rank=jnp.asarray(np.where(valid, np.arange(GEN)[None] % block, -1), jnp.int32),
                  old_logp=jnp.zeros((rows, GEN), jnp.float32),  # recomputed next
                  score_keys=jax.random.key_data(jax.random.split(jax.random.key(0), rows)))
  algo = engine.cfg.algo
  batch = batch.replace(old_logp=engine._score(params, spec, algo.logprob, batch, algo.prompt_mask_prob)[0])
  return batch, jnp.ones(rows, bool)


@pytest.mark.slow
def test_known_good_completions_earn_compile_reward_through_the_rl_step(tmp_path):
  problem_file = _problem_file(tmp_path)
  cfg = load(None, [f"run_dir={tmp_path / 'run'}", f"data.phase1_files=[{problem_file}]", "data.phase2_files=[]",
                    "data.max_prompt_length=1024", f"rollout.gen_length={GEN}", "rollout.prompts_per_step=1",
                    "rollout.group_size=4", "train.steps=1", "curriculum.phase1_steps=1", "algo.logprob=one_step",
                    "algo.old_logprobs=recompute", "checkpoint.every_steps=1", "logging.samples_per_phase=8",
                    "mesh.fsdp=4", "mesh.tensor=2"])  # 4 rows over the 8 test devices
  with setup.Run(cfg, cfg.run_dir) as run:
    shaper = defaults.make_shaper(cfg.rewards, has_gpu=run.connection.has_gpu)
    engine = RolloutEngine(cfg, run.graphdef, run.spec, run.sampling, run.mesh, run.tokenizer, run.book,
                           run.connection.client, run.verify_options)
    items = run.stream.next_batch(1, 0)
    by_id = {p.id: p for p in problems_lib.load_json(problem_file)}
    texts = [t for item in items for t in _responses(by_id[item["problem_id"]])]
    params = cast_floating(run.state.params, jnp.float32)
    with jax.set_mesh(run.mesh):
      inflight = engine.submit(0, items, *_teacher_forced_batch(engine, params, items, texts))
    verdicts = inflight.verdicts.result(timeout=600)
    labels = [outcomes.label(v) for v in verdicts]
    compiled_label = "OK" if run.connection.has_gpu else "NO_GPU"
    assert labels == [compiled_label, compiled_label, "COMPILE_ERROR", "FORMAT"], \
        [(lab, v.message[:300]) for lab, v in zip(labels, verdicts)]
    assert all(outcomes.from_server(v) for v in verdicts[:3])  # the verifier's own verdicts
    with MetricsLogger(run_dir=cfg.run_dir, total_steps=1, enabled=True, summary_keys=()) as logger:
      metrics = loop_lib._Loop(cfg, run, engine, shaper, lambda: False)._update(inflight, verdicts, logger)
  assert metrics["reward/compile"] == pytest.approx(0.5) and metrics["compile"] == pytest.approx(0.5)
  assert metrics["reward"] > 0 and metrics["grad_norm"] > 0  # groups have variance: the policy moved
  assert metrics[f"outcomes/{compiled_label}"] == 2 and metrics["outcomes/COMPILE_ERROR"] == 1
  assert metrics["outcomes/FORMAT"] == 1 and metrics["outcomes/UNREACHABLE"] == 0
  assert metrics[f"phase1/outcomes/{compiled_label}"] == 2
  written = [json.loads(line) for line in (pathlib.Path(cfg.run_dir) / "samples" / "step_1.jsonl").open()]
  assert [r["outcome"] for r in written] == labels
  assert [r["components"]["compile"] for r in written] == [1.0, 1.0, 0.0, 0.0]
  assert written[2]["message"] and written[3]["completion"] == "I would write a kernel here."
  assert np.isfinite(metrics["loss"])
