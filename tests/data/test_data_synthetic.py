"""Synthetic problems: specs, the deterministic and disjoint splits (sft, rl, heldout, unseen_op) with
every held-out op and adjacent op pair taught in sft, the sizes the learning experiment needs,
scaffolds that assemble to the known-good file byte for byte, the reward path's extraction of the
SFT targets, and the loader hooks (`synthetic:` specs and `PATH?split=` everywhere a problem path goes)."""

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
from dice_jax.data.synthetic import families, render, splits
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
  unseen = P.load_problems("synthetic:all?split=unseen_op")
  assert len(train) + len(heldout) + len(unseen) == len(P.load_problems(ALL)) and train and heldout and unseen
  sft, rl = P.load_problems("synthetic:all?split=sft"), P.load_problems("synthetic:all?split=rl")
  assert sorted(p.id for p in sft + rl) == sorted(p.id for p in train)
  two = P.load_problems("synthetic:reduction+activation?split=train")
  assert {p.id.split("_")[1] for p in two} == {"reduction", "activation"}
  assert [p.id for p in P.load_problems("synthetic:all?split=heldout&limit=5")] == [p.id for p in heldout[:5]]
  assert all(p.level == (1 if p.id.split("_")[1] in ("activation", "reduction") else 2) for p in train)


def test_sizes_of_the_learning_experiment_selection():
  """Every element-wise chain of length 2 and 3, LONG_CHAINS of length 4; the experiment's families
  (elementwise + activation + bias_act) give ~850 SFT, ~550 RL-only and 128 held-out problems."""
  chains = [p.ops for p in synthetic.family_params("elementwise")]
  assert sum(len(c) == 2 for c in chains) == 42 and sum(len(c) == 3 for c in chains) == 426
  assert sum(len(c) == 4 for c in chains) == families.LONG_CHAINS
  counts = {split: len(P.load_problems(f"synthetic:elementwise+activation+bias_act?split={split}"))
            for split in ("sft", "rl", "heldout", "unseen_op")}
  assert counts == {"sft": 850, "rl": 548, "heldout": 128, "unseen_op": 12}


@pytest.mark.parametrize("spec, message", [
    ("synthetic:all", "split must be given"),
    ("synthetic:all?split=test", "split must be given"),
    ("synthetic:nope?split=train", "unknown family 'nope'"),
    ("synthetic:all?split=train&limit=0", "limit must be a positive integer"),
    ("synthetic:all?split=train&limit=x", "limit must be a positive integer"),
    ("synthetic:all?split=train&split=heldout", "bad or repeated option"),
    ("synthetic:all?split=train&seed=-3", "seed must be a non-negative integer"),
    ("synthetic:all?split=train&shuffle=3", "bad or repeated option"),
])
def test_bad_specs_say_what_is_accepted(spec, message):
  with pytest.raises(P.ProblemLoadError, match=message):
    P.load_problems(spec)
  with pytest.raises(P.ProblemLoadError, match=message):
    P.check_source(spec)


def test_split_is_deterministic_across_processes():
  """The split and order come from sha256 of the seed and parameters, not from Python's salted hash()."""
  code = ("import json; from dice_jax.data import synthetic as S; "
          "print(json.dumps([(r['id'], r['split']) for r in S.records('synthetic:all?split=all')]))")
  runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
  here = [[r["id"], r["split"]] for r in synthetic.records(ALL)]
  assert json.loads(runs[0]) == json.loads(runs[1]) == here


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_splits_are_disjoint_and_every_heldout_part_is_taught(seed):
  """Disjoint splits; a held-out problem's key is in no other split; each of its ops and adjacent op
  pairs (a bias pair's variant and activation) occurs in the sft split; the unseen-op split's ops
  occur in no training problem of any family, so it is reported apart."""
  every = [p for f in families.FAMILIES for p in synthetic.family_params(f, seed)]
  by_split = {s: [p for p in every if p.split == s] for s in splits.SPLITS}
  assert sum(map(len, by_split.values())) == len(every) == len({p.problem_id for p in every})
  keys = {s: {(p.family, p.key) for p in ps} for s, ps in by_split.items()}
  for a in splits.SPLITS:
    for b in splits.SPLITS:
      assert a == b or not keys[a] & keys[b], (a, b)
  sft = by_split["sft"]
  sft_ops = {op for p in sft for op in p.ops}
  sft_pairs = set().union(*(splits.adjacent_pairs(p) for p in sft))
  for p in by_split["heldout"]:
    assert p.novelty == "combination" and p.family in ("elementwise", "bias_act")
    if p.family == "elementwise":
      assert set(p.ops) <= sft_ops and splits.adjacent_pairs(p) <= sft_pairs, p.key
    else:
      variant, act = p.ops
      assert any(q.ops[0] == variant for q in sft if q.family == "bias_act"), p.key
      assert any(q.ops[1] == act for q in sft if q.family == "bias_act"), p.key
  assert len(by_split["heldout"]) == sum(splits.HELDOUT.values())
  training = by_split["sft"] + by_split["rl"]
  seen_text = "\n".join(render.reference(p) + render.candidate(p) for p in training)
  for name in families.HELDOUT_ACTIVATIONS:  # never seen, in any family
    assert f"F.{name}(" not in seen_text
    assert families.ACTIVATIONS[name][1] not in seen_text
  for kind in families.HELDOUT_REDUCTIONS:
    assert KINDS[kind][0] not in seen_text
  assert all(p.novelty == "op" for p in by_split["unseen_op"]) and all(p.novelty is None for p in training)


def test_the_seed_draws_another_dataset_of_the_same_sizes():
  zero = {p.problem_id: p.split for p in synthetic.family_params("elementwise", 0)}
  one = {p.problem_id: p.split for p in synthetic.family_params("elementwise", 1)}
  assert zero != one
  for split in ("heldout", "rl"):  # held out: the same number; rl: each key's draw, about RL_SHARE of training
    n0, n1 = (sum(v == split for v in d.values()) for d in (zero, one))
    assert n0 == n1 if split == "heldout" else abs(n0 - n1) < 0.05 * len(zero), split
  assert [r["id"] for r in synthetic.records("synthetic:bias_act?split=heldout&seed=1")] != [
      r["id"] for r in synthetic.records("synthetic:bias_act?split=heldout")]


def test_every_family_has_its_splits(records):
  for family in families.FAMILIES:
    found = {r["split"] for r in records.values() if r["id"].startswith(f"syn_{family}_")}
    expected = {"sft", "rl"} | ({"heldout"} if family in splits.HELDOUT else set()) | (
        {"unseen_op"} if family != "elementwise" else set())
    assert found == expected, family


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
