"""Typed run configuration: nested frozen dataclasses, a YAML file, and `key=value` overrides.

A config *schema* is a frozen dataclass whose fields are scalars (int, float, bool, str), `X | None`,
`Literal[...]`, `tuple[...]`, `dict[str, X]` or other such dataclasses (the sections). One loader
serves every schema, so a new command adds sections by writing dataclasses, never by touching this
module:

    @dataclasses.dataclass(frozen=True)
    class RolloutConfig:
      temperature: float = 1.0
      def __post_init__(self):
        require(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")

    @dataclasses.dataclass(frozen=True)
    class RLConfig:
      model: ModelSection = dataclasses.field(default_factory=ModelSection)
      rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)

    cfg = load_config(RLConfig, "configs/rl.yaml", ["rollout.temperature=0.7"])

Values are converted to the annotated type (YAML reads `1e-6` as a string; a float field takes it),
and every error is a `ConfigError` that names the dotted key: unknown keys (with a suggestion),
wrong types, and bad values found by a section's `__post_init__` through `require`.

A config file may start from another: a top-level `base: OTHER.yaml` (a path relative to the file)
is read first, recursively, and the file's own values are laid over it: mappings merge key by key,
anything else (numbers, strings, lists) replaces what the base said. So a family of recipes is one
base plus a few lines each (configs/). Decision: one key and a plain merge, not a templating
system: what a recipe changes stays readable in the recipe itself.

Short forms: a `dict[str, Section]` field also takes a list of strings when `Section` defines a
classmethod `from_short(item: str) -> (key, mapping)`; each item becomes one entry (so
`rewards.custom=[mymod:fn]` means `rewards.custom={fn: {fn: "mymod:fn"}}`). Decision: the hook is
on the section, so this module stays ignorant of what any section means.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

import yaml

if TYPE_CHECKING:
  from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

_NULL_WORDS = ("null", "none", "~", "")
_TRUE_WORDS = ("true", "yes", "on", "1")
_FALSE_WORDS = ("false", "no", "off", "0")


class ConfigError(ValueError):
  """A config file or override is invalid; the message names the dotted key and the fix."""


def require(ok: bool, key: str, message: str) -> None:
  """Raises ConfigError(`key: message`) unless `ok`; for use in a section's `__post_init__`."""
  if not ok:
    raise ConfigError(f"{key}: {message}")


def require_file(path: str | None, key: str) -> None:
  """Checks that `path` (when set) names an existing file, so a run fails before it starts."""
  if path is not None:
    require(os.path.isfile(os.path.expanduser(path)), key, f"file not found: {path!r}")


def require_dir(path: str | None, key: str) -> None:
  """Checks that `path` (when set) names an existing directory."""
  if path is not None:
    require(os.path.isdir(os.path.expanduser(path)), key, f"directory not found: {path!r}")


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
  return typing.get_type_hints(schema)


def _join(where: str, key: str) -> str:
  return f"{where}.{key}" if where else key


def _type_name(tp: Any) -> str:
  return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _is_union(tp: Any) -> bool:
  return typing.get_origin(tp) in (Union, types.UnionType)


