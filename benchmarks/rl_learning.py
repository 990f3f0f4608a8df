"""Does bi-phase RL learn? Three arms from one SFT checkpoint, scored on held-out synthetic problems.

1. Data (dice_jax.data.synthetic): the train split is cut by a hash of each problem id into an SFT
   part (60%) and an RL part (40%, problems SFT never saw, so RL rewards vary); the held-out split
   (ops and op combinations no training problem uses) is only ever evaluated.
2. `dice sft` (configs/synthetic_sft.yaml): a small byte-level SDAR-layout model learns the SFT
   part's known-good answers, phase 1 (infilling: the `source` string) and phase 2 (the whole file).
3. Arms, from that checkpoint, with the same verifier budget (steps x prompts x group completions):
   (a) no RL; (b) `dice train`, end to end only; (c) `dice train`, bi-phase: infilling then end to
   end (configs/synthetic_rl.yaml; curriculum.phase1_steps 0 vs half the steps).
4. `dice eval` of each arm on the held-out split, end to end (the model writes the whole file),
   K samples per problem at temperature 1: execution accuracy, fast_1, pass@k. Also the known-good
   answers themselves (row "known-good": checks the harness, and warms the compile cache).
5. A table (stdout, results.md, results.json) with the targets: (c) - (a) >= 20 points of held-out
   execution accuracy, and (c) > (b); `dice plot` curves of both RL runs.

One loopback verifier (started here, `dice-verifier serve`) serves every stage, so identical kernels
compile once; while SFT runs it compiles the known-good answers of the RL and evaluation problems
(their verdicts are not used; a policy that writes the known-good text then hits the cache). After
SFT, arm (a)'s evaluation and both RL runs run at once on the one GPU (each JAX process takes a
slice of its memory), since all three mostly wait for kernels to compile.

Resumable under a time budget: `--budget-s` seconds after start every running stage is stopped
(SIGTERM: SFT and RL save a checkpoint, `dice eval` keeps what it generated and verified), and the
script exits 3; run the same command again (same --work) and it continues. Exit 0 when the table is
written, 1 when a stage failed (its log is printed).

    python benchmarks/rl_learning.py --work runs/learn --budget-s 470 --wheels .whl   # one H200
    python benchmarks/rl_learning.py --work /tmp/learn-smoke --smoke                  # CPU, every stage, tiny
    python benchmarks/rl_learning.py --work runs/learn2 --budget-s 470 --wheels .whl \
      --rl-set optimizer.lr=2e-5 --rl-set algo.kl_reference=reference   # the next try (BENCHMARKS.md)

Cost on one H200 with 16 cores (an estimate until measured): SFT ~2-3 min (1,000 steps of ~14
TFLOP); then the RL arms, ~20-30 s a step each, bound by compiling kernels (~8 CPU-s per new
kernel, ~12 compilers), with arm (a)'s evaluation alongside; then the other two evaluations, ~1.5
min. About 9-11 minutes in all, so a second call (within the machine's 30 s warm window, which
keeps WORK and the compile cache) may be needed. The --smoke run takes ~2.5 minutes on the 2-core
CPU VM and proves only that every stage runs: a model that small writes no code.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
ARMS = {"sft": "(a) no RL", "rl_e2e": "(b) end-to-end RL", "rl_biphase": "(c) bi-phase RL"}
EXIT_OK, EXIT_FAILED, EXIT_BUDGET = 0, 1, 3
_STOP_GRACE_S = 90.0  # SIGTERM -> checkpoint written -> exit


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Everything that sets the experiment's cost. `gpu()` is the H200 run; `smoke()` the CPU check."""

  train_spec: str = "synthetic:all?split=train"
  heldout_spec: str = "synthetic:all?split=heldout&limit=24"
  rl_share: int = 40  # percent of the train split kept out of SFT, for RL
  sft_overrides: tuple[str, ...] = ()
  rl_steps: int = 8
  rl_overrides: tuple[str, ...] = ()
  eval_samples: int = 4
  eval_max_new_tokens: int = 1344
  eval_batch_size: int = 96
  slots_per_gpu: int = 6
  compile_workers: int = 12
  # GPU memory share (XLA_PYTHON_CLIENT_MEM_FRACTION) of the SFT, each RL and each eval process: at most
  # 2 RL + 1 eval run at once (0.62), the rest is the verifier's workers'.
  jax_memory: tuple[float, float, float] = (0.5, 0.25, 0.12)

  @staticmethod
  def gpu() -> Sizes:
    return Sizes()

  @staticmethod
  def smoke() -> Sizes:
    tiny = ('model.init={model_type: sdar, vocab_size: 264, hidden_size: 32, intermediate_size: 64, '
            'num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, block_size: 4, '
            'mask_token_id: 259, eos_token_id: 258, pad_token_id: 256, rope_theta: 10000.0, '
            'max_position_embeddings: 4096}')
    return Sizes(train_spec="synthetic:elementwise+activation?split=train&limit=8",
                 heldout_spec="synthetic:elementwise+activation?split=heldout&limit=2", rl_share=50,
                 sft_overrides=(tiny, "model.dtype=float32", "data.max_length=1280", "data.batch_size=4",
                                "train.steps=6", "optimizer.warmup_steps=1", "checkpoint.every_steps=3",
                                "logging.every_steps=2"),
                 rl_steps=2, rl_overrides=("model.dtype=float32", "rollout.prompts_per_step=2",
                                           "rollout.group_size=2", "rollout.gen_length=64",
                                           "train.grad_accum_steps=1"),
                 eval_samples=2, eval_max_new_tokens=64, eval_batch_size=4, slots_per_gpu=1, compile_workers=2)


