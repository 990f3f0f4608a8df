"""Hugging Face checkpoints on local disk: config.json + (sharded) safetensors, both directions.

`load_pretrained` checks the whole checkpoint against its config.json first (missing, unexpected
and wrongly shaped tensors are all reported, by name, before anything is loaded), then builds each
parameter with `jax.make_array_from_callback`: every device shard reads only its own slice of the
HF tensors (safetensors slices, converted to the parameter dtype), so a host holds at most the
shards of one parameter that its own devices need, never the whole model. `save_pretrained` writes the layout back (loadable by transformers): one tensor (one
layer) is gathered to the host at a time and files are cut at `max_shard_bytes`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from dice_jax import sharding
from dice_jax.model import hf_names
from dice_jax.model.config import ModelConfig
from dice_jax.model.tokenizer import TOKENIZER_FILES
from dice_jax.model.transformer import Transformer, abstract_model, single_device_mesh

INDEX_FILE = "model.safetensors.index.json"
_MAX_LISTED = 20


class CheckpointError(ValueError):
  """A checkpoint directory that does not match its config.json (each problem names the tensor)."""


def _paths_and_variables(state):
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  return [(tuple(k.key for k in path), v) for path, v in leaves], treedef


def read_config(ckpt_dir: str | os.PathLike, **overrides) -> ModelConfig:
  path = pathlib.Path(ckpt_dir) / "config.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path} not found: a checkpoint directory needs config.json")
  try:
    d = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from e
  return ModelConfig.from_hf_dict(d, **overrides)


def _tensor_files(ckpt_dir: pathlib.Path) -> dict[str, pathlib.Path]:
  """Tensor name -> file, from the index (sharded) or from the *.safetensors files themselves."""
  index = ckpt_dir / INDEX_FILE
  if index.is_file():
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index} has no 'weight_map' object")
    missing_files = sorted({f for f in weight_map.values() if not (ckpt_dir / f).is_file()})
    if missing_files:
      raise CheckpointError(f"{index} refers to missing files: {', '.join(missing_files)}")
    return {name: ckpt_dir / f for name, f in weight_map.items()}
  files = sorted(ckpt_dir.glob("*.safetensors"))
  if not files:
    raise CheckpointError(f"{ckpt_dir} has neither {INDEX_FILE} nor *.safetensors files")
  out = {}
  for f in files:
    with safe_open(f, framework="numpy") as handle:
      out.update({name: f for name in handle.keys()})
  return out


def _check(config: ModelConfig, abstract_state, files: dict[str, pathlib.Path], handles, where: str):
  """Every problem at once: missing, unexpected and wrongly shaped tensors, by name."""
  table = {p.path: p for p in hf_names.param_table(config)}
  expected: dict[str, tuple[int, ...]] = {}
  for path, v in _paths_and_variables(abstract_state)[0]:
    p = table[path]
    shape = tuple(v.shape[1:] if p.layered else v.shape)
    for name in p.names(config.num_layers):
      expected[name] = hf_names.hf_shape(p.kind, shape)
  problems = [f"missing tensor {n} (expected shape {expected[n]})" for n in sorted(set(expected) - set(files))]
  unexpected = sorted(n for n in set(files) - set(expected) if not hf_names.is_ignorable(n))
  if config.tie_word_embeddings:  # tied checkpoints may still carry the (identical) head; ignore it
    unexpected = [n for n in unexpected if n not in ("lm_head.weight", "model.transformer.ff_out.weight")]
  problems += [f"unexpected tensor {n} in {files[n].name}" for n in unexpected]
  for name in sorted(set(expected) & set(files)):
    try:
      shape = tuple(handles[files[name]].get_slice(name).get_shape())
    except Exception as e:  # the index names a tensor its file does not hold
      problems.append(f"tensor {name} cannot be read from {files[name].name}: {e}")
      continue
    if shape != expected[name]:
      problems.append(f"tensor {name} has shape {shape} in {files[name].name}, expected {expected[name]}")
  if problems:
    listed = "\n  - ".join(problems[:_MAX_LISTED])
    more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    raise CheckpointError(f"checkpoint {where} does not match its config.json "
                          f"(model_type={json.loads(config.hf_config_json).get('model_type')!r}, "
                          f"{config.num_layers} layers, hidden {config.hidden_size}):\n  - {listed}{more}")


def load_pretrained(ckpt_dir: str | os.PathLike, *, mesh: Mesh | None = None, dtype: str | None = None,
                    param_dtype: str | None = None, **run_options) -> Transformer:
  """The model in `ckpt_dir` (HF layout), each parameter placed on its devices as it is read.

  dtype: compute dtype (default float32); param_dtype: master-weight dtype (default float32);
  run_options: other ModelConfig run fields (remat, scan_layers, attention_impl).
  """
  ckpt_dir = pathlib.Path(ckpt_dir)
  overrides = {k: v for k, v in dict(dtype=dtype, param_dtype=param_dtype).items() if v is not None}
  config = read_config(ckpt_dir, **overrides, **run_options)
  files = _tensor_files(ckpt_dir)
  mesh = mesh or single_device_mesh()
  graphdef, abstract_state = abstract_model(config)
  shardings = sharding.state_shardings(abstract_state, mesh)
  table = {p.path: p for p in hf_names.param_table(config)}
  with contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(safe_open(f, framework="numpy")) for f in sorted(set(files.values()))}
    _check(config, abstract_state, files, handles, str(ckpt_dir))
    variables, treedef = _paths_and_variables(abstract_state)
    named = dict(_paths_and_variables(shardings)[0])
    leaves = []
    for path, v in variables:
      array = _load_param(table[path], v.shape, config.weight_dtype, named[path].get_value(), files, handles)
      leaves.append(v.replace(array))
  return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))


def _load_param(p: hf_names.HFParam, shape, dtype, named_sharding, files, handles) -> jax.Array:
  layer_shape = tuple(shape[1:] if p.layered else shape)
  cache: dict[tuple, np.ndarray] = {}  # replicated shards ask for the same region: read it once

  def reader(name):
    return lambda hf_index: handles[files[name]].get_slice(name)[hf_index]

  def callback(index):
    key = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
    if key not in cache:
      if p.layered:
        layers = range(*index[0].indices(shape[0]))
        parts = [hf_names.read_region(p.kind, reader(p.hf_name.format(i=i)), index[1:], layer_shape) for i in layers]
        cache[key] = np.stack(parts).astype(dtype)
      else:
        cache[key] = hf_names.read_region(p.kind, reader(p.hf_name), index, layer_shape).astype(dtype)
    return cache[key]

  return jax.make_array_from_callback(tuple(shape), named_sharding, callback)


def _to_host(x: jax.Array) -> np.ndarray:
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def save_pretrained(model: Transformer, out_dir: str | os.PathLike, *, dtype: str | None = None,
                    max_shard_bytes: int = 5 * 2**30, tokenizer_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Write config.json + safetensors (+ index when sharded) in HF layout; returns `out_dir`.

  dtype: tensor dtype on disk (default: the parameter dtype). Existing model*.safetensors and
  index files in `out_dir` are replaced. `tokenizer_dir`: copy its tokenizer files alongside.
  Every process must call this (multi-host gathers); only process 0 writes.
  """
  config = model.config
  out_dir = pathlib.Path(out_dir)
  disk_dtype = np.dtype(jnp.dtype(dtype or config.param_dtype))
  arrays = {path: v.get_value() for path, v in _paths_and_variables(nnx.state(model))[0]}
  table = hf_names.param_table(config)
  entries: list[tuple[hf_names.HFParam, int | None]] = [
      (p, None) for p in table if not p.layered and p.path == ("embed",)]
  entries += [(p, i) for i in range(config.num_layers) for p in table if p.layered]
  entries += [(p, None) for p in table if not p.layered and p.path != ("embed",)]

  def nbytes(p, i):
    shape = arrays[p.path].shape[1:] if p.layered else arrays[p.path].shape
    return int(np.prod(hf_names.hf_shape(p.kind, tuple(shape)))) * disk_dtype.itemsize

  groups, size = [[]], 0
  for p, i in entries:
    if groups[-1] and size + nbytes(p, i) > max_shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append((p, i))
    size += nbytes(p, i)
  writer = jax.process_index() == 0
  if writer:
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*out_dir.glob("model*.safetensors"), out_dir / INDEX_FILE]:
      stale.unlink(missing_ok=True)
  weight_map, total = {}, 0
  for k, group in enumerate(groups):
    file_name = "model.safetensors" if len(groups) == 1 else f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
    tensors = {}
    for p, i in group:
      name = p.hf_name.format(i=i) if p.layered else p.hf_name
      array = arrays[p.path][i] if p.layered else arrays[p.path]
      tensors[name] = hf_names.to_hf(p.kind, _to_host(array).astype(disk_dtype))
      weight_map[name] = file_name
      total += tensors[name].nbytes
    if writer:
      save_file(tensors, str(out_dir / file_name), metadata={"format": "pt"})
  if writer:
    if len(groups) > 1:
      index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
      (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    hf_config = config.to_hf_dict()
    hf_config["torch_dtype"] = hf_config["dtype"] = disk_dtype.name
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
      for name in TOKENIZER_FILES:
        if (pathlib.Path(tokenizer_dir) / name).is_file():
          shutil.copyfile(pathlib.Path(tokenizer_dir) / name, out_dir / name)
  return out_dir