def _convert(value: Any, tp: Any, where: str) -> Any:
  """Returns `value` as type `tp`, or raises ConfigError naming `where`."""
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if tp is Any:
    return value
  if dataclasses.is_dataclass(tp):
    if value is None:
      value = {}
    section = typing.cast("type[DataclassInstance]", tp)  # an annotation: a class, not an instance
    if not isinstance(value, Mapping):
      raise ConfigError(f"{where}: expected a mapping (section {section.__name__}), got {value!r}")
    return from_dict(section, value, where=where)
  if _is_union(tp):
    nullable = type(None) in args
    if nullable and (value is None or (str not in args and isinstance(value, str)
                                       and value.strip().lower() in _NULL_WORDS)):
      return None
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _convert(value, arg, where)
      except ConfigError:
        continue
    raise ConfigError(f"{where}: {value!r} is not a valid {_type_name(tp)}")
  if origin is Literal:
    for choice in args:
      if value == choice or (isinstance(value, str) and str(choice) == value):
        return choice
    raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
  if tp is bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
      return value.strip().lower() in _TRUE_WORDS
    raise ConfigError(f"{where}: expected true/false, got {value!r}")
  if tp is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    try:
      number = float(value) if isinstance(value, (str, float)) else None
    except ValueError:
      number = None
    if number is not None and number.is_integer():
      return int(number)
    raise ConfigError(f"{where}: expected an integer, got {value!r}")
  if tp is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    if isinstance(value, str):
      try:
        return float(value)
      except ValueError:
        pass
    raise ConfigError(f"{where}: expected a number, got {value!r}")
  if tp is str:
    if isinstance(value, str):
      return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return str(value)
    raise ConfigError(f"{where}: expected a string, got {value!r}")
  if origin is tuple:
    if isinstance(value, str):
      value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, Sequence):
      raise ConfigError(f"{where}: expected a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
      raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}: {value!r}")
    return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
  if origin in (dict, Mapping):
    key_tp, value_tp = args or (str, Any)
    value = _expand_short_form(value, value_tp, where)
    if not isinstance(value, Mapping):
      raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return {_convert(k, key_tp, where): _convert(v, value_tp, _join(where, str(k)))
            for k, v in value.items()}
  raise TypeError(f"{where}: unsupported annotation {tp!r} in a config schema")


def _expand_short_form(value: Any, value_tp: Any, where: str) -> Any:
  """A list of strings (or one comma-separated string) -> the mapping it abbreviates, when the
  dict's value type has a `from_short` classmethod; anything else is returned unchanged."""
  from_short = getattr(value_tp, "from_short", None)
  if from_short is None or isinstance(value, Mapping) or value is None:
    return value
  if isinstance(value, str):
    value = [v.strip() for v in value.split(",") if v.strip()]
  if not isinstance(value, Sequence):
    return value
  out: dict[str, Any] = {}
  for i, item in enumerate(value):
    if not isinstance(item, str):
      raise ConfigError(f"{where}[{i}]: the list form takes strings, got {item!r}; use the mapping "
                        "form for more settings")
    key, entry = from_short(item)
    if key in out:
      raise ConfigError(f"{where}[{i}]: {item!r} gives the name {key!r} twice; use the mapping form "
                        "to name them apart")
    out[key] = entry
  return out


def _unknown_key(where: str, key: str, known: Sequence[str]) -> ConfigError:
  close = difflib.get_close_matches(key, known, n=1)
  hint = f"; did you mean {_join(where, close[0])!r}?" if close else ""
  return ConfigError(f"unknown key {_join(where, key)!r} (known: {', '.join(known)}){hint}")


def from_dict(schema: type[T], data: Mapping[str, Any], *, where: str = "") -> T:
  """Builds dataclass `schema` from a nested mapping: converts types, rejects unknown keys."""
  fields = [f for f in dataclasses.fields(schema) if f.init]
  names = [f.name for f in fields]
  hints = _hints(schema)
  kwargs = {}
  for key, value in data.items():
    if key not in names:
      raise _unknown_key(where, str(key), names)
    kwargs[key] = _convert(value, hints[key], _join(where, key))
  for f in fields:
    if f.name not in kwargs and f.default is dataclasses.MISSING and (
        f.default_factory is dataclasses.MISSING):
      raise ConfigError(f"{_join(where, f.name)}: required, and not given")
  try:
    return schema(**kwargs)
  except ConfigError as e:
    raise ConfigError(_join(where, str(e))) from None


def to_dict(cfg: Any) -> Any:
  """Plain nested dict/list/scalars (YAML- and JSON-friendly) of a config dataclass."""
  if dataclasses.is_dataclass(cfg):
    return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
  if isinstance(cfg, (tuple, list)):
    return [to_dict(v) for v in cfg]
  if isinstance(cfg, Mapping):
    return {k: to_dict(v) for k, v in cfg.items()}
  return cfg


def _field_type(schema: Any, path: Sequence[str], where: str) -> Any:
  """The annotation at dotted `path` inside `schema` (descending into sections and dicts)."""
  tp = schema
  for i, key in enumerate(path):
    here = ".".join(path[:i])
    args = typing.get_args(tp)
    if _is_union(tp):  # `Section | None`: descend into the section
      tp = next(a for a in args if a is not type(None))
    if dataclasses.is_dataclass(tp):
      names = [f.name for f in dataclasses.fields(tp) if f.init]
      if key not in names:
        raise _unknown_key(here, key, names)
      tp = _hints(typing.cast(type, tp))[key]  # an annotation: a class, not an instance
    elif typing.get_origin(tp) in (dict, Mapping):
      tp = (typing.get_args(tp) or (str, Any))[1]
    else:
      raise ConfigError(f"{where}: {here!r} is a {_type_name(tp)}, it has no key {key!r}")
  return tp


