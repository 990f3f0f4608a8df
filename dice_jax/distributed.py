"""Multi-host start-up and host-to-device data placement, for pods and single machines alike.

`initialize(cfg)` calls `jax.distributed.initialize()` only where the environment says this is one
process of several (a coordinator address, a multi-task SLURM step, an Open MPI job, a multi-host
Cloud TPU slice), so the same command runs on a laptop, one GPU box and a pod. It must run before
anything touches a JAX device.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any, Literal

import jax
import numpy as np

from dice_jax.config import require

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  # auto: initialise when the environment describes several processes; always / never: force it.
  initialize: Literal["auto", "always", "never"] = "auto"
  # Explicit settings for clusters JAX does not detect (else JAX reads its environment).
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None

  def __post_init__(self):
    require(self.num_processes is None or self.num_processes > 0, "num_processes",
            f"must be > 0, got {self.num_processes}")
    require(self.process_id is None or self.process_id >= 0, "process_id",
            f"must be >= 0, got {self.process_id}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Sizes of the (data, fsdp, tensor) mesh axes (dice_jax.sharding); one may be -1: the rest."""
  data: int = 1
  fsdp: int = -1
  tensor: int = 1

  def __post_init__(self):
    sizes = (self.data, self.fsdp, self.tensor)
    require(sizes.count(-1) <= 1, "fsdp", f"at most one axis may be -1, got {sizes}")
    for name, size in zip(("data", "fsdp", "tensor"), sizes):
      require(size == -1 or size > 0, name, f"must be > 0 or -1, got {size}")


def _int_env(env: Mapping[str, str], name: str) -> int:
  try:
    return int(env.get(name, "1"))
  except ValueError:
    return 1


def multi_process_environment(env: Mapping[str, str] | None = None) -> str | None:
  """Names the launcher that started several processes of this job, or None for one process."""
  env = os.environ if env is None else env
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "JAX_COORDINATOR_ADDRESS"
  if "SLURM_STEP_ID" in env and _int_env(env, "SLURM_NTASKS") > 1:
    return "SLURM"
  if "OMPI_MCA_orte_hnp_uri" in env and _int_env(env, "OMPI_COMM_WORLD_SIZE") > 1:
    return "Open MPI"
  if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]) > 1:
    return "Cloud TPU (TPU_WORKER_HOSTNAMES)"
  if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "Cloud TPU multislice"
  return None


def launcher(cfg: DistributedConfig, env: Mapping[str, str] | None = None) -> str | None:
  """Why this process is one of several ("config", "forced" or the launcher), or None."""
  if cfg.initialize == "never":
    return None
  if cfg.coordinator_address is not None:
    return "config"
  return multi_process_environment(env) or ("forced" if cfg.initialize == "always" else None)


def initialize(cfg: DistributedConfig = DistributedConfig(),
               env: Mapping[str, str] | None = None) -> bool:
  """Joins the multi-process job when there is one; returns whether it did."""
  why = launcher(cfg, env)
  if why is None:
    return False
  if jax.distributed.is_initialized():
    return True
  jax.distributed.initialize(coordinator_address=cfg.coordinator_address,
                             num_processes=cfg.num_processes, process_id=cfg.process_id)
  log.info("jax.distributed initialised (%s): process %d of %d, %d local / %d global devices",
           why, jax.process_index(), jax.process_count(), jax.local_device_count(),
           jax.device_count())
  return True


def is_primary() -> bool:
  """The one process that writes logs and run files (checkpoints are written by all)."""
  return jax.process_index() == 0


def host_to_global(local_batch: Any, sharding: Any) -> Any:
  """Global arrays from each process's rows of the batch (`sharding`: one or a matching tree).

  On one process this is a sharded `device_put`; on a pod every process passes only its own
  rows, and no host ever holds the global batch.
  """
  def place(x, s):
    return jax.make_array_from_process_local_data(s, np.asarray(x))

  if isinstance(sharding, jax.sharding.Sharding):
    return jax.tree.map(lambda x: place(x, sharding), local_batch)
  return jax.tree.map(place, local_batch, sharding)
