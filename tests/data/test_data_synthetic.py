"""Synthetic problems: specs, the deterministic and disjoint train/held-out split, scaffolds that
assemble to the known-good file byte for byte, the reward path's extraction of the SFT targets, and
the loader hooks (`synthetic:` specs and `PATH?split=` everywhere a problem path goes)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest

from dice_jax.config import ConfigError, load_config
from dice_jax.data import extract, synthetic
from dice_jax.data import problems as P
from dice_jax.data.synthetic import families, render
from dice_jax.data.synthetic.reductions import KINDS
from dice_jax.rl.config import RLConfig

ALL = "synthetic:all?split=all"
INFILLING = "data/dice/kernel_infilling_evaluation.json"


@pytest.fixture(scope="module")
def every():
  return P.load_problems(ALL)


@pytest.fixture(scope="module")
def records():
  return {r["id"]: r for r in synthetic.records(ALL)}


def test_specs_select_families_splits_and_limits():
  train = P.load_problems("synthetic:all?split=train")
  heldout = P.load_problems("synthetic:all?split=heldout")
  assert len(train) + len(heldout) == len(P.load_problems(ALL)) and train and heldout
  two = P.load_problems("synthetic:reduction+activation?split=train")
  assert {p.id.split("_")[1] for p in two} == {"reduction", "activation"}
  assert [p.id for p in P.load_problems("synthetic:all?split=heldout&limit=5")] == [p.id for p in heldout[:5]]
  assert all(p.level == (1 if p.id.split("_")[1] in ("activation", "reduction") else 2) for p in train)


@pytest.mark.parametrize("spec, message", [
    ("synthetic:all", "split must be given"),
    ("synthetic:all?split=test", "split must be given"),
    ("synthetic:nope?split=train", "unknown family 'nope'"),
    ("synthetic:all?split=train&limit=0", "limit must be a positive integer"),
    ("synthetic:all?split=train&limit=x", "limit must be a positive integer"),
    ("synthetic:all?split=train&split=heldout", "bad or repeated option"),
    ("synthetic:all?split=train&seed=3", "bad or repeated option"),
])
def test_bad_specs_say_what_is_accepted(spec, message):
  with pytest.raises(P.ProblemLoadError, match=message):
    P.load_problems(spec)
  with pytest.raises(P.ProblemLoadError, match=message):
    P.check_source(spec)


def test_split_is_deterministic_across_processes():
  """The split and order come from sha256 of parameters, not from Python's salted hash()."""
  code = ("import json; from dice_jax.data import synthetic as S; "
          "print(json.dumps([(r['id'], r['split']) for r in S.records('synthetic:all?split=all')]))")
  runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
  here = [[r["id"], r["split"]] for r in synthetic.records(ALL)]
  assert json.loads(runs[0]) == json.loads(runs[1]) == here


def test_split_is_disjoint_and_holds_out_ops_and_combinations(records):
  train = [r for r in records.values() if r["split"] == "train"]
  heldout = [r for r in records.values() if r["split"] == "heldout"]
  params = {p.problem_id: p for f in families.FAMILIES for p in synthetic.family_params(f)}
  train_keys = {(params[r["id"]].family, params[r["id"]].key) for r in train}
  assert not train_keys & {(params[r["id"]].family, params[r["id"]].key) for r in heldout}
  seen_text = "\n".join(r["pytorch_code"] + r["cuda_code"] for r in train)
  for name in families.HELDOUT_ACTIVATIONS:  # never seen, in any family
    assert f"F.{name}(" not in seen_text
    assert families.ACTIVATIONS[name][1] not in seen_text
  for kind in families.HELDOUT_REDUCTIONS:
    assert KINDS[kind][0] not in seen_text
  # A held-out combination's parts all occur in training; only the combination is new.
  train_ops = {op for r in train if params[r["id"]].family == "elementwise" for op in params[r["id"]].key.split("-")}
  train_bias = {tuple(params[r["id"]].key.split("-", 1)) for r in train if params[r["id"]].family == "bias_act"}
  for r in heldout:
    p = params[r["id"]]
    assert p.novelty in ("op", "combination") and r["novelty"] == p.novelty
    if p.novelty == "combination" and p.family == "elementwise":
      assert set(p.key.split("-")) <= train_ops
    if p.novelty == "combination" and p.family == "bias_act":
      variant, act = p.key.split("-", 1)
      assert any(v == variant for v, _ in train_bias) and any(a == act for _, a in train_bias)


def test_every_family_has_both_splits(records):
  for family in families.FAMILIES:
    splits = {r["split"] for r in records.values() if r["id"].startswith(f"syn_{family}_")}
    assert splits == {"train", "heldout"}, family


