"""The data directory ($DICE_DATA_DIR): relative problem paths not found where the command runs are
read from it, and a path found nowhere is one error naming the path, the places and the setting."""

from __future__ import annotations

import json

import pytest
import yaml

from dice_jax.config import ConfigError
from dice_jax.data import data_dir
from dice_jax.data import problems as P


@pytest.fixture()
def folders(tmp_path, monkeypatch):
  """(working directory, data directory holding dice/tiny.json), the command run from the former."""
  work, data = tmp_path / "work", tmp_path / "data"
  work.mkdir()
  (data / "dice").mkdir(parents=True)
  records = yaml.safe_load((P.importlib.resources.files("dice_jax.data") / "bundled" / "tiny.yaml").read_text())
  (data / "dice" / "tiny.json").write_text(json.dumps(records))
  monkeypatch.chdir(work)
  monkeypatch.delenv(data_dir.ENV, raising=False)
  return work, data


def test_relative_paths_are_read_from_the_data_directory(folders, monkeypatch):
  _, data = folders
  monkeypatch.setenv(data_dir.ENV, str(data))
  assert [p.id for p in P.load_problems("dice/tiny.json")] == [p.id for p in P.load_bundled("tiny")]
  train, heldout = P.load_problems("dice/tiny.json?split=train"), P.load_problems("dice/tiny.json?split=heldout")
  assert len(train) + len(heldout) == 6 and not {p.id for p in train} & {p.id for p in heldout}
  P.check_source("dice/tiny.json?split=train")  # what config validation runs


def test_a_path_in_the_working_directory_wins(folders, monkeypatch):
  work, data = folders
  monkeypatch.setenv(data_dir.ENV, str(data))
  (work / "dice").mkdir()
  (work / "dice" / "tiny.json").write_text(json.dumps(json.loads((data / "dice" / "tiny.json").read_text())[:2]))
  assert len(P.load_problems("dice/tiny.json")) == 2


def test_a_missing_file_is_one_error_naming_the_path_places_and_setting(folders, monkeypatch):
  work, data = folders
  with pytest.raises(P.ProblemLoadError) as unset:
    P.load_problems("dice/absent.json?split=train")
  message = str(unset.value)
  assert message.startswith("no such file or directory: 'dice/absent.json' (not in the working directory")
  assert str(work) in message and "no data directory is set" in message and "$DICE_DATA_DIR" in message
  assert "Getting real data" in message
  monkeypatch.setenv(data_dir.ENV, str(data))
  with pytest.raises(P.ProblemLoadError) as missing:
    P.check_source("dice/absent.json")
  assert f"nor in the data directory {data}, $DICE_DATA_DIR" in str(missing.value)


def test_dice_train_config_names_the_key_the_path_and_the_setting(folders, monkeypatch):
  from dice_jax.cli import train as train_cli  # pylint: disable=import-outside-toplevel

  _, data = folders
  monkeypatch.setenv(data_dir.ENV, str(data))
  cfg = train_cli.load(None, ["data.phase1_files=[dice/tiny.json?split=train]"])
  assert cfg.data.phase1_files == ("dice/tiny.json?split=train",)
  with pytest.raises(ConfigError) as error:
    train_cli.load(None, ["data.phase2_files=[dice/end_to_end.json]"])
  message = str(error.value)
  assert message.startswith("data.phase2_files[0]: no such file or directory: 'dice/end_to_end.json'")
  assert "$DICE_DATA_DIR" in message and str(data) in message and message.count("no such file") == 1