def apply_overrides(schema: type, data: Mapping[str, Any], overrides: Sequence[str]) -> dict:
  """Returns a copy of `data` with each `dotted.key=value` override set.

  The value is read as YAML unless the target field is a string (so `run.name=007` stays "007"),
  which lets `optimizer.betas=[0.9,0.95]` and `model.path=null` work as expected.
  """
  out: dict = to_dict(dict(data))
  for item in overrides:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    path = key.split(".")
    tp = _field_type(schema, path, key)
    if tp is str or (_is_union(tp) and str in typing.get_args(tp)):
      value = None if raw.strip().lower() in _NULL_WORDS and tp is not str else raw
    else:
      try:
        value = yaml.safe_load(raw) if raw.strip() else None
      except yaml.YAMLError:  # e.g. `[x.json?split=train]`: PyYAML takes no `?` inside a flow list
        bare = raw.strip()
        value = bare[1:-1] if bare.startswith("[") and bare.endswith("]") else raw
    node = out
    for i, part in enumerate(path[:-1]):
      child = node.get(part)
      if child is not None and not isinstance(child, dict):  # a short form set earlier: expand it
        part_tp = _field_type(schema, path[:i + 1], key)
        if typing.get_origin(part_tp) in (dict, Mapping):
          child = _expand_short_form(child, (typing.get_args(part_tp) or (str, Any))[1], key)
      if not isinstance(child, dict):
        child = {}
      node[part] = child
      node = child
    node[path[-1]] = value
  return out


BASE_KEY = "base"


def read_yaml(path: str) -> dict[str, Any]:
  """Reads a YAML mapping, with errors that name the file; a `base:` file first (module docstring)."""
  return _read_yaml(os.path.expanduser(path), ())


def _read_yaml(path: str, including: tuple[str, ...]) -> dict[str, Any]:
  if not os.path.isfile(path):
    where = f" (the base of {including[-1]})" if including else ""
    raise ConfigError(f"config file not found: {path!r}{where}")
  with open(path, encoding="utf-8") as f:
    try:
      data = yaml.safe_load(f)
    except yaml.YAMLError as e:
      raise ConfigError(f"{path}: not valid YAML: {e}") from None
  if data is None:
    return {}
  if not isinstance(data, dict):
    raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
  base = data.pop(BASE_KEY, None)
  if base is None:
    return data
  if not isinstance(base, str) or not base.strip():
    raise ConfigError(f"{path}: {BASE_KEY} must name a YAML file, got {base!r}")
  base_path = os.path.normpath(os.path.join(os.path.dirname(path), os.path.expanduser(base)))
  chain = (*including, os.path.abspath(path))
  if os.path.abspath(base_path) in chain:
    raise ConfigError(f"{path}: {BASE_KEY} {base!r} includes itself ({' -> '.join(chain)} -> {base_path})")
  return merge(_read_yaml(base_path, chain), data)


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
  """`over` laid over `base`: mappings merged key by key (recursively), other values replaced."""
  out = dict(base)
  for key, value in over.items():
    if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
      out[key] = merge(out[key], value)
    else:
      out[key] = value
  return out


def load_config(schema: type[T], path: str | None = None, overrides: Sequence[str] = ()) -> T:
  """Defaults of `schema`, updated by the YAML file at `path`, then by `key=value` overrides."""
  data = read_yaml(path) if path else {}
  data = apply_overrides(schema, data, overrides)
  try:
    return from_dict(schema, data)
  except ConfigError as e:
    raise ConfigError(f"{path}: {e}" if path else str(e)) from None


def to_yaml(cfg: Any) -> str:
  """The resolved config as YAML, fields in their declared order (--print-config, a run's
  config.yaml); `load_config` reads it back to the same config."""
  return yaml.safe_dump(to_dict(cfg), sort_keys=False)
