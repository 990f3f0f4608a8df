"""The config loader: YAML + dotted overrides, type conversion, and errors that name the key."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from dice_jax.config import (ConfigError, apply_overrides, from_dict, load_config, require, require_file,
                             to_dict, to_yaml)


@dataclasses.dataclass(frozen=True)
class Opt:
  lr: float = 1e-5
  steps: int = 10
  schedule: Literal["constant", "cosine"] = "constant"
  clip: float | None = 1.0
  betas: tuple[float, float] = (0.9, 0.999)

  def __post_init__(self):
    require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


@dataclasses.dataclass(frozen=True)
class Data:
  path: str | None = None
  name: str = "x"
  files: tuple[str, ...] = ()
  weights: dict[str, float] = dataclasses.field(default_factory=dict)
  shuffle: bool = True

  def __post_init__(self):
    require_file(self.path, "path")


@dataclasses.dataclass(frozen=True)
class Top:
  opt: Opt = dataclasses.field(default_factory=Opt)
  data: Data = dataclasses.field(default_factory=Data)
  extra: Opt | None = None


def _write(tmp_path, text):
  path = tmp_path / "c.yaml"
  path.write_text(text)
  return str(path)


def test_defaults_yaml_and_overrides(tmp_path):
  assert load_config(Top) == Top()
  data_file = tmp_path / "d.jsonl"
  data_file.write_text("{}\n")
  path = _write(tmp_path, f"opt:\n  lr: 1e-6\n  steps: 5\ndata:\n  path: {data_file}\n")
  cfg = load_config(Top, path, ["opt.schedule=cosine", "opt.steps=1e3", "data.name=007",
                                "opt.betas=[0.8,0.9]", "data.files=a.json,b.json",
                                "data.weights.compile=0.5", "data.shuffle=false", "opt.clip=null"])
  # YAML 1.1 reads `1e-6` as a string; the float field converts it.
  assert cfg.opt == Opt(lr=1e-6, steps=1000, schedule="cosine", clip=None, betas=(0.8, 0.9))
  assert cfg.data.name == "007" and cfg.data.files == ("a.json", "b.json")
  assert cfg.data.weights == {"compile": 0.5} and cfg.data.shuffle is False
  assert cfg.data.path == str(data_file)
  # A `Section | None` field is built from a mapping and round-trips through YAML.
  cfg2 = load_config(Top, None, ["extra.lr=0.5"])
  assert cfg2.extra == Opt(lr=0.5)
  out = tmp_path / "resolved.yaml"
  out.write_text(to_yaml(cfg))
  assert load_config(Top, str(out)) == cfg
  assert from_dict(Top, to_dict(cfg)) == cfg


@pytest.mark.parametrize("overrides, message", [
    (["opt.lrr=1"], "unknown key 'opt.lrr'.*did you mean 'opt.lr'"),
    (["optt.lr=1"], "unknown key 'optt'.*did you mean 'opt'"),
    (["opt.lr=-1e-6"], r"opt.lr: must be > 0, got -1e-06"),
    (["opt.lr=fast"], "opt.lr: expected a number, got 'fast'"),
    (["opt.steps=2.5"], "opt.steps: expected an integer, got 2.5"),
    (["opt.schedule=linear"], r"opt.schedule: 'linear' is not one of \['constant', 'cosine'\]"),
    (["data.shuffle=maybe"], "data.shuffle: expected true/false"),
    (["opt.betas=[1,2,3]"], "opt.betas: expected 2 items"),
    (["data.path=/nonexistent/train.jsonl"], "data.path: file not found: '/nonexistent/train.jsonl'"),
    (["opt.lr"], "not of the form dotted.key=value"),
    (["opt.lr.x=1"], "'opt.lr' is a float, it has no key 'x'"),
])
def test_override_errors_name_the_key(overrides, message):
  with pytest.raises(ConfigError, match=message):
    load_config(Top, None, overrides)


def test_file_errors(tmp_path):
  with pytest.raises(ConfigError, match="config file not found"):
    load_config(Top, str(tmp_path / "missing.yaml"))
  with pytest.raises(ConfigError, match="not valid YAML"):
    load_config(Top, _write(tmp_path, "opt: [unclosed\n"))
  with pytest.raises(ConfigError, match="top level must be a mapping"):
    load_config(Top, _write(tmp_path, "- 1\n- 2\n"))
  path = _write(tmp_path, "opt:\n  lr: 0\n")
  with pytest.raises(ConfigError, match=r"c.yaml: opt.lr: must be > 0"):
    load_config(Top, path)
  with pytest.raises(ConfigError, match="opt: expected a mapping"):
    load_config(Top, _write(tmp_path, "opt: 3\n"))


def test_apply_overrides_keeps_input():
  data = {"opt": {"lr": 1.0}}
  out = apply_overrides(Top, data, ["opt.lr=2"])
  assert data == {"opt": {"lr": 1.0}} and out == {"opt": {"lr": 2}}


def test_base_files_are_read_first_and_overridden(tmp_path):
  (tmp_path / "family").mkdir()
  (tmp_path / "family" / "root.yaml").write_text(
      "opt:\n  lr: 1e-3\n  steps: 7\n  betas: [0.8, 0.9]\ndata:\n  files: [a.json, b.json]\n"
      "  weights: {x: 1.0, y: 2.0}\n")
  (tmp_path / "family" / "mid.yaml").write_text("base: root.yaml\nopt:\n  steps: 8\n")
  path = _write(tmp_path, "base: family/mid.yaml\nopt:\n  schedule: cosine\ndata:\n  files: [c.json]\n"
                          "  weights: {y: 3.0}\n")
  cfg = load_config(Top, path, ["opt.lr=2e-3"])
  # Mappings merge key by key (through two bases); lists and scalars replace; overrides come last.
  assert cfg.opt == Opt(lr=2e-3, steps=8, schedule="cosine", betas=(0.8, 0.9))
  assert cfg.data.files == ("c.json",) and cfg.data.weights == {"x": 1.0, "y": 3.0}


def test_base_errors_name_the_files(tmp_path):
  with pytest.raises(ConfigError, match=r"config file not found: .*nothere.yaml.* \(the base of .*c.yaml\)"):
    load_config(Top, _write(tmp_path, "base: nothere.yaml\n"))
  with pytest.raises(ConfigError, match="includes itself"):
    load_config(Top, _write(tmp_path, "base: c.yaml\n"))
  with pytest.raises(ConfigError, match="base must name a YAML file, got 3"):
    load_config(Top, _write(tmp_path, "base: 3\n"))
