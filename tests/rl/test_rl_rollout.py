"""RolloutEngine: sampled rows grouped by prompt, in sampler-call chunks; old log-probs recomputed
under the behaviour params equal the sampler's; the frozen reference model's log-probs (a different
model, so they cannot be confused with the policy's); completions
decoded and submitted (all format failures here: a random model writes no code, so nothing reaches
the verifier and none needs to run)."""

import dataclasses

import jax
import numpy as np
import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.config import load_config
from dice_jax.rl.config import RLConfig
from dice_jax.rl.data import PromptBook
from dice_jax.rl.rollout import RolloutEngine, eos_ids_for, sampler_config
from dice_jax.sampler.config import resolve
from dice_jax.train import model_setup
from dice_jax.train.optim import cast_floating
from dice_jax.verifier.channels import ClientConfig
from dice_jax.verifier.sync_client import VerifierClient


def load(path, overrides):
  """RLConfig()'s small run (not `dice train`'s built-in run, which is larger), then the overrides."""
  return load_config(RLConfig, path, overrides)


@pytest.fixture(scope="module")
def engine_parts(tmp_path_factory):
  run_dir = tmp_path_factory.mktemp("rollout")
  (run_dir / "e2e.yaml").write_text('system: null\nuser: "{reference}"\n')
  cfg = load(None, [f"run_dir={run_dir}", "rollout.gen_length=12", "rollout.batch_size=4", "rollout.mode=static",
                    "data.max_prompt_length=512", f"data.end_to_end_template={run_dir / 'e2e.yaml'}",
                    "algo.old_logprobs=recompute", "algo.kl_reference=reference", "curriculum.phase1_steps=0"])
  tokenizer, _ = model_setup.tokenizer_for(cfg.model, str(run_dir))
  config = model_setup.model_config(cfg.model)
  sampling = sampler_config(cfg, eos_ids_for(config.eos_token_id, tokenizer))
  mesh = model_setup.sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  params = cast_floating(model_setup.load_params(cfg.model, config, mesh), np.float32)
  book = PromptBook(cfg.data, tokenizer)
  stream = book.stream((), cfg.data.phase2_files, need_phase1=False, need_phase2=True)
  client = VerifierClient(ClientConfig(targets=("127.0.0.1:9",), connect_timeout_s=0.5, max_attempts=1))
  graphdef = model_setup.abstract_params(config, mesh)[0]
  spec = resolve(sampling, config)
  # The frozen reference: another model (other seed), so its log-probs cannot pass for the policy's.
  ref_params = cast_floating(model_setup.load_params(
      dataclasses.replace(cfg.model, seed=cfg.model.seed + 1), config, mesh), np.float32)
  engine = RolloutEngine(cfg, graphdef, spec, sampling, mesh, tokenizer, book, client, pb.VerifyOptions(),
                         ref_params=ref_params)
  yield engine, params, ref_params, stream, sampling
  client.close()


def test_rollout_batch_old_and_reference_logprobs(engine_parts):
  engine, params, ref_params, stream, sampling = engine_parts
  items = stream.next_batch(0, 2)
  inflight = engine.start(0, params, items)
  batch = inflight.batch
  assert batch.tokens.shape == (8, 12) and batch.prompt.shape == (8, 512)
  lengths = np.asarray(batch.prompt_lengths)
  assert np.all(lengths[:4] == lengths[0]) and np.all(lengths[4:] == lengths[4])  # 4 rows per prompt, in order
  # Two sampler calls of 4 rows (rollout.batch_size=4); rows of one prompt still differ (sampling).
  tokens = np.asarray(batch.tokens)
  assert len({tuple(t) for t in tokens[:4]}) > 1
  # Old log-probs recomputed under the sampling params (TraceRL) equal what the sampler recorded.
  valid = np.asarray(batch.valid)
  assert inflight.logprob_mismatch is not None and inflight.logprob_mismatch < 2e-5
  # The reference's are the reference model's (scored on the same trace), not the policy's.
  algo = engine.cfg.algo
  with jax.set_mesh(engine.mesh):
    want_ref = engine._score(ref_params, engine.spec, algo.logprob, batch, algo.prompt_mask_prob)[0]
    want_old = engine._score(params, engine.spec, algo.logprob, batch, algo.prompt_mask_prob)[0]
  ref, old = np.asarray(batch.ref_logp)[valid], np.asarray(batch.old_logp)[valid]
  np.testing.assert_allclose(ref, np.asarray(want_ref)[valid], atol=1e-6)
  np.testing.assert_allclose(old, np.asarray(want_old)[valid], atol=1e-6)
  assert np.abs(ref - old).mean() > 1e-2
  verdicts = inflight.verdicts.result(timeout=30)
  assert len(verdicts) == 8 == len(inflight.completions)
  assert all(v.outcome == pb.REJECTED and v.message.startswith("format:") for v in verdicts)
  assert inflight.lengths.shape == (8,) and np.all(inflight.lengths == valid.sum(1))
