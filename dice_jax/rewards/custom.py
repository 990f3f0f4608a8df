"""User reward functions named in a config: `rewards.custom` entries, imported from `module:function`.

A user's function has the library's signature, `fn(prompts, completions, verdicts, **item_columns)
-> list[float]` (dice_jax.rewards.shaping); RewardConfig.custom names it, and
RewardConfig.custom_components imports it (a typo fails at start-up, naming the key).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Literal

from dice_jax.config import ConfigError, require
from dice_jax.rewards.shaping import RewardFn


@dataclasses.dataclass(frozen=True)
class CustomReward:
  """A user reward function `fn(prompts, completions, verdicts, **item_columns) -> list[float]`.

  The module is imported as Python would from the working directory (`dice train` run beside
  `myrewards.py` finds it without PYTHONPATH; see `load`).
  """
  fn: str  # "package.module:function"
  weight: float = 1.0
  normalize: Literal["none", "batch", "group"] = "none"

  def __post_init__(self):
    require(":" in self.fn, "fn", f"must be 'module:function', got {self.fn!r}")

  @classmethod
  def from_short(cls, item: str) -> tuple[str, dict[str, str]]:
    """The list form `rewards.custom=[mymod:short]`: named after the function, weight 1.0, no
    normalisation (`rewards.weights.short=0.1` and `rewards.normalize.short=group` change those)."""
    return item.rpartition(":")[2].strip() or item, {"fn": item}


def _import_module(module_name: str):
  """`module_name` as installed, else from the working directory (as `python -m` would find it).

  Decision: the working directory is tried second and then stays on sys.path (so the module's own
  sibling imports work): a user's `myrewards.py` is found without PYTHONPATH=., yet cannot shadow
  an installed package of the same name.
  """
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    top = module_name.split(".")[0]
    cwd = os.getcwd()
    if e.name != top or cwd in sys.path:
      raise
    sys.path.append(cwd)
    return importlib.import_module(module_name)


def load(path: str, name: str) -> RewardFn:
  """The function `path` ("module:function") names; ConfigError naming `rewards.custom.<name>.fn`."""
  module_name, _, attr = path.partition(":")
  try:
    fn = getattr(_import_module(module_name.strip()), attr.strip())
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"rewards.custom.{name}.fn: cannot import {path!r} (from the installed "
                      f"packages or {os.getcwd()}): {e}") from None
  if not callable(fn):
    raise ConfigError(f"rewards.custom.{name}.fn: {path!r} is not callable")
  return fn
