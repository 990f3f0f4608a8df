"""One device mesh (`data`, `fsdp`, `tensor`) and the one table that maps logical axes onto it.

Parameters and activations are annotated with *logical* axis names ('embed', 'mlp', 'batch', ...);
`LOGICAL_AXIS_RULES` is the only place that says which mesh axis each name is split over. Changing a
parallelism strategy means editing this table, not the model.

- `data`: pure data parallelism (parameters replicated).
- `fsdp`: data parallelism with parameters, gradients and optimizer state sharded (ZeRO-3 style);
  the batch is split over `data` x `fsdp`.
- `tensor`: Megatron-style tensor parallelism over heads, MLP width and vocabulary.

Activation constraints (`constrain`) apply only when a mesh is in context (`jax.set_mesh(mesh)`);
without one they are no-ops, so the same model code runs on one CPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import jax
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

MeshAxes = str | tuple[str, ...] | None

# Logical axis name -> mesh axis (or axes, or None for replicated). The one rules table.
LOGICAL_AXIS_RULES: dict[str, MeshAxes] = {
    # Parameters.
    "layers": None,  # the stacked-layer axis scanned over
    "vocab": "tensor",
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    # Activations.
    "batch": ("data", "fsdp"),
    "length": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
}

_warned: set[tuple] = set()


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over `devices` (default: all). One size may be -1: the rest."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if known <= 0 or len(devices) % known:
      raise ValueError(f"cannot fill mesh data={data} fsdp={fsdp} tensor={tensor} "
                       f"from {len(devices)} devices")
    sizes[sizes.index(-1)] = len(devices) // known
  if any(s < 1 for s in sizes) or math.prod(sizes) != len(devices):
    raise ValueError(f"mesh data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]} needs "
                     f"{math.prod(sizes)} devices, have {len(devices)}")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | AbstractMesh | None = None) -> PartitionSpec:
  """PartitionSpec for logical `axes` under LOGICAL_AXIS_RULES.

  With `shape` and `mesh`, a dimension that the mesh axes do not divide is replicated instead
  (logged once), and a mesh axis is never used twice in one spec.
  """
  used: set[str] = set()
  out: list[MeshAxes] = []
  for i, name in enumerate(axes):
    if name is not None and name not in LOGICAL_AXIS_RULES:
      raise KeyError(f"logical axis {name!r} is not in LOGICAL_AXIS_RULES ({sorted(LOGICAL_AXIS_RULES)})")
    target = LOGICAL_AXIS_RULES.get(name) if name else None
    mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
    mesh_axes = tuple(a for a in mesh_axes if a not in used)
    if mesh is not None:
      mesh_axes = tuple(a for a in mesh_axes if mesh.shape[a] > 1)
    if mesh_axes and shape is not None and mesh is not None:
      ways = math.prod(mesh.shape[a] for a in mesh_axes)
      if shape[i] % ways:
        key = (tuple(axes), tuple(shape), mesh_axes)
        if key not in _warned:
          _warned.add(key)
          logging.warning("dimension %d (%s) of shape %s is not divisible by mesh axes %s (%d): replicated",
                          i, name, tuple(shape), mesh_axes, ways)
        mesh_axes = ()
    used.update(mesh_axes)
    out.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return PartitionSpec(*out)


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def state_shardings(tree, mesh: Mesh):
  """NamedShardings for a pytree of (abstract) nnx Variables, e.g. model or optimizer state.

  Variables are sharded by their logical axis names (optimizer moments keep their parameter's
  names); any other leaf (a step count, say) is replicated.
  """

  def one(v):
    if not isinstance(v, nnx.Variable):
      return NamedSharding(mesh, PartitionSpec())
    axes = v.get_metadata().get("out_sharding") or (None,) * len(v.shape)
    return v.replace(NamedSharding(mesh, logical_to_spec(axes, v.shape, mesh)))

  return jax.tree.map(one, tree, is_leaf=_is_variable)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Inputs such as tokens_BxL: batch split over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), None, mesh))


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """with_sharding_constraint by logical names when a mesh is in context; a no-op otherwise."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = logical_to_spec(axes, x.shape, mesh)
  return jax.lax.with_sharding_constraint(x, spec)
