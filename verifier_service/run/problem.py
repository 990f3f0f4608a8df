"""What both sides of the trust boundary derive alike from a problem and a seed.

The judge (trusted/) and the candidate's process (untrusted/) never exchange inputs: each executes
the reference source and regenerates every input from the same seeds, so the inputs the reference
sees were never touched by candidate code. Everything here is deterministic given (source, seed,
device type, precision): `set_seed` then `get_inputs()`, moved and cast the same way on both sides.

Semantics (KernelBench's, tightened where it can be fooled):
- Models are built with the same seed and the same `get_init_inputs()`; parameters and buffers
  whose names and shapes match are then copied from the reference into ModelNew, so a candidate
  that creates its parameters in another order is still compared on identical weights.
- Modules stay in their default mode (training), as KernelBench leaves them, and every forward runs
  under `torch.no_grad()`.
- Floating inputs and modules are cast to the requested precision; integer inputs (indices) never.
"""

from __future__ import annotations

import random
import sys
import types
from typing import Any

import numpy as np
import torch

from verifier_service import enums

DEFAULT_TOLERANCE = {enums.FP32: 1e-4, enums.FP16: 1e-2, enums.BF16: 1e-2}
DTYPES = {enums.FP32: torch.float32, enums.FP16: torch.float16, enums.BF16: torch.bfloat16}
CANDIDATE_FILE, REFERENCE_FILE = "candidate.py", "reference.py"


def set_seed(seed: int) -> None:
  random.seed(seed)
  np.random.seed(seed % (1 << 32))
  torch.manual_seed(seed)  # seeds every CUDA device too


def trial_seeds(base_seed: int, count: int) -> list[int]:
  """Fresh, reproducible seeds for `count` trials (KernelBench draws them from the base seed)."""
  gen = torch.Generator().manual_seed(base_seed)
  return [int(torch.randint(0, 2**31 - 1, (1,), generator=gen).item()) for _ in range(count)]


def exec_module(name: str, source: str, filename: str) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__file__ = filename
  sys.modules[name] = module
  exec(compile(source, filename, "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


def to_device(tree: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
  """Moves tensors to `device`; casts floating ones to `dtype`; leaves integer tensors alone."""
  if isinstance(tree, torch.Tensor):
    if dtype is not None and tree.is_floating_point():
      return tree.to(device=device, dtype=dtype)
    return tree.to(device=device)
  if isinstance(tree, (list, tuple)):
    return type(tree)(to_device(t, device, dtype) for t in tree)
  if isinstance(tree, dict):
    return {k: to_device(v, device, dtype) for k, v in tree.items()}
  return tree


def inputs(get_inputs, seed: int, device: torch.device, dtype: torch.dtype | None) -> Any:
  """The inputs of the trial with this seed (identical in both processes)."""
  set_seed(seed)
  return to_device(get_inputs(), device, dtype)


def clone_tree(tree: Any) -> Any:
  if isinstance(tree, torch.Tensor):
    return tree.clone()
  if isinstance(tree, (list, tuple)):
    return type(tree)(clone_tree(t) for t in tree)
  if isinstance(tree, dict):
    return {k: clone_tree(v) for k, v in tree.items()}
  return tree


def flatten(tree: Any) -> list[Any]:
  if isinstance(tree, (list, tuple)):
    return [leaf for t in tree for leaf in flatten(t)]
  if isinstance(tree, dict):
    return [leaf for k in sorted(tree, key=str) for leaf in flatten(tree[k])]
  return [tree]


def tensors(tree: Any) -> list[torch.Tensor]:
  return [t for t in flatten(tree) if isinstance(t, torch.Tensor)]


def roll(tree: Any, shift: int) -> Any:
  """Every tensor's values moved by `shift` places (values, and so valid indices, kept)."""
  if shift == 0:
    return tree
  if isinstance(tree, torch.Tensor):
    return torch.roll(tree, shift) if tree.numel() > 1 else tree
  if isinstance(tree, (list, tuple)):
    return type(tree)(roll(t, shift) for t in tree)
  return tree


def copy_into(dst: Any, src: Any) -> None:
  for d, s in zip(flatten(dst), flatten(src)):
    if isinstance(d, torch.Tensor):
      d.copy_(s)


def copy_matching_state(reference: torch.nn.Module, candidate: torch.nn.Module) -> int:
  """Copies reference parameters/buffers into the candidate where name and shape match."""
  ref_state = reference.state_dict()
  cand_state = candidate.state_dict()
  shared = {k: v for k, v in ref_state.items()
            if k in cand_state and cand_state[k].shape == v.shape
            and cand_state[k].dtype == v.dtype}
  if shared:
    candidate.load_state_dict(shared, strict=False)
  return len(shared)


def build(model_cls, get_init_inputs, seed: int, device: torch.device) -> torch.nn.Module:
  """`model_cls(*get_init_inputs())` seeded as KernelBench does: init tensors on `device`, the
  module itself where its constructor put it (the caller moves it)."""
  set_seed(seed)
  init = to_device(get_init_inputs(), device)
  set_seed(seed)
  return model_cls(*init)


def output_sizes(outputs: Any) -> list[int]:
  """Byte sizes of the tensors in an output tree (what the candidate's allocator is primed with)."""
  return [t.numel() * t.element_size() for t in tensors(outputs) if t.numel() > 0]


def spans(tree: Any) -> list[tuple[int, int]]:
  """[start, end) of the storage behind every tensor of a tree."""
  out = []
  for t in tensors(tree):
    storage = t.untyped_storage()
    if storage.nbytes():
      out.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
  return out


def overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
  return any(s < e2 and s2 < e for s, e in a for s2, e2 in b)
