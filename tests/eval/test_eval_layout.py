"""The generations layout, candidate building (infilling reassembly) and the resumable verdict store."""

import json
import pathlib

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data.problems import load_problems
from dice_jax.eval import generations as g
from dice_jax.eval.store import VerdictStore, item_key


@pytest.fixture(scope="module")
def tiny():
  return load_problems("bundled:tiny")[:2]


def test_layout_reads_py_and_txt_samples_in_index_order(tmp_path, tiny):
  a, b = tiny
  g.write_generation(tmp_path, a.id, 10, "ten", raw=False)
  g.write_generation(tmp_path, a.id, 2, "two", raw=True)
  g.write_generation(tmp_path, b.id, 0, "zero", raw=False)
  gens = g.read_generations(tmp_path, tiny)
  assert [(x.sample, x.raw, x.text) for x in gens[a.id]] == [(2, True, "two"), (10, False, "ten")]
  assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no temporaries


@pytest.mark.parametrize("name,message", [("ModelNew.py", "expected files named"),
                                          ("01.py", "expected files named"),
                                          ("-1.txt", "expected files named")])
def test_layout_refuses_badly_named_files(tmp_path, tiny, name, message):
  (tmp_path / tiny[0].id).mkdir()
  (tmp_path / tiny[0].id / name).write_text("x")
  with pytest.raises(g.GenerationsError, match=message):
    g.read_generations(tmp_path, tiny, allow_missing=True)


def test_layout_errors_name_the_problem(tmp_path, tiny):
  a, b = tiny
  g.write_generation(tmp_path, a.id, 0, "x", raw=False)
  with pytest.raises(g.GenerationsError, match=r"1 of 2 problems have no samples.*--allow-missing"):
    g.read_generations(tmp_path, tiny)
  assert list(g.read_generations(tmp_path, tiny, allow_missing=True)) == [a.id]
  g.write_generation(tmp_path, a.id, 0, "y", raw=True)
  with pytest.raises(g.GenerationsError, match="both 0.py and 0.txt"):
    g.read_generations(tmp_path, tiny, allow_missing=True)
  (tmp_path / a.id / "0.txt").unlink()
  (tmp_path / "not_a_problem").mkdir()
  with pytest.raises(g.GenerationsError, match="name no problem.*not_a_problem"):
    g.read_generations(tmp_path, tiny, allow_missing=True)
  (tmp_path / "not_a_problem").rmdir()
  (tmp_path / a.id / "0.py").write_bytes(b"\xff\xfe bad")
  with pytest.raises(g.GenerationsError, match="not UTF-8"):
    g.read_generations(tmp_path, tiny, allow_missing=True)
  with pytest.raises(g.GenerationsError, match="no such directory") as error:
    g.read_generations(tmp_path / "absent", tiny)
  # Every layout error draws the layout with this problem set's own folder names.
  assert f"{tmp_path}/absent/tiny_relu/0.py " in str(error.value)
  assert f"{tmp_path}/absent/tiny_scaled_add/0.py" in str(error.value) and "19_ReLU" in str(error.value)
  with pytest.raises(g.GenerationsError, match="cannot name a folder"):
    g.folder_name("../etc")


def test_loose_files_are_pointed_at_the_folder_layout(tmp_path, tiny):
  (tmp_path / f"{tiny[0].id}.py").write_text("x")  # the usual first try: one file per problem
  with pytest.raises(g.GenerationsError) as error:
    g.read_generations(tmp_path, tiny)
  text = str(error.value)
  assert f"files directly in {tmp_path}, e.g. ['{tiny[0].id}.py'], belong in a folder per problem" in text
  assert f"  {tmp_path}/{tiny[0].id}/0.py " in text and "level1/19_ReLU.py -> 19_ReLU" in text


def test_modes_and_candidates(tiny):
  a = tiny[0]
  assert g.resolve_mode(tiny, "auto") == g.INFILLING
  raw = g.Generation(a.id, 0, pathlib.Path("0.txt"), "Here:\n```python\nprint(1)\n```")
  assert g.candidate(a, raw, g.END_TO_END).failure.startswith("format:")  # no ModelNew in it
  middle_only = g.Generation(a.id, 0, pathlib.Path("0.py"), a.middle)
  assert g.candidate(a, middle_only, g.INFILLING).candidate == a.known_good  # scaffold around it
  assert g.candidate(a, middle_only, g.END_TO_END).candidate == a.middle  # .py graded as written
  rewritten = g.Generation(a.id, 0, pathlib.Path("0.txt"),
                           f"```python\n{a.middle}\nclass ModelNew: pass  # torch fallback\n```")
  assert g.candidate(a, rewritten, g.INFILLING).candidate == a.known_good  # scaffold enforced


def test_dice_infilling_items_reassemble_to_their_cuda_code(shared_dir):
  """Reference generations in infilling mode grade exactly the published candidate, all 99."""
  problems = load_problems(shared_dir / "data/dice/kernel_infilling_evaluation.json")
  assert len(problems) == 99
  for p in problems:
    gen = g.Generation(p.id, 0, pathlib.Path("0.py"), p.known_good)
    assert g.candidate(p, gen, g.INFILLING).candidate == p.known_good, p.id


def test_reference_generations_need_known_good_candidates(tmp_path, shared_dir):
  e2e = load_problems(shared_dir / "data/dice/end_to_end_kernel_generation_4000.json")[:3]
  with pytest.raises(g.GenerationsError, match="no known-good candidate"):
    g.write_reference_generations(tmp_path, e2e)
  with pytest.raises(ValueError, match="infilling mode needs phase-1 items"):
    g.resolve_mode(e2e, g.INFILLING)
  assert g.resolve_mode(e2e, "auto") == g.END_TO_END


def _verdict(outcome, rid="r"):
  return pb.Verdict(request_id=rid, outcome=outcome, stage=pb.STAGE_COMPILE, message="m")


def test_store_persists_skips_infra_and_survives_a_cut_off_line(tmp_path):
  path = tmp_path / "verdicts.jsonl"
  opts = pb.VerifyOptions()
  k1, k2 = item_key("ref", "cand1", opts), item_key("ref", "cand2", opts)
  assert k1 != item_key("ref", "cand1", pb.VerifyOptions(precision=pb.FP16))
  with VerdictStore(path) as store:
    assert store.put(k1, _verdict(pb.COMPILE_ERROR), problem_id="p", sample=0)
    assert not store.put(k1, _verdict(pb.OK))                 # first verdict wins
    assert not store.put(k2, _verdict(pb.INFRA_ERROR))        # never stored: a rerun retries
  with open(path, "a", encoding="utf-8") as f:                # a crash mid-write
    f.write('{"key": "abc", "verd')
  with VerdictStore(path) as store:
    assert len(store) == 1 and k2 not in store
    assert store.get(k1).outcome == pb.COMPILE_ERROR
    assert store.put(k2, _verdict(pb.NO_GPU))
  lines = path.read_text().splitlines()
  assert [json.loads(line)["key"] for line in lines] == [k1, k2]
  path.write_text("not json\n")
  with pytest.raises(ValueError, match="line 1 is not a verdict record"):
    VerdictStore(path)