# ----------------------------------------------------------------------------------------- data


def _rl_part(problem_id: str, share: int) -> bool:
  return int.from_bytes(hashlib.sha256(f"rl:{problem_id}".encode()).digest()[:8], "big") % 100 < share


def prepare(work: pathlib.Path, sizes: Sizes) -> dict[str, int]:
  """Writes data/sft.json, data/rl_problems.json and the compact prompt templates (idempotent)."""
  from dice_jax.data import prompts, synthetic
  from dice_jax.data.problems import load_problems
  from dice_jax.rl.data import COMPACT_END_TO_END, COMPACT_INFILLING

  data = work / "data"
  data.mkdir(parents=True, exist_ok=True)
  train = load_problems(sizes.train_spec)
  sft = [p for p in train if not _rl_part(p.id, sizes.rl_share)]
  rl = [p for p in train if _rl_part(p.id, sizes.rl_share)]
  if not sft or not rl:
    raise SystemExit(f"{sizes.train_spec}: {len(sft)} SFT and {len(rl)} RL problems; both parts need some")
  # Small families are repeated so each is a fair share of the SFT data (element-wise has the most).
  families = {}
  for p in sft:
    families.setdefault(p.id.split("_")[1], []).append(p)
  most = max(len(v) for v in families.values())
  rows = []
  for members in families.values():
    repeat = max(1, round(most / len(members) / 2))
    for p in members * repeat:
      for phase, template, answer in ((1, COMPACT_INFILLING, p.middle), (2, COMPACT_END_TO_END, p.known_good)):
        user = prompts.build_messages(p, phase, infilling=template, end_to_end=template)[-1]["content"]
        rows.append({"prompt": user, "response": f"```python\n{answer}\n```"})
  _write_json(data / "sft.json", rows)
  records = {r["id"]: r for r in synthetic.records(sizes.train_spec)}
  _write_json(data / "rl_problems.json", [records[p.id] for p in rl])
  for name, template in (("infilling", COMPACT_INFILLING), ("end_to_end", COMPACT_END_TO_END)):
    _write_json(data / f"{name}_template.json", {"system": template.system, "user": template.user})
  return {"sft_problems": len(sft), "sft_examples": len(rows), "rl_problems": len(rl),
          "heldout_problems": len(load_problems(sizes.heldout_spec))}