def test_scaffolds_assemble_to_the_known_good_file_byte_for_byte(every, records):
  params = {p.problem_id: p for f in families.FAMILIES for p in synthetic.family_params(f)}
  for p in every:
    whole = render.candidate(params[p.id])
    assert p.prefix + p.middle + p.suffix == whole == records[p.id]["cuda_code"], p.id
    assert extract.assemble(p.prefix, p.middle, p.suffix) == whole  # the graded file is the same bytes
    assert p.middle.startswith('source = """\n') and p.middle.endswith('\n"""') and p.middle.count('"""') == 2
    assert p.prefix.endswith("load_inline\n\n") and "__global__" not in p.prefix + p.suffix
    assert "load_inline(" in p.suffix and "class ModelNew" in p.suffix


def test_files_parse_and_match_their_scaffold(every):
  for p in every:
    P.check_reference(p.reference_source, p.id)
    ref, cand = ast.parse(p.reference_source), ast.parse(p.known_good)
    assert _forward_args(ref, "Model") == _forward_args(cand, "ModelNew"), p.id
    declared = re.search(r'cpp_src = "(torch::Tensor f\([^)]*\));"', p.suffix).group(1)
    assert declared + " {" in p.middle, p.id  # the host function the suffix declares is defined
    assert re.search(r"k<<<[^>]+>>>\(", p.middle), p.id  # and it launches the kernel


def _forward_args(tree: ast.Module, cls: str) -> list[str]:
  node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
  forward = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
  return [a.arg for a in forward.args.args]


def test_sft_targets_survive_the_reward_path(every):
  """What SFT teaches (a fenced middle / a fenced file) is extracted and graded as the known-good file."""
  for p in every:
    one = extract.extract_candidate(f"```python\n{p.middle}\n```", phase=1, prefix=p.prefix, suffix=p.suffix)
    two = extract.extract_candidate(f"```python\n{p.known_good}\n```", phase=2)
    assert one.candidate == two.candidate == p.known_good, p.id


def test_answers_are_short_for_a_byte_level_model(every):
  assert max(len(p.middle) for p in every) < 1100
  assert max(len(p.known_good) for p in every) < 1400
  assert max(len(p.reference_source) for p in every) < 400


def test_config_and_cli_style_paths_select_synthetic_problems():
  cfg = load_config(RLConfig, None, ["data.phase1_files=[synthetic:all?split=train&limit=4, bundled:tiny]",
                                     "data.phase2_files=[synthetic:all?split=train]"])
  assert cfg.data.phase1_files == ("synthetic:all?split=train&limit=4", "bundled:tiny")
  with pytest.raises(ConfigError, match=r"data.phase1_files\[0\]: 'synthetic:all': split must be given"):
    load_config(RLConfig, None, ["data.phase1_files=[synthetic:all]"])
  with pytest.raises(ConfigError, match=r"phase2_files\[0\]: no such file or directory: '/no/such.json'"):
    load_config(RLConfig, None, ["data.phase2_files=[/no/such.json?split=train]"])


def test_file_split_is_deterministic_and_disjoint(shared_dir, tmp_path):
  path = shared_dir / INFILLING
  whole = P.load_problems(path)
  train = P.load_problems(f"{path}?split=train")
  heldout = P.load_problems(f"{path}?split=heldout")
  assert {p.id for p in train}.isdisjoint(p.id for p in heldout)
  assert sorted(p.id for p in train + heldout) == sorted(p.id for p in whole)
  assert 20 <= len(heldout) <= 45  # about a third of 99
  assert [p.id for p in P.load_problems(f"{path}?split=train")] == [p.id for p in train]
  quarter = P.load_problems(f"{path}?split=heldout&heldout_fraction=0.25")
  assert {p.id for p in quarter} <= {p.id for p in heldout}  # one hash threshold: sides nest
  # An item's side depends on its id alone: a file holding a subset splits it the same way.
  subset = tmp_path / "subset.json"
  subset.write_text(json.dumps(json.loads(path.read_text())[:30]))
  assert {p.id for p in P.load_problems(f"{subset}?split=heldout")} == {p.id for p in heldout} & {
      p.id for p in P.load_problems(subset)}


@pytest.mark.parametrize("query, message", [
    ("split=both", "split must be one of train, heldout"),
    ("split=train&heldout_fraction=1.5", "heldout_fraction must be a number in"),
    ("split=train&heldout_fraction=x", "heldout_fraction must be a number in"),
    ("split=train&seed=1", "bad or repeated option 'seed=1'"),
])
def test_bad_file_split_queries(shared_dir, query, message):
  with pytest.raises(P.ProblemLoadError, match=message):
    P.load_problems(f"{shared_dir / INFILLING}?{query}")


def test_a_path_that_really_contains_a_question_mark_is_a_file(tmp_path, shared_dir):
  odd = tmp_path / "odd?split=train.json"
  odd.write_text((shared_dir / INFILLING).read_text())
  assert len(P.load_problems(odd)) == 99


def test_split_candidate_needs_exactly_one_source_string(every):
  good = every[0].known_good
  with pytest.raises(ValueError, match="found 0"):
    render.split_candidate(good.replace('source = """', 'src = """'))
  with pytest.raises(ValueError, match="found 2"):
    render.split_candidate(good + "\n" + every[0].middle + "\n")
