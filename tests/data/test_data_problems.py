"""Problem loaders on DICE's real files, KernelBench directories, JSONL, the bundled set, bad input."""

import json
import pathlib

import pytest

from dice_jax.data import problems as P

INFILLING = "data/dice/kernel_infilling_evaluation.json"
END_TO_END = "data/dice/end_to_end_kernel_generation_4000.json"

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""


def test_dice_infilling_file_loads_99_phase1_items(shared_dir):
  problems = P.load_problems(shared_dir / INFILLING)
  assert len(problems) == 99
  assert len({p.id for p in problems}) == 99
  assert all(p.has_scaffold and p.level is None for p in problems)
  raw = json.loads((shared_dir / INFILLING).read_text())
  by_id = {str(r["id"]): r for r in raw}
  for p in problems:
    assert p.known_good == by_id[p.id]["cuda_code"]
    assert p.reference_source == by_id[p.id]["pytorch_code"]
    assert p.middle.startswith('source = """')


def test_dice_end_to_end_file_loads_4000_reference_only_items(shared_dir):
  problems = P.load_problems(shared_dir / END_TO_END)
  assert len(problems) == 4000
  assert not any(p.has_scaffold for p in problems)
  assert problems[0].id == "0" and problems[0].level == 0
  assert {p.level for p in problems} == {0, 1, 2, 3}
  assert "class Model" in problems[-1].reference_source


def test_bundled_tiny_set_has_known_good_splits():
  problems = P.load_problems("bundled:tiny")
  assert len(problems) >= 5
  for p in problems:
    assert p.id.startswith("tiny_") and p.level == 1 and p.has_scaffold
    assert p.middle.startswith('source = """') and p.middle.endswith('"""')
    assert "__global__" in p.middle and "load_inline" in p.suffix and "class ModelNew" in p.suffix
    compile(p.known_good, p.id, "exec")  # the assembled candidate is valid Python
    compile(p.reference_source, p.id, "exec")


def test_unknown_bundled_set_lists_the_available_ones():
  with pytest.raises(P.ProblemLoadError, match=r"bundled:nope.*available: .*tiny"):
    P.load_problems("bundled:nope")
  with pytest.raises(P.ProblemLoadError, match="letters, digits"):
    P.load_bundled("../tiny")


def _kernelbench_tree(root: pathlib.Path) -> None:
  (root / "level1").mkdir(parents=True)
  (root / "level2").mkdir()
  (root / "level1" / "10_Double.py").write_text(REF)
  (root / "level1" / "2_Double.py").write_text(REF)
  (root / "level2" / "1_Fused.py").write_text(REF)
  (root / "notes").mkdir()  # ignored: not levelN


def test_kernelbench_directory(tmp_path):
  _kernelbench_tree(tmp_path)
  problems = P.load_problems(tmp_path)
  assert [(p.id, p.level) for p in problems] == [("2_Double", 1), ("10_Double", 1), ("1_Fused", 2)]
  assert problems[0].reference_source == REF and not problems[0].has_scaffold


def test_kernelbench_directory_errors(tmp_path):
  with pytest.raises(P.ProblemLoadError, match="no levelN/"):
    P.load_problems(tmp_path)
  (tmp_path / "level1").mkdir()
  with pytest.raises(P.ProblemLoadError, match="contain no .py files"):
    P.load_problems(tmp_path)
  (tmp_path / "level1" / "1_Bad.py").write_text("import torch\nclass Model: pass\n")
  with pytest.raises(P.ProblemLoadError,
                     match=r"1_Bad.py: reference must define .* missing get_inputs, get_init_inputs"):
    P.load_problems(tmp_path)
  (tmp_path / "level1" / "1_Bad.py").write_bytes(b"\xff\xfe not utf-8")
  with pytest.raises(P.ProblemLoadError, match="not UTF-8"):
    P.load_problems(tmp_path)


def test_jsonl_mixes_both_kinds(tmp_path, shared_dir):
  raw = json.loads((shared_dir / INFILLING).read_text())[:2]
  end_to_end = {"idx": 7, "level": "2", "pytorch_code": REF}
  lines = [json.dumps(raw[0]), "", json.dumps(end_to_end), json.dumps(raw[1])]
  path = tmp_path / "mix.jsonl"
  path.write_text("\n".join(lines) + "\n")
  problems = P.load_problems(path)
  assert [p.has_scaffold for p in problems] == [True, False, True]
  assert problems[1].id == "7" and problems[1].level == 2


@pytest.mark.parametrize("content,message", [
    ("{not json", r"invalid JSON at line 1"),
    ('{"id": 1}', r"expected a list of problem objects, got dict"),
    ("[]", r"contains no problems"),
    ('[{"id": 1}]', r"item 0 \(id 1\): missing field 'pytorch_code'"),
    ('[{"pytorch_code": "x"}]', r"item 0: missing field 'id' \(or 'idx'\)"),
    ('[42]', r"item 0: expected a JSON object, got int"),
    ('[{"idx": 3, "pytorch_code": 5}]', r"\(id 3\): field 'pytorch_code' must be a string, got int"),
    ('[{"idx": 3, "pytorch_code": "   "}]', r"\(id 3\): field 'pytorch_code' is empty"),
    ('[{"idx": 3, "pytorch_code": "def f(:"}]', r"\(id 3\): reference does not parse"),
    ('[{"idx": 3, "level": "two", "pytorch_code": REF}]', r"field 'level' must be an integer"),
    ('[{"idx": 3, "pytorch_code": REF}, {"idx": 3, "pytorch_code": REF}]', r"duplicate problem id '3'"),
    ('[{"id": 3, "pytorch_code": REF, "prefix": "a", "middle": "b"}]', r"a phase-1 item needs all three"),
    ('[{"id": 3, "pytorch_code": REF, "prefix": "a", "middle": "b", "suffix": "c", "cuda_code": "abd"}]',
     r"prefix \+ middle \+ suffix != cuda_code"),
])
def test_bad_json_files_name_the_file_and_item(tmp_path, content, message):
  path = tmp_path / "bad.json"
  path.write_text(content.replace("REF", json.dumps(REF)))
  with pytest.raises(P.ProblemLoadError, match=message) as info:
    P.load_problems(path)
  assert str(path) in str(info.value)


def test_missing_and_unknown_paths(tmp_path):
  with pytest.raises(P.ProblemLoadError, match="no such file or directory"):
    P.load_problems(tmp_path / "missing.json")
  (tmp_path / "problems.csv").write_text("a,b\n")
  with pytest.raises(P.ProblemLoadError, match="unknown problem file type '.csv'"):
    P.load_problems(tmp_path / "problems.csv")
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"idx": 1, "pytorch_code": REF}) + "\n{oops\n")
  with pytest.raises(P.ProblemLoadError, match=r"bad.jsonl line 2: invalid JSON"):
    P.load_problems(bad)