def _write_json(path: pathlib.Path, value) -> None:
  text = json.dumps(value, indent=1)
  if not path.exists() or path.read_text(encoding="utf-8") != text:
    path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------------------- stages


@dataclasses.dataclass
class Stage:
  name: str
  argv: list[str]
  after: tuple[str, ...] = ()
  jax_memory: float | None = None  # XLA_PYTHON_CLIENT_MEM_FRACTION; None: no JAX in this process
  optional: bool = False  # a cache warm-up: stopped (not resumed) once SFT is done
  retry_codes: tuple[int, ...] = ()  # exit codes that mean "run me again" (dice eval: 4, INFRA_ERROR left)


def _dice(*args: str) -> list[str]:
  return [sys.executable, "-m", "dice_jax.cli.main", *map(str, args)]


def stages(work: pathlib.Path, sizes: Sizes, verifier: str) -> list[Stage]:
  data = work / "data"
  templates = ["--template-infilling", data / "infilling_template.json",
               "--template-end-to-end", data / "end_to_end_template.json"]
  sft = Stage("sft", _dice("sft", "--config", CONFIGS / "synthetic_sft.yaml", f"run_dir={work / 'sft'}",
                           f"data.train_files=[{data / 'sft.json'}]", *sizes.sft_overrides),
              jax_memory=sizes.jax_memory[0])
  out = [sft,
         Stage("eval_known_good", _dice("eval", "--reference-generations", "--problems", sizes.heldout_spec,
                                        "--mode", "end-to-end", "--verifier", verifier, "--name", "known-good",
                                        "--out", work / "eval" / "known_good", "--no-plots"), retry_codes=(4,)),
         Stage("warm_rl_answers", _dice("eval", "--reference-generations", "--problems", data / "rl_problems.json",
                                        "--mode", "infilling", "--skip-timing", "--verifier", verifier,
                                        "--out", work / "eval" / "warm_rl", "--no-plots"), optional=True)]
  rl_common = [f"model.path={work / 'sft' / 'hf'}", "model.init=null", "model.tokenizer=null",
               f"data.phase1_files=[{data / 'rl_problems.json'}]", f"data.phase2_files=[{data / 'rl_problems.json'}]",
               f"verifier.targets=[{verifier}]", f"train.steps={sizes.rl_steps}", *sizes.rl_overrides]
  for arm, phase1 in (("rl_e2e", 0), ("rl_biphase", sizes.rl_steps // 2)):
    out.append(Stage(arm, _dice("train", "--config", CONFIGS / "synthetic_rl.yaml", f"run_dir={work / arm}",
                                f"curriculum.phase1_steps={phase1}", *rl_common),
                     after=("sft",), jax_memory=sizes.jax_memory[1]))
  for arm in ARMS:
    model = work / arm / "hf"
    out.append(Stage(f"eval_{arm}", _dice(
        "eval", "--model", model, "--problems", sizes.heldout_spec, "--mode", "end-to-end",
        "--samples", sizes.eval_samples, "--temperature", "1.0", "--max-new-tokens", sizes.eval_max_new_tokens,
        "--batch-size", sizes.eval_batch_size, *templates, "--verifier", verifier, "--name", ARMS[arm],
        "--out", work / "eval" / arm), after=(arm,), jax_memory=sizes.jax_memory[2], retry_codes=(4,)))
  return out


class Runner:
  """Starts each stage once its dependencies are done; all ready stages run at once."""

  def __init__(self, work: pathlib.Path, stage_list: list[Stage], deadline: float):
    self.work, self.deadline = work, deadline
    self.stages = {s.name: s for s in stage_list}
    self.state_path = work / "state.json"
    self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
    self.running: dict[str, tuple[subprocess.Popen, float]] = {}
    (work / "logs").mkdir(exist_ok=True)

  def _save(self) -> None:
    self.state_path.write_text(json.dumps(self.state, indent=1))

  def _done(self, name: str) -> bool:
    return self.state.get(name, {}).get("status") in ("done", "skipped")

  def _failed(self, name: str) -> bool:
    status = self.state.get(name, {}).get("status", "")
    return status.startswith("exit") and not status.endswith("retrying")

  def _start(self, stage: Stage) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if stage.jax_memory is not None:  # several JAX processes and the verifier's workers share one GPU
      env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{stage.jax_memory:.2f}"
    log = open(self.work / "logs" / f"{stage.name}.log", "ab")  # pylint: disable=consider-using-with
    log.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(map(str, stage.argv))}\n".encode())
    log.flush()
    proc = subprocess.Popen(stage.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                            start_new_session=True)
    log.close()
    self.running[stage.name] = (proc, time.monotonic())
    print(f"[{_clock()}] start {stage.name}", flush=True)

  def _finish(self, name: str, code: int, stopped: bool = False) -> None:
    _, started = self.running.pop(name)
    entry = self.state.setdefault(name, {"seconds": 0.0})
    entry["seconds"] = round(entry.get("seconds", 0.0) + time.monotonic() - started, 1)
    stage = self.stages[name]
    if stopped and code != 0:
      entry["status"] = "skipped" if stage.optional else f"stopped (exit {code}): resumes next call"
    elif code == 0:
      entry["status"] = "done"
    elif code in stage.retry_codes and entry.get("retries", 0) < 2:
      entry["retries"] = entry.get("retries", 0) + 1
      entry["status"] = f"exit {code}: retrying"
    elif stage.optional:
      entry["status"] = "skipped"
    else:
      entry["status"] = f"exit {code}"
    self._save()
    print(f"[{_clock()}] {name}: {entry['status']} ({entry['seconds']:.0f} s in all)", flush=True)

  def _stop(self, names: list[str]) -> None:
    for name in names:
      os.killpg(self.running[name][0].pid, signal.SIGTERM)
    end = time.monotonic() + _STOP_GRACE_S
    for name in names:
      proc = self.running[name][0]
      try:
        proc.wait(timeout=max(1.0, end - time.monotonic()))
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
      self._finish(name, proc.returncode, stopped=True)

  def run(self) -> int:
    """EXIT_OK when every required stage is done, EXIT_BUDGET when time ran out, else EXIT_FAILED."""
    while True:
      for name, (proc, _) in list(self.running.items()):
        if proc.poll() is not None:
          self._finish(name, proc.returncode)
          if self._failed(name):
            print(_tail(self.work / "logs" / f"{name}.log"), file=sys.stderr)
            self._stop(list(self.running))
            return EXIT_FAILED
      if self._done("sft"):  # warm-ups only pay while SFT holds the GPU and leaves the compilers idle
        optional = [n for n in self.running if self.stages[n].optional]
        if optional:
          self._stop(optional)
      if all(self._done(n) or self.stages[n].optional and self._done("sft") for n in self.stages):
        return EXIT_OK
      if time.monotonic() > self.deadline:
        print(f"[{_clock()}] time budget reached: stopping {', '.join(self.running) or 'nothing'}; "
              "run the same command again to continue", flush=True)
        self._stop(list(self.running))
        return EXIT_BUDGET
      for stage in self.stages.values():
        if (stage.name not in self.running and not self._done(stage.name)
            and all(self._done(d) for d in stage.after)
            and not (stage.optional and self._done("sft"))):
          self._start(stage)
      time.sleep(2.0)


def _clock() -> str:
  return time.strftime("%H:%M:%S")


def _tail(path: pathlib.Path, lines: int = 40) -> str:
  text = path.read_text(errors="replace").splitlines() if path.exists() else []
  return f"---- last lines of {path}:\n" + "\n".join(text[-lines:])


# -------------------------------------------------------------------------------------- results


def _family_rates(eval_dir: pathlib.Path, key: str, groups: dict[str, str]) -> dict[str, float | None]:
  """Per-group mean of a per-problem rate (`groups`: problem id -> group name)."""
  sums: dict[str, list[float]] = {}
  for path in sorted((eval_dir / "problems").glob("*.json")):
    record = json.loads(path.read_text(encoding="utf-8"))
    value = record["metrics"].get(key)
    if value is not None and record["id"] in groups:
      sums.setdefault(groups[record["id"]], []).append(value)
  return {g: sum(v) / len(v) for g, v in sorted(sums.items())}


_RL_KEYS = ("step", "curriculum/phase2_share", "format", "compile", "correct", "reward", "outcomes/OK",
            "outcomes/INCORRECT", "outcomes/COMPILE_ERROR", "outcomes/FORMAT", "adv/zero_var_frac", "kl", "entropy",
            "timing/step_s", "wait_frac")


def _rl_summary(run_dir: pathlib.Path) -> dict[str, object]:
  path = run_dir / "metrics.jsonl"
  if not path.exists():
    return {}
  records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
  rows = [{k: r.get(k) for k in _RL_KEYS} for r in records]
  return {"steps": rows}


def results(work: pathlib.Path, sizes: Sizes, counts: dict[str, int]) -> dict[str, object]:
  """The comparison table as a dict (written to results.json)."""
  from dice_jax.data import synthetic

  groups = {r["id"]: f"{r['id'].split('_')[1]}/{r['novelty']}" for r in synthetic.records(sizes.heldout_spec)}
  rows = {}
  for name, label in (("known_good", "known-good answers"), *ARMS.items()):
    folder = work / "eval" / name
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    overall = summary["overall"]
    available = overall["correctness_available"]
    rows[name] = {"label": label, "problems": overall["problems"], "samples": overall["samples"],
                  "compile_rate": overall["compile_rate"], "correct_rate": overall["correct_rate"],
                  "fast_1": overall["fast_1"], "pass_at_k": overall["pass_at_k"], "outcomes": overall["outcomes"],
                  "correctness_available": available, "by_group": _family_rates(folder, "correct_rate", groups)}
  a, b, c = (rows[arm]["correct_rate"] for arm in ARMS)
  targets = None
  if rows["known_good"]["correctness_available"] and None not in (a, b, c):
    targets = {"gain_c_over_a_points": round(100 * (c - a), 1), "gain_b_over_a_points": round(100 * (b - a), 1),
               "c_gains_20_points": c - a >= 0.20, "c_beats_b": c > b}
  completions = sizes.rl_steps * _rl_rows(work)
  return {"sizes": dataclasses.asdict(sizes), "data": counts, "rl_completions_per_arm": completions,
          "rows": rows, "targets": targets,
          "rl": {arm: _rl_summary(work / arm) for arm in ("rl_e2e", "rl_biphase")},
          "stage_seconds": {k: v.get("seconds") for k, v in json.loads((work / "state.json").read_text()).items()}}


def _rl_rows(work: pathlib.Path) -> int:
  import yaml

  config = yaml.safe_load((work / "rl_e2e" / "config.yaml").read_text(encoding="utf-8"))
  return config["rollout"]["prompts_per_step"] * config["rollout"]["group_size"]


def _pct(value) -> str:
  return "n/a" if value is None else f"{100 * value:.1f}%"


def markdown(res: dict[str, object]) -> str:
  rows = res["rows"]
  ks = sorted({k for r in rows.values() for k in (r["pass_at_k"] or {})}, key=int)
  groups = sorted({g for r in rows.values() for g in r["by_group"]})
  head = ["arm", "compiled", "correct (exec. acc.)", "fast_1", *(f"pass@{k}" for k in ks), *groups]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows.values():
    cells = [r["label"], _pct(r["compile_rate"]), _pct(r["correct_rate"]), _pct(r["fast_1"]),
             *(_pct((r["pass_at_k"] or {}).get(k)) for k in ks), *(_pct(r["by_group"].get(g)) for g in groups)]
    lines.append("| " + " | ".join(cells) + " |")
  first = next(iter(rows.values()))
  lines.append("")
  lines.append(f"{first['problems']} held-out problems, {rows['sft']['samples'] // max(first['problems'], 1)} "
               f"samples each at temperature 1; group columns are execution accuracy by family/why held out. "
               f"RL: {res['rl_completions_per_arm']} verified completions per arm.")
  lines += ["", "RL training, per step (rates over that step's completions; phase 2 share 0 = infilling):", "",
            "| arm | step | phase 2 share | format | compile | correct | reward | # OK | # INCORRECT | "
            "# COMPILE_ERROR | # no code | zero-variance groups | KL | entropy | step s | waiting on verdicts |",
            "|" + "---|" * 16]
  for arm, run in res["rl"].items():
    for r in run.get("steps", []):
      cells = [ARMS[arm], str(r["step"]), *(("-" if not isinstance(r.get(k), (int, float)) else
                                             f"{r[k]:.0f}" if k.startswith("outcomes/") else f"{r[k]:.2f}")
                                            for k in _RL_KEYS[1:])]
      lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Stage wall times, s (summed over calls; stages after SFT overlap): " + ", ".join(
      f"{k} {v:.0f}" for k, v in res["stage_seconds"].items() if v is not None), ""]
  t = res["targets"]
  if t is None:
    lines.append("Targets: not decidable: the verifier has no GPU, so nothing was checked for correctness "
                 "(an arm's 0% means none of its samples even reached the compiler).")
  else:
    lines.append(f"Targets: (c) - (a) = {t['gain_c_over_a_points']:+.1f} points (>= +20: "
                 f"{'met' if t['c_gains_20_points'] else 'NOT met'}); (b) - (a) = {t['gain_b_over_a_points']:+.1f}; "
                 f"(c) beats (b): {'met' if t['c_beats_b'] else 'NOT met'}.")
  return "\n".join(lines) + "\n"


