"""The shipped SFT configs resolve, and the SDAR recipe fits a real SDAR config and tokenizer."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from dice_jax import distributed
from dice_jax.config import ConfigError, load_config
from dice_jax.distributed import DistributedConfig, MeshConfig
from dice_jax.model.tokenizer import load_tokenizer
from dice_jax.train import model_setup
from dice_jax.train.sft_loop import SFTConfig
from dice_jax.train.sft_step import resolve_objective

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def test_tiny_config_loads():
  cfg = load_config(SFTConfig, str(CONFIGS / "sft_tiny.yaml"))
  assert cfg.model.tokenizer == "builtin:bytes" and cfg.data.train_files == ("bundled:sft_tiny",)
  assert resolve_objective(model_setup.model_config(cfg.model), cfg.train.objective) == "two_copy"


def test_sdar_recipe_needs_paths_and_fits_sdar(shared_dir):
  path = str(CONFIGS / "sft_sdar.yaml")
  with pytest.raises(ConfigError, match="model.path: directory not found: '/path/to/SDAR-1.7B-Chat'"):
    load_config(SFTConfig, path)
  sdar_dir = shared_dir / "models" / "sdar-4b-chat"
  cfg = load_config(SFTConfig, path, [f"model.path={sdar_dir}", "data.train_files=[bundled:sft_tiny]"])
  config = model_setup.model_config(cfg.model)
  tokenizer, _ = model_setup.tokenizer_for(cfg.model, "/nonexistent-run-dir")
  model_setup.check_compatible(config, tokenizer)
  assert config.dtype == "bfloat16" and config.remat == "full" and config.block_size == 4
  assert resolve_objective(config, cfg.train.objective) == "two_copy"
  assert cfg.data.batch_size % cfg.train.grad_accum_steps == 0


def test_tokenizer_model_mismatch_is_refused(tmp_path):
  cfg = load_config(SFTConfig, str(CONFIGS / "sft_tiny.yaml"), ["model.init.vocab_size=128",
                                                                "model.init.mask_token_id=100"])
  tokenizer, _ = model_setup.tokenizer_for(cfg.model, str(tmp_path))
  with pytest.raises(ConfigError, match="the tokenizer has 260 tokens but the model's vocab_size is 128"):
    model_setup.check_compatible(model_setup.model_config(cfg.model), tokenizer)
  with pytest.raises(ConfigError, match="model: config.json .* lacks required key"):
    model_setup.model_config(load_config(SFTConfig, str(CONFIGS / "sft_tiny.yaml"),
                                         ["model.init={model_type: sdar}"]).model)


@pytest.mark.parametrize("env, launcher", [
    ({}, None),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "JAX_COORDINATOR_ADDRESS"),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, "SLURM"),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "1"}, None),  # one task: nothing to join
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, None),  # an allocation, not an srun step
    ({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "Open MPI"),
    ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}, "Cloud TPU (TPU_WORKER_HOSTNAMES)"),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),  # a single-host TPU VM
])
def test_multi_process_environment_detection(env, launcher):
  assert distributed.multi_process_environment(env) == launcher


def test_launcher_decides_when_to_initialize():
  assert distributed.launcher(DistributedConfig(), env={}) is None
  assert distributed.launcher(DistributedConfig(initialize="always"), env={}) == "forced"
  assert distributed.launcher(DistributedConfig(coordinator_address="h:1"), env={}) == "config"
  assert distributed.launcher(DistributedConfig(initialize="never"),
                              env={"JAX_COORDINATOR_ADDRESS": "h:1"}) is None
  assert distributed.launcher(DistributedConfig(), env={"JAX_COORDINATOR_ADDRESS": "h:1"}) == (
      "JAX_COORDINATOR_ADDRESS")


def test_initialize_is_a_no_op_for_one_process():
  assert distributed.initialize(DistributedConfig(), env={}) is False
  assert distributed.initialize(DistributedConfig(initialize="never"),
                                env={"JAX_COORDINATOR_ADDRESS": "x:1"}) is False
  with pytest.raises(ConfigError, match="num_processes: must be > 0"):
    DistributedConfig(num_processes=0)
  with pytest.raises(ConfigError, match="at most one axis may be -1"):
    MeshConfig(data=-1, fsdp=-1)


def test_host_to_global_places_rows_on_the_batch_axis():
  from dice_jax import sharding

  mesh = sharding.make_mesh(2, 4, 1)
  batch = {"tokens": np.arange(32, dtype=np.int32).reshape(8, 4)}
  placed = distributed.host_to_global(batch, sharding.batch_sharding(mesh, 2))
  assert placed["tokens"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  np.testing.assert_array_equal(np.asarray(placed["tokens"]), batch["tokens"])
  assert len(placed["tokens"].addressable_shards) == 8
