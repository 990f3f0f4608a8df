"""`dice rewards check` against a real loopback verifier (compile-only here): a known-good answer, one
that does not compile and one with no code go through the training reward path (extraction and
scaffold assembly, the verifier client, the shaper with a custom component) and come back as rows;
bad input files are clear errors before any verifier starts."""

from __future__ import annotations

import json
import pathlib

import pytest

from dice_jax.cli import main as cli_main
from dice_jax.cli.exit_codes import Exit
from dice_jax.data import problems as problems_lib

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def relu():
  return next(p for p in problems_lib.load_bundled("tiny") if p.id == "tiny_relu")


def _write(path: pathlib.Path, records) -> pathlib.Path:
  path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
  return path


@pytest.mark.slow
def test_known_good_broken_and_code_less_completions(tmp_path, relu, monkeypatch, capsys):
  monkeypatch.syspath_prepend(str(HERE))  # rl_test_rewards, the custom component
  good = f"```python\n{relu.middle}\n```"
  completions = _write(tmp_path / "c.jsonl", [
      {"problem_id": "tiny_relu", "phase": 1, "completion": good},
      {"problem_id": "tiny_relu", "phase": 1, "completion": good.replace("__global__", "__global__ bad", 1)},
      {"problem_id": "tiny_relu", "phase": 1, "completion": "Here is my answer, in words only."}])
  out = tmp_path / "rows.json"
  code = cli_main.main(["rewards", "check", "--problems", "bundled:tiny", "--completions", str(completions),
                        "--verifier", "local", "--json", str(out),
                        "rewards.custom.letters.fn=rl_test_rewards:letter_fraction"])
  assert code == Exit.OK
  rows = json.loads(out.read_text())
  assert [r["outcome"] for r in rows] == ["NO_GPU", "COMPILE_ERROR", "FORMAT"]  # the auto preset: compile_only
  assert [r["components"]["compile"] for r in rows] == [1.0, 0.0, 0.0]
  assert [r["components"]["format"] for r in rows] == [1.0, 1.0, 0.0]
  assert rows[1]["stage"] == "COMPILE" and "error" in rows[1]["message"]
  assert rows[2]["message"].startswith("format:")
  for r in rows:
    assert set(r) >= {"problem_id", "outcome", "message", "components", "reward"} and r["problem_id"] == "tiny_relu"
    assert 0 < r["components"]["letters"] < 1
    expected = 0.2 * r["components"]["format"] + r["components"]["compile"] + r["components"]["letters"]
    assert r["reward"] == pytest.approx(expected, abs=1e-5)
  printed = capsys.readouterr().out
  assert "COMPILE_ERROR" in printed and "letters" in printed and "no GPU (compile-only)" in printed


@pytest.mark.parametrize("lines, error", [
    (['{"problem_id": "tiny_relu", "phase": 1}'], "missing ['completion']"),
    (['{"problem_id": "nope", "phase": 2, "completion": "x"}'], "no problem 'nope'"),
    (['{"problem_id": "tiny_relu", "phase": 3, "completion": "x"}'], "phase must be 1 or 2"),
    (['{"problem_id": "tiny_relu", "phase": 1, "completion": 5}'], "completion must be a string"),
    (['{"problem_id": "tiny_relu", "phase": 1, "completion": "x"', ''], "line 1: invalid JSON"),
    (['[1, 2]'], "expected an object"),
    ([''], "no completions"),
])
def test_bad_completion_files_are_clear_errors(tmp_path, capsys, lines, error):
  path = _write(tmp_path / "c.jsonl", lines)
  code = cli_main.main(["rewards", "check", "--problems", "bundled:tiny", "--completions", str(path)])
  assert code == Exit.USAGE
  assert error in capsys.readouterr().err


def test_unreadable_inputs_are_clear_errors(tmp_path, capsys):
  binary = tmp_path / "c.jsonl"
  binary.write_bytes(b'{"problem_id": "\xff"}\n')
  assert cli_main.main(["rewards", "check", "--problems", "bundled:tiny", "--completions", str(binary)]) == 2
  assert "not UTF-8" in capsys.readouterr().err
  assert cli_main.main(["rewards", "check", "--problems", "bundled:tiny", "--completions",
                        str(tmp_path / "missing.jsonl")]) == 2
  assert "No such file" in capsys.readouterr().err
  good = _write(tmp_path / "ok.jsonl", [{"problem_id": "tiny_relu", "phase": 2, "completion": "x"}])
  assert cli_main.main(["rewards", "check", "--problems", str(tmp_path / "nope.json"), "--completions",
                        str(good)]) == 2
  assert "no such file" in capsys.readouterr().err
  assert cli_main.main(["rewards", "check", "--problems", "bundled:tiny", "--completions", str(good),
                        "rewards.preset=best"]) == 2
  assert "preset" in capsys.readouterr().err