def plots(work: pathlib.Path) -> list[str]:
  made = []
  for arm in ("rl_e2e", "rl_biphase"):
    out = work / "plots" / arm
    proc = subprocess.run(_dice("plot", work / arm, "--out", out), capture_output=True, text=True, cwd=REPO,
                          check=False)
    if proc.returncode != 0:
      print(f"dice plot {arm}: {proc.stderr.strip()}", file=sys.stderr)
    made += proc.stdout.split()
  return made


def export(work: pathlib.Path, path: pathlib.Path) -> None:
  """One archive of what a reader needs (results, logs, metrics, eval summaries, plots)."""
  with tarfile.open(path, "w:gz") as tar:
    for pattern in ("results.*", "state.json", "logs/*.log", "*/metrics.jsonl", "*/config.yaml", "eval/*/summary.*",
                    "eval/*/problems/*.json", "plots/*/*.png", "data/*.json", "*/samples/*.jsonl"):
      for file in sorted(work.glob(pattern)):
        tar.add(file, arcname=str(file.relative_to(work)))


# ----------------------------------------------------------------------------------------- main


def install_wheels(folder: pathlib.Path, target: pathlib.Path) -> str:
  """pip-installs every wheel of `folder` into `target` (offline, dependencies not resolved)."""
  wheels = sorted(folder.expanduser().glob("*.whl"))
  if not wheels:
    raise SystemExit(f"--wheels {folder}: no .whl files there")
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                  "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)], check=True)
  print(f"[{_clock()}] installed {', '.join(w.name.split('-')[0] for w in wheels)} into {target}", flush=True)
  return str(target)


