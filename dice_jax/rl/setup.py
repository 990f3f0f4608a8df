"""Everything an RL run builds before its first step, checked in order of cost.

Cheap checks first (mesh and batch divisibility, tokenizer vs model, sampler settings vs model,
prompt width vs context), then the data (every prompt tokenised; a missing or malformed problem
file fails here, before anything is started). Then the verifier is connected in a background
thread (a loopback `dice-verifier serve` for `targets: [local]`, ~10 s to import torch; every
target preflighted for its ServerInfo) while the train state is restored from the run's latest
checkpoint or initialised from `model.path` / `model.init`, and the update step is lowered and
compiled with its memory analysis logged.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os

import jax
import jax.numpy as jnp

from dice_jax import sharding
from dice_jax.checkpoints import Checkpointer, CheckpointError
from dice_jax.config import ConfigError
from dice_jax.rl.batch import RLBatch
from dice_jax.rl.config import RLConfig, VerifierSection
from dice_jax.rl.data import PromptBook
from dice_jax.rl.rollout import eos_ids_for, sampler_config
from dice_jax.rl.update import make_update_step
from dice_jax.sampler.config import resolve
from dice_jax.train import model_setup
from dice_jax.train.optim import cast_floating, make_optimizer
from dice_jax.train.step import compile_train_step
from dice_jax.train.train_state import abstract_state, create_train_state, state_shardings
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.defaults import TRAINING

log = logging.getLogger(__name__)


def _check_batch(cfg: RLConfig, mesh: jax.sharding.Mesh) -> None:
  ways, procs = mesh.shape["data"] * mesh.shape["fsdp"], jax.process_count()
  r, t = cfg.rollout, cfg.train
  rows = r.prompts_per_step * r.group_size
  chunk = r.batch_size or rows
  if chunk % ways:
    raise ConfigError(f"rollout.batch_size: the rows per sampler call ({chunk}) must be a multiple of the data x "
                      f"fsdp mesh size {ways}")
  if r.prompts_per_step % procs or chunk % (procs * r.group_size):
    raise ConfigError(f"rollout: with {procs} processes, prompts_per_step and batch_size / group_size must be "
                      "multiples of the process count")
  if r.dynamic_sampling and procs > 1:
    raise ConfigError(f"rollout.dynamic_sampling: supported in a single process only (this run has {procs}): "
                      "which groups to drop and refill is decided where the rewards are, per process")
  micro = rows // t.num_minibatches // t.grad_accum_steps
  if micro % ways:
    log.warning("a micro-batch of %d rows does not split over the %d-way data x fsdp mesh: its activations are "
                "replicated (fine for tiny runs; raise rows or lower train.num_minibatches/grad_accum_steps)",
                micro, ways)


def connect_verifier(section: VerifierSection, run_dir: str) -> connect_lib.Connection:
  spec = "local" if section.targets == ("local",) else ",".join(section.targets)
  try:
    return _connect(spec, section, run_dir)
  except ValueError as e:  # unreadable token or TLS files, malformed targets
    raise ConfigError(f"verifier: {e}") from None


def start_verifier(section: VerifierSection, run_dir: str) -> concurrent.futures.Future:
  """`connect_verifier` in a background thread; the future's result is the Connection. A local
  server imports torch and then warms its compile stage up (header tiers, precompiled headers) by
  itself, so starting it before other work lets that work hide its start-up."""
  pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="verifier-start")
  future = pool.submit(connect_verifier, section, run_dir)
  pool.shutdown(wait=False)
  return future


def close_started(future: concurrent.futures.Future) -> None:
  """Closes a started connection (waiting for it to start); a failed start has nothing to close."""
  connection = _result_or_none(future)
  if connection is not None:
    connection.close()


def _connect(spec: str, section: VerifierSection, run_dir: str) -> connect_lib.Connection:
  return connect_lib.connect(spec, use=TRAINING, connect_timeout_s=section.connect_timeout_s,
                             request_timeout_s=section.request_timeout_s,
                             max_in_flight_per_stream=section.max_in_flight, auth_token_file=section.auth_token_file,
                             local_cache_dir=section.local_cache_dir, local_log=os.path.join(run_dir, "verifier.log"),
                             streams_per_target=section.streams_per_target, tls=section.tls,
                             tls_root_certs_file=section.tls_root_certs_file,
                             tls_client_cert_file=section.tls_client_cert_file,
                             tls_client_key_file=section.tls_client_key_file, tls_server_name=section.tls_server_name)


class Run:
  """The built pieces of one run (a context manager: closes the checkpointer and the verifier)."""

  def __init__(self, cfg: RLConfig, run_dir: str, verifier: concurrent.futures.Future | None = None):
    """`verifier`: a connection already being started (start_verifier) for `cfg.verifier`; the
    run owns it from here and closes it."""
    self.cfg, self.run_dir = cfg, run_dir
    self._verifier = verifier
    self.connection: connect_lib.Connection | None = None
    self.checkpointer: Checkpointer | None = None

  def __enter__(self) -> Run:
    try:
      self._build()
    except BaseException:
      self.__exit__()
      raise
    return self

  def __exit__(self, *exc) -> None:
    if self.checkpointer is not None:
      self.checkpointer.close()
    if self.connection is not None:
      self.connection.close()
    elif self._verifier is not None:  # given, and the build failed before it took the result
      close_started(self._verifier)

  def _build(self) -> None:
    cfg = self.cfg
    try:
      self.mesh = sharding.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    except ValueError as e:
      raise ConfigError(f"mesh: {e}") from None
    _check_batch(cfg, self.mesh)
    self.tokenizer, self.tokenizer_dir = model_setup.tokenizer_for(cfg.model, self.run_dir)
    model_config = model_setup.model_config(cfg.model)
    model_setup.check_compatible(model_config, self.tokenizer)
    self.sampling = sampler_config(cfg, eos_ids_for(model_config.eos_token_id, self.tokenizer))
    try:
      self.spec = resolve(self.sampling, model_config)
    except ValueError as e:
      raise ConfigError(f"rollout: {e}") from None
    context = cfg.data.max_prompt_length + cfg.rollout.gen_length + self.spec.block_size
    if context > model_config.max_position_embeddings:
      raise ConfigError(f"data.max_prompt_length + rollout.gen_length (+ one block) = {context} exceeds the model's "
                        f"max_position_embeddings={model_config.max_position_embeddings}")
    self.book = PromptBook(cfg.data, self.tokenizer)
    c = cfg.curriculum
    # Phase 2's stream exists whenever its files are given, also while this run stays in phase 1:
    # its position is part of every checkpoint, so the run can be continued past the switch by
    # raising train.steps (benchmarks/rl_learning.py continues its arms 20 steps at a time).
    self.stream = self.book.stream(cfg.data.phase1_files, cfg.data.phase2_files, need_phase1=c.phase1_steps != 0,
                                   need_phase2=bool(cfg.data.phase2_files) or c.schedule == "metric"
                                   or c.phase1_steps < cfg.train.steps)
    cfg.rewards.custom_components()  # import user reward functions now: a typo fails in seconds
    self.verify_options = cfg.verifier.options()
    verifier = self._verifier or start_verifier(cfg.verifier, self.run_dir)
    try:
      self._build_training(model_config)
    except BaseException:
      self.connection = _result_or_none(verifier)
      raise
    self.connection = verifier.result()

  def _build_training(self, model_config) -> None:
    cfg = self.cfg
    tx, schedule = make_optimizer(cfg.optimizer, cfg.train.steps * cfg.train.num_minibatches, adjustable=True)
    self.graphdef, abstract_params, params_sharding = model_setup.abstract_params(model_config, self.mesh)
    shardings = state_shardings(tx, params_sharding, abstract_params, self.mesh)
    target = abstract_state(tx, abstract_params, shardings)
    self.checkpointer = Checkpointer.from_config(cfg.checkpoint, self.run_dir)
    compute = jnp.dtype(cfg.model.dtype)
    needs_ref = cfg.algo.uses_reference
    self.meta, self.ref_params = {}, None
    if cfg.checkpoint.resume and self.checkpointer.latest_step() is not None:
      try:
        restored = self.checkpointer.restore(target, data_iterator=self.stream)
      except ValueError as e:  # the data stream refuses a position from different data settings
        raise CheckpointError(f"{self.checkpointer.directory}: {e}") from None
      self.state, self.start, self.meta = restored.state, restored.step, restored.meta
      log.info("resumed from %s at step %d", self.checkpointer.directory, self.start)
      if needs_ref:
        self.ref_params = cast_floating(model_setup.load_params(cfg.model, model_config, self.mesh), compute)
    else:
      params = model_setup.load_params(cfg.model, model_config, self.mesh)
      if needs_ref:  # a copy: the train state takes (donates) `params`
        self.ref_params = jax.tree.map(jnp.copy, cast_floating(params, compute))
      self.state, self.start = create_train_state(params, tx, cfg.train.seed, shardings), 0
    self.compiled = None
    if self.start >= cfg.train.steps:
      log.warning("%s already holds step %d of train.steps=%d: nothing to train (raise train.steps, or use "
                  "another run_dir)", self.checkpointer.directory, self.start, cfg.train.steps)
      return
    update_step = make_update_step(self.graphdef, self.spec, cfg.algo, tx, schedule,
                                   group_size=cfg.rollout.group_size, num_minibatches=cfg.train.num_minibatches,
                                   grad_accum_steps=cfg.train.grad_accum_steps, compute_dtype=compute,
                                   decoupled=cfg.pipeline.overlap and cfg.algo.stale_correction == "decoupled")
    batch_sharding = sharding.batch_sharding(self.mesh, 1)
    r = cfg.rollout
    abstract_batch = RLBatch.abstract(r.prompts_per_step * r.group_size, cfg.data.max_prompt_length, r.gen_length,
                                      batch_sharding, with_ref=cfg.algo.uses_reference)
    self.compiled = compile_train_step(update_step, target, abstract_batch, shardings, batch_sharding, self.mesh)


def _result_or_none(future: concurrent.futures.Future):
  """The connection if starting it succeeded (so it can be closed), else None."""
  try:
    return future.result()
  except Exception:  # pylint: disable=broad-except  (the build error is the one to report)
    return None
