"""`dice eval` against a real loopback verifier (compile-only here: NO_GPU verdicts).

One real nvcc compile in this file (eval_testlib.LIGHT_RELU, shared through the session's compile
cache); every other candidate is refused by static checks or never sent (format failures).
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from dice.verifier.v1 import verifier_pb2 as pb
from dice_jax.data.problems import load_problems
from dice_jax.eval import generations as gen_lib
from dice_jax.eval import pipeline
from dice_jax.eval.store import VerdictStore
from dice_jax.verifier import connect as connect_lib
from dice_jax.verifier.local import free_port
from eval_testlib import LIGHT_RELU, run_cli, tiny_model_dir, verifier_target  # noqa: F401 (fixtures)

PNGS = ("speedup_distribution.png", "fast_p.png", "levels.png")
NO_LOAD_INLINE = "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


@pytest.fixture(scope="module")
def tiny():
  return load_problems("bundled:tiny")[:2]


def test_generations_layout_end_to_end_with_dedup_and_resume(tmp_path, tiny, verifier_target, capsys):
  relu, add = tiny
  gens = tmp_path / "gens"
  gen_lib.write_generation(gens, relu.id, 0, LIGHT_RELU, raw=False)
  gen_lib.write_generation(gens, relu.id, 1, LIGHT_RELU, raw=False)   # a repeat: verified once
  gen_lib.write_generation(gens, relu.id, 2, NO_LOAD_INLINE, raw=False)
  gen_lib.write_generation(gens, relu.id, 3, "I cannot write CUDA.", raw=True)  # FORMAT: never sent
  gen_lib.write_generation(gens, add.id, 0, f"Sure:\n```python\n{NO_LOAD_INLINE}```\n", raw=True)
  out = tmp_path / "run"
  argv = ["--generations", gens, "--problems", "bundled:tiny", "--limit", 2, "--mode", "end-to-end",
          "--verifier", verifier_target, "--out", out]
  assert run_cli("eval", *argv) == 0
  printed = capsys.readouterr().out
  assert "3 candidate(s) verified now, 0 from earlier runs" in printed
  assert "NO_GPU" in printed and "n/a" in printed

  summary = json.loads((out / "summary.json").read_text())
  overall = summary["overall"]
  assert overall["outcomes"] == {"FORMAT": 1, "NO_GPU": 2, "REJECTED": 2}
  assert overall["compile_rate"] == pytest.approx((2 / 4 + 0) / 2)
  assert overall["correctness_available"] is False and overall["correct_rate"] is None
  assert summary["run"]["mode"] == "end-to-end" and "no GPU" in summary["run"]["verifier"]
  [where] = summary["run"]["measured_on"]  # from the verdicts themselves (all but the FORMAT one)
  assert where.startswith("no GPU (sm_90), nvcc ") and where.endswith(": 4 verdict(s)")
  record = json.loads((out / "problems" / f"{relu.id}.json").read_text())
  assert [s["outcome"] for s in record["samples"]] == ["NO_GPU", "NO_GPU", "REJECTED", "FORMAT"]
  assert record["samples"][0]["verdict"]["compile"]["kernel_names"] == ["relu_kernel"]
  assert "never calls load_inline" in record["samples"][2]["message"]
  assert len((out / "verdicts.jsonl").read_text().splitlines()) == 3
  assert "| overall | 2 | 5 | 25.0% | n/a |" in (out / "summary.md").read_text()
  for name in PNGS:
    assert (out / name).read_bytes()[:4] == b"\x89PNG"

  assert run_cli("eval", *argv) == 0  # a rerun asks the verifier nothing
  assert "0 candidate(s) verified now, 4 from earlier runs" in capsys.readouterr().out
  assert len((out / "verdicts.jsonl").read_text().splitlines()) == 3

  assert run_cli("eval", "--compare", out, out, "--out", tmp_path / "cmp") == 0
  assert "compiled (no correctness available)" in capsys.readouterr().out
  assert (tmp_path / "cmp" / "compare.md").is_file()


def test_interrupted_evaluation_resumes_without_verifying_anything_twice(tmp_path, tiny, verifier_target):
  gens = tmp_path / "gens"
  for p in tiny:
    for i in range(3):  # six distinct candidates, refused by static checks (no compile)
      gen_lib.write_generation(gens, p.id, i, NO_LOAD_INLINE + f"# {p.id} {i}\n", raw=False)
  out = tmp_path / "run"
  options = pb.VerifyOptions()

  def once(on_verdict=None):
    connection = connect_lib.connect(verifier_target)
    try:
      result = pipeline.run_eval(out, tiny, gen_lib.read_generations(gens, tiny), connection,
                                 mode=gen_lib.END_TO_END, options=options, run_info={},
                                 on_verdict=on_verdict, make_plots=False)
      return result, connection.client.stats().get("sent", 0)
    finally:
      connection.close()

  def interrupt(sample, verdict):
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    once(interrupt)
  with VerdictStore(out / "verdicts.jsonl") as store:
    stored = len(store)
  assert stored == 1  # the one verdict handled before the interruption is on disk

  result, sent = once()
  assert result.sent == sent == 6 - stored and result.from_store == stored
  assert result.summary["overall"]["outcomes"] == {"REJECTED": 6}
  result, sent = once()
  assert result.sent == sent == 0 and result.from_store == 6
  keys = [json.loads(line)["key"] for line in (out / "verdicts.jsonl").read_text().splitlines()]
  assert len(keys) == len(set(keys)) == 6


def test_unreachable_verifier_is_one_clear_error(tmp_path, capsys):
  rc = run_cli("eval", "--reference-generations", "--problems", "bundled:tiny", "--limit", 1,
               "--verifier", f"127.0.0.1:{free_port()}", "--connect-timeout", 0.5, "--out", tmp_path)
  assert rc == 4
  assert "cannot reach the verifier" in capsys.readouterr().err
  assert not (tmp_path / "summary.json").exists()


def test_help_draws_the_generations_layout():
  from dice_jax.cli import main  # pylint: disable=import-outside-toplevel
  sub = next(a for a in main.build_parser()._actions if a.dest == "command")  # pylint: disable=protected-access
  text = sub.choices["eval"].format_help()
  assert "gens/19_ReLU/0.py" in text and "gens/19_ReLU/1.txt" in text and "level1/19_ReLU.py -> 19_ReLU" in text
  assert sub.choices["eval"].get_default("verifier") == sub.choices["generate"].get_default("verifier") == "local"


def test_bad_inputs_are_usage_errors(tmp_path, capsys):
  assert run_cli("eval", "--generations", tmp_path / "nope", "--problems", "bundled:tiny",
                 "--verifier", "127.0.0.1:1", "--out", tmp_path / "o") == 2
  err = capsys.readouterr().err
  assert "no such directory" in err and f"{tmp_path}/nope/tiny_relu/0.py " in err  # the layout, drawn
  assert run_cli("eval", "--model", tmp_path, "--problems", tmp_path / "missing.json",
                 "--verifier", "127.0.0.1:1") == 2
  assert "no such file" in capsys.readouterr().err
  assert run_cli("eval", "--problems", "bundled:tiny", "--verifier", "127.0.0.1:1") == 2
  assert "say what to evaluate" in capsys.readouterr().err


def test_model_generations_are_saved_reused_and_pinned(tmp_path, tiny_model_dir, verifier_target, capsys):
  template = tmp_path / "short.yaml"
  template.write_text("user: 'Write the CUDA source for {problem_id}.'\nsystem: null\n")
  out = tmp_path / "run"
  argv = ["--model", tiny_model_dir, "--problems", "bundled:tiny", "--limit", 2, "--samples", 2,
          "--max-new-tokens", 16, "--batch-size", 4, "--template-infilling", template,
          "--verifier", verifier_target, "--out", out, "--no-plots"]
  assert run_cli("eval", *argv, "--max-new-tokens", 9000) == 2  # argparse: the last value wins
  assert "do not fit the model's context of 8192 tokens" in " ".join(capsys.readouterr().err.split())
  assert not (out / "generations" / "settings.json").exists()  # a refused run pins nothing
  assert run_cli("eval", *argv) == 0
  captured = capsys.readouterr()
  assert "generated 4 sample(s)" in captured.err
  assert sorted(p.name for p in (out / "generations").rglob("*.txt")) == ["0.txt", "0.txt", "1.txt", "1.txt"]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["overall"]["samples"] == 4 and summary["overall"]["samples_per_problem"] == 2
  assert "2 sample(s) per problem, temperature 1" in summary["run"]["sampling"]
  assert run_cli("eval", *argv) == 0
  assert "generated 0 sample(s)" in capsys.readouterr().err
  assert run_cli("eval", *argv, "--seed", 1) == 2
  assert "other settings (changed: seed)" in capsys.readouterr().err


_RUN_EVAL = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from eval_testlib import run_cli; "
             "sys.exit(run_cli('eval', *sys.argv[1:]))")


def _processes_with(text: str) -> list[int]:
  pids = []
  for proc in pathlib.Path("/proc").iterdir():
    try:
      if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
        pids.append(int(proc.name))
    except OSError:
      continue
  return pids


def test_sigterm_ends_the_run_with_130_and_stops_its_local_verifier(tmp_path, tmp_path_factory):
  gens, out = tmp_path / "gens", tmp_path / "run"
  fresh = LIGHT_RELU.replace("#include <cstdint>", f"#include <cstdint>\n// {uuid.uuid4().hex}")
  gen_lib.write_generation(gens, "tiny_relu", 0, fresh, raw=False)  # uncached: a compile in flight
  env = dict(os.environ, DICE_VERIFIER_CACHE=str(tmp_path_factory.getbasetemp() / "eval-verifier-cache"))
  cmd = [sys.executable, "-c", _RUN_EVAL, str(pathlib.Path(__file__).parent), "--generations", gens,
         "--problems", "bundled:tiny", "--limit", "1", "--mode", "end-to-end",  # --verifier local: the default
         "--out", out, "--no-plots"]
  proc = subprocess.Popen([str(c) for c in cmd], stderr=subprocess.PIPE, text=True, env=env)
  port = None
  deadline = time.monotonic() + 240
  while port is None and time.monotonic() < deadline:
    line = proc.stderr.readline()
    if not line:
      break
    m = re.search(r"local \(127\.0\.0\.1:(\d+)\)", line)
    port = m and m.group(1)
  assert port, "the local verifier never came up"
  server = f"--listen 127.0.0.1:{port}"
  assert _processes_with(server)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert "interrupted" in err
  for _ in range(50):
    if not _processes_with(server):
      break
    time.sleep(0.2)
  assert not _processes_with(server), "the local verifier outlived the interrupted run"