def with_flags(sizes: Sizes, args: argparse.Namespace) -> Sizes:
  changes = {}
  if args.sft_steps:
    changes["sft_overrides"] = (*sizes.sft_overrides, f"train.steps={args.sft_steps}")
  if args.prompts_per_step:
    changes["rl_overrides"] = (*sizes.rl_overrides, f"rollout.prompts_per_step={args.prompts_per_step}")
  if args.rl_steps:
    changes["rl_steps"] = args.rl_steps
  if args.rl_set:
    changes["rl_overrides"] = (*changes.get("rl_overrides", sizes.rl_overrides), *args.rl_set)
  if args.eval_problems:
    changes["heldout_spec"] = sizes.heldout_spec.split("&limit=")[0] + f"&limit={args.eval_problems}"
  if args.eval_samples:
    changes["eval_samples"] = args.eval_samples
  return dataclasses.replace(sizes, **changes)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--work", required=True, type=pathlib.Path, help="work directory (resumed when it exists)")
  parser.add_argument("--budget-s", type=float, default=560.0,
                      help="stop every stage this many seconds after start and exit 3 (default %(default)s)")
  parser.add_argument("--smoke", action="store_true", help="tiny CPU run of every stage (compile-only verifier)")
  parser.add_argument("--verifier-cache", type=pathlib.Path,
                      help="compile cache of the loopback verifier (default: the verifier's, $DICE_VERIFIER_CACHE or "
                           "~/.cache/dice-verifier, which tests/data/test_data_synthetic_verify.py fills too)")
  parser.add_argument("--export", type=pathlib.Path, help="also write a .tar.gz of results, logs and plots here")
  parser.add_argument("--wheels", type=pathlib.Path,
                      help="a folder of wheels to install first (pip --target WORK/site, no index, no deps), for "
                           "a machine that lacks packages, e.g. the GPU image's missing grain")
  size = parser.add_argument_group("sizes (default: the configs' values; keep them the same across resumed calls)")
  size.add_argument("--sft-steps", type=int)
  size.add_argument("--rl-steps", type=int, help="per RL arm; arm (c) spends half on infilling (default 8)")
  size.add_argument("--prompts-per-step", type=int, help="RL prompts per step (group size stays 4)")
  size.add_argument("--eval-problems", type=int, help="held-out problems evaluated (default 24)")
  size.add_argument("--eval-samples", type=int, help="samples per problem at temperature 1 (default 4)")
  size.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a `dice train` override for both RL arms, e.g. optimizer.lr=2e-5 or "
                         "algo.kl_reference=reference (repeatable)")
  args = parser.parse_args()
  start = time.monotonic()
  sizes = with_flags(Sizes.smoke() if args.smoke else Sizes.gpu(), args)
  work = args.work.expanduser().resolve()
  work.mkdir(parents=True, exist_ok=True)
  pinned = work / "sizes.json"
  if pinned.exists() and json.loads(pinned.read_text()) != json.loads(json.dumps(dataclasses.asdict(sizes))):
    print(f"{work} holds a run with other sizes ({pinned}); use the same flags, or a new --work", file=sys.stderr)
    return 2
  pinned.write_text(json.dumps(dataclasses.asdict(sizes), indent=1))
  paths = [str(REPO), str(REPO / "protos")]  # this checkout, installed or not (the device runs it in place)
  if args.wheels:
    paths.append(install_wheels(args.wheels, work / "site"))
  os.environ["PYTHONPATH"] = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  sys.path[:0] = paths
  counts = prepare(work, sizes)
  print(f"[{_clock()}] data: {counts}", flush=True)
  from dice_jax.verifier.local import LocalVerifier

  cache = args.verifier_cache.expanduser().resolve() if args.verifier_cache else None
  # RLIMIT_DATA of each job child: 32 GiB, what the GPU runs so far had (the default is RAM / 2 / slots).
  extra = ("--slots-per-gpu", str(sizes.slots_per_gpu), "--queue-capacity", "2048",
           "--sandbox-memory", str(32 << 30))
  with LocalVerifier(cache_dir=cache, compile_workers=sizes.compile_workers, log_path=work / "logs" / "verifier.log",
                     extra_args=extra) as verifier:
    print(f"[{_clock()}] verifier {verifier.target} (cache {cache or 'the verifier default'})", flush=True)
    code = Runner(work, stages(work, sizes, verifier.target), start + args.budget_s).run()
  if code != EXIT_OK:
    return code
  res = results(work, sizes, counts)
  res["plots"] = plots(work)
  (work / "results.json").write_text(json.dumps(res, indent=1), encoding="utf-8")
  table = markdown(res)
  (work / "results.md").write_text(table, encoding="utf-8")
  print(table)
  if args.export:
    export(work, args.export)
  print(f"[{_clock()}] this call: {time.monotonic() - start:.0f} s; results in {work}/results.md", flush=True)
  return EXIT_OK


if __name__ == "__main__":
  sys.exit(main())
