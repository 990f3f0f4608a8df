"""Package fronts whose names are imported on first use (PEP 562 module `__getattr__`).

`import dice_jax` must not initialise JAX (so `dice --help` and a verifier-only install stay
light), and the command-line parsers read `dice_jax.sampler.SamplerConfig` without importing the
sampler. A package lists its public names and the modules that define them:

    __getattr__, __dir__ = lazy.exports(__name__, {"dice_jax.sampler.api": ("generate", "sample"), ...})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def exports(package: str, modules: Mapping[str, Sequence[str]]
            ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
  """(`__getattr__`, `__dir__`) for `package`, whose public names live in `modules` (module ->
  the names it defines)."""
  names = {name: module for module, defined in modules.items() for name in defined}

  def __getattr__(name: str) -> object:  # pylint: disable=invalid-name
    if name not in names:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(names[name]), name)
    setattr(sys.modules[package], name, value)  # later lookups skip this function
    return value

  def __dir__() -> list[str]:  # pylint: disable=invalid-name
    return sorted(names)

  return __getattr__, __dir__
