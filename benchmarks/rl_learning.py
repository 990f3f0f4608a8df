"""Does bi-phase RL learn? SFT, a gate, two RL arms and no RL from one checkpoint, on held-out problems.

Stages (`--stage`, comma-separated, run in this order; each resumes what an earlier call left):
  sft     Synthetic problems (dice_jax.data.synthetic: elementwise + activation + bias_act, seed 0):
          ~850 `sft` problems (both phases: infilling and end to end), ~550 `rl` problems SFT never
          sees, 128 `heldout` (new op chains and bias pairs whose ops and adjacent op pairs all occur
          in the sft split) and 12 `unseen_op` (reported apart). `dice sft` of a ~24 M-parameter
          SDAR-layout model, byte tokenizer, a few epochs (configs/synthetic_sft.yaml).
  gate    Before any RL, on the first --gate-problems held-out problems, end to end: the known-good
          answers (checks the harness, warms the compile cache), greedy with static decoding, and
          8 samples at temperature 1. Passes when compile >= 90%, pass@1 (of the 8) in 10-35% and
          pass@8 >= 50% (out/gate.json); if not, change --sft-epochs (with a new --out).
  rl-b    (b) end-to-end RL from the SFT checkpoint; rl-c: (c) bi-phase, infilling for the first
          20 steps then end to end (configs/synthetic_rl.yaml: Dr. GRPO, DICE's binary reward, KL
          (k2) to the SFT model, dual clip, warm-up, dynamic sampling, KL guard). 60 steps of 16
          prompts x 8 each; the policy is exported every 20 steps for the curve.
  eval    On all held-out problems, for (a) no RL, (b) and (c): greedy static (execution accuracy,
          fast_1) and 8 samples at temperature 1 (pass@8); greedy at steps 20 and 40 of (b) and (c);
          the unseen-op problems greedy; the known-good answers.
  report  Figures with paired bootstrap 95% intervals (rl_learning_results.py): out/results.json and
          results.md, and --results (default benchmarks/results/rl_learning.json).

Everything runs in this process (JAX imported once, a persistent compilation cache in out/), with
one loopback verifier for the call. `--budget-s` seconds after start a stage stops at its next safe
point (SFT and RL save a checkpoint; an evaluation keeps every verdict it has) and the script exits
3: run the same command again (same --out) to continue. Exit 0 when the asked stages are done, 1
when one failed, 2 for bad arguments or an --out holding other sizes.

    python benchmarks/rl_learning.py --stage sft,gate --out runs/learn --wheels .whl     # one H200 call
    python benchmarks/rl_learning.py --stage rl-c --out runs/learn --rl-steps 20         # a short arm
    python benchmarks/rl_learning.py --stage rl-b,rl-c,eval,report --out runs/learn      # ~10 verdicts/s
    python benchmarks/rl_learning.py --smoke --stage all --out /tmp/learn-smoke          # CPU, tiny

Cost: see BENCHMARKS.md "Learning" for what was measured. Verdicts per stage: gate 9 x gate-problems
plus gate-problems known-good (24: 240); an RL arm 60 x 128 = 7,680, up to twice that with
dynamic sampling's refills; eval 128 x (3 x 9 + 4 + 1) plus 36 unseen-op = 4,132. The --smoke run
(a 1-layer model, 2-step arms, a compile-only verifier) proves only that every stage runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
STAGES = ("sft", "gate", "rl-b", "rl-c", "eval", "report")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3
GATE = {"compile_min": 90.0, "pass_at_1": (10.0, 35.0), "pass_at_8_min": 50.0}
RL_SIZES = {"rl_steps", "curve_every", "phase1_steps", "rl_overrides"}  # free to change until an arm starts


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Everything that sets the experiment's cost; pinned in out/sizes.json across calls."""
  families: str = "elementwise+activation+bias_act"
  seed: int = 0
  limit: int | None = None  # problems per split (None: all); the smoke run's few
  sft_epochs: float = 8.0
  sft_overrides: tuple[str, ...] = ()
  gate_problems: int = 24
  samples: int = 8  # pass@k's k at temperature 1
  known_good: bool = True  # verify the known-good answers too (a harness check; compiles every answer)
  gen_length: int = 960  # the longest end-to-end answer, fenced, is ~955 bytes
  eval_batch: int = 128
  rl_steps: int = 60
  curve_every: int = 20
  phase1_steps: int = 20  # arm (c)'s infilling steps
  rl_overrides: tuple[str, ...] = ()
  slots_per_gpu: int = 6
  compile_workers: int = 12

  @staticmethod
  def smoke() -> Sizes:
    tiny = ('model.init={model_type: sdar, vocab_size: 264, hidden_size: 32, intermediate_size: 64, '
            'num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, block_size: 4, '
            'mask_token_id: 259, eos_token_id: 258, pad_token_id: 256, rope_theta: 10000.0, '
            'max_position_embeddings: 4096}')
    return Sizes(limit=3, sft_epochs=1.0, gate_problems=2, known_good=False, samples=2, gen_length=32, eval_batch=4, rl_steps=2,
                 curve_every=1, phase1_steps=1, slots_per_gpu=1, compile_workers=2,
                 sft_overrides=(tiny, "model.dtype=float32", "data.batch_size=2", "train.grad_accum_steps=1",
                                "logging.every_steps=1"),
                 rl_overrides=("model.dtype=float32", "rollout.prompts_per_step=2", "rollout.group_size=2",
                               "train.num_minibatches=1", "train.grad_accum_steps=1", "logging.samples_per_phase=1"))

  def spec(self, split: str, limit: int | None = None) -> str:
    limit = limit or self.limit
    return f"synthetic:{self.families}?split={split}&seed={self.seed}" + (f"&limit={limit}" if limit else "")

  def curve_steps(self) -> list[int]:
    return sorted({min(s, self.rl_steps) for s in range(self.curve_every, self.rl_steps + self.curve_every,
                                                         self.curve_every)})


class Call:
  """This call's output folder, deadline, state file and (once asked for) loopback verifier."""

  def __init__(self, out: pathlib.Path, sizes: Sizes, deadline: float, args: argparse.Namespace):
    self.out, self.sizes, self.deadline, self.args = out, sizes, deadline, args
    self.state_path = out / "state.json"
    self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
    self._verifier, self._verifier_error = None, None
    self._started = threading.Event()

  def expired(self) -> bool:
    return time.monotonic() > self.deadline

  def note(self, stage: str, **values) -> None:
    self.state.setdefault(stage, {}).update(values)
    self.state_path.write_text(json.dumps(self.state, indent=1))

  def start_verifier(self) -> None:
    """Starts the loopback verifier in a thread (torch's import overlaps SFT's start)."""
    def run():
      from dice_jax.verifier.local import LocalVerifier
      cache = self.args.verifier_cache.expanduser().resolve() if self.args.verifier_cache else None
      local = LocalVerifier(cache_dir=cache, compile_workers=self.sizes.compile_workers,
                            log_path=self.out / "logs" / "verifier.log",
                            extra_args=("--slots-per-gpu", str(self.sizes.slots_per_gpu), "--queue-capacity", "4096"))
      try:
        local.start()
        self._verifier = local
      except Exception as e:  # pylint: disable=broad-except  (reported where the verifier is needed)
        self._verifier_error = e
      self._started.set()
    threading.Thread(target=run, name="verifier-start", daemon=True).start()

  @property
  def verifier(self) -> str:
    self._started.wait()
    if self._verifier is None:
      raise RuntimeError(f"the loopback verifier did not start: {self._verifier_error}")
    return self._verifier.target

  def close(self) -> None:
    if self._started.is_set() and self._verifier is not None:
      self._verifier.stop()


def _log(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------------------------------ data


def prepare(call: Call) -> dict[str, int]:
  """out/data: sft.json (prompt/response, both phases), rl_problems.json (DICE records). Idempotent."""
  from dice_jax.data import prompts, synthetic
  from dice_jax.data.problems import load_problems
  from dice_jax.rl.data import COMPACT_END_TO_END, COMPACT_INFILLING

  sizes, data = call.sizes, call.out / "data"
  data.mkdir(parents=True, exist_ok=True)
  sft = load_problems(sizes.spec("sft"))
  families: dict[str, list] = {}
  for p in sft:
    families.setdefault(p.id.split("_")[1], []).append(p)
  largest = max(len(v) for v in families.values())
  rows = []
  for members in families.values():  # small families repeated (at most 4x) so they are not lost
    for p in members * min(4, max(1, round(largest / (4 * len(members))))):
      for phase, answer in ((1, p.middle), (2, p.known_good)):
        user = prompts.build_messages(p, phase, infilling=COMPACT_INFILLING, end_to_end=COMPACT_END_TO_END)[-1]
        rows.append({"prompt": user["content"], "response": f"```python\n{answer}\n```"})
  _write_json(data / "sft.json", rows)
  _write_json(data / "rl_problems.json", synthetic.records(sizes.spec("rl")))
  counts = {"sft_problems": len(sft), "sft_examples": len(rows), "rl_problems": len(load_problems(sizes.spec("rl"))),
            "heldout_problems": len(load_problems(sizes.spec("heldout"))),
            "unseen_op_problems": len(load_problems(sizes.spec("unseen_op")))}
  call.note("data", **counts)
  return counts


def _write_json(path: pathlib.Path, value) -> None:
  text = json.dumps(value, indent=1)
  if not path.exists() or path.read_text(encoding="utf-8") != text:
    path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------------------- stages


def stage_sft(call: Call) -> bool:
  from dice_jax.config import load_config
  from dice_jax.train.sft_loop import SFTConfig, run_sft

  run_dir = call.out / "sft"
  if (run_dir / "hf" / "config.json").exists():
    return True
  cfg = load_config(SFTConfig, str(CONFIGS / "synthetic_sft.yaml"), [
      f"run_dir={run_dir}", f"data.train_files=[{call.out / 'data' / 'sft.json'}]", *call.sizes.sft_overrides])
  steps = math.ceil(call.sizes.sft_epochs * call.state["data"]["sft_examples"] / cfg.data.batch_size)
  cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps))
  t0 = time.monotonic()
  result = run_sft(cfg, should_stop=call.expired)
  seconds = time.monotonic() - t0
  done = result.step - result.start_step
  call.note("sft", status=result.status, step=result.step, steps=steps, batch=cfg.data.batch_size,
            seconds=round(call.state.get("sft", {}).get("seconds", 0) + seconds, 1),
            steps_per_s_this_call=round(done / seconds, 3) if seconds else None, loss=result.metrics.get("loss"))
  _log(f"sft: {result.status} at step {result.step}/{steps} ({done} steps in {seconds:.0f} s, compile included)")
  return result.status == "done"


def evaluate(call: Call, name: str, model: pathlib.Path | None, problems: list, *, samples: int, greedy: bool,
             timing: bool, connection) -> bool:
  """One evaluation into out/eval/<name> (the `dice eval` layout), resumable: generates what is
  missing, verifies 16 problems at a time while time is left, then summarises. False: stopped."""
  from dice.verifier.v1 import verifier_pb2 as pb
  from dice_jax.eval import generations as gen_lib
  from dice_jax.eval import model_samples, pipeline
  from dice_jax.rl.data import COMPACT_END_TO_END, COMPACT_INFILLING
  from dice_jax.sampler.config import SamplerConfig
  from dice_jax.verifier.options import verify_options

  folder = call.out / "eval" / name
  gens_dir = folder / "generations"
  if model is None:
    gen_lib.write_reference_generations(gens_dir, problems)
  else:
    decode = SamplerConfig(gen_length=call.sizes.gen_length, mode="static", top_k=1 if greedy else 0)
    source = model_samples.ModelSource(model_dir=str(model), samples=samples, decode=decode, seed=call.sizes.seed,
                                       batch_size=call.sizes.eval_batch, infilling_template=COMPACT_INFILLING,
                                       end_to_end_template=COMPACT_END_TO_END)
    source.generate_missing(gens_dir, problems, gen_lib.END_TO_END)
  gens = gen_lib.read_generations(gens_dir, problems)
  options = verify_options(precision="fp32", skip_timing=not timing)
  info = {"name": name, "model": str(model) if model else "known-good", "samples": samples, "greedy": greedy}
  t0, sent = time.monotonic(), 0
  for start in range(0, len(problems), 16):
    if call.expired():
      return False
    part = problems[start:start + 16]
    sent += pipeline.run_eval(folder, part, {p.id: gens[p.id] for p in part}, connection, mode=gen_lib.END_TO_END,
                              options=options, run_info=info, make_plots=False).sent
  seconds = time.monotonic() - t0
  outcome = pipeline.run_eval(folder, problems, gens, connection, mode=gen_lib.END_TO_END, options=options,
                              run_info=info, make_plots=False)
  overall = outcome.summary["overall"]
  runs = call.state.get("eval_runs", {})
  previous = runs.get(name, {})
  call.note("eval_runs", **{name: {
      "problems": overall["problems"], "samples": overall["samples"], "correct_rate": overall["correct_rate"],
      "compile_rate": overall["compile_rate"], "outcomes": overall["outcomes"], "infra_left": outcome.infra,
      "verified": previous.get("verified", 0) + sent, "verify_s": round(previous.get("verify_s", 0) + seconds, 1)}})
  _log(f"eval {name}: correct {overall['correct_rate']}, compiled {overall['compile_rate']} "
       f"({overall['samples']} samples; {sent} distinct candidates verified in {seconds:.0f} s; "
       f"{pb.Outcome.Name(pb.INFRA_ERROR)} left: {outcome.infra})")
  return outcome.infra == 0


def _connection(call: Call):
  from dice_jax.verifier import connect as connect_lib
  from dice_jax.verifier.defaults import EVALUATION
  connection = connect_lib.connect(call.verifier, use=EVALUATION)
  call.note("verifier", has_gpu=connection.has_gpu, describe=connection.describe())
  return connection


def stage_gate(call: Call) -> bool:
  import rl_learning_results as results
  from dice_jax.data.problems import load_problems

  problems = load_problems(call.sizes.spec("heldout", call.sizes.gate_problems))
  ids, model = [p.id for p in problems], call.out / "sft" / "hf"
  runs = {"sft_greedy": dict(model=model, samples=1, greedy=True, timing=False),
          "sft_sampled": dict(model=model, samples=call.sizes.samples, greedy=False, timing=False)}
  if call.sizes.known_good:
    runs = {"known_good": dict(model=None, samples=1, greedy=True, timing=False), **runs}
  connection = _connection(call)
  try:
    for name, kw in runs.items():
      if not evaluate(call, f"gate/{name}", problems=problems, connection=connection, **kw):
        return False
    has_gpu = connection.has_gpu
  finally:
    connection.close()
  scores = {name: results.read_problems(call.out / "eval" / "gate" / name, ids) for name in runs}
  gate = {"problems": len(ids), "verdicts": len(ids) * (len(runs) - 1 + call.sizes.samples)}
  if not has_gpu or any(v is None for v in scores.values()):
    gate.update(decided=False, why="no correctness verdicts (a verifier without a GPU)")
  else:
    s = scores["sft_sampled"]
    gate.update(compile=round(100 * s["compiled"].mean(), 1), pass_at_1=round(100 * s["pass_at_1"].mean(), 1),
                pass_at_8=round(100 * s["pass_at_k"].mean(), 1),
                greedy_exec=round(100 * scores["sft_greedy"]["correct"].mean(), 1))
    if "known_good" in scores:
      gate["known_good"] = round(100 * scores["known_good"]["correct"].mean(), 1)
    lo, hi = GATE["pass_at_1"]
    gate["passed"] = bool(gate["compile"] >= GATE["compile_min"] and lo <= gate["pass_at_1"] <= hi
                          and gate["pass_at_8"] >= GATE["pass_at_8_min"])
    gate["decided"] = True
  (call.out / "gate.json").write_text(json.dumps(gate, indent=1))
  call.note("gate", **gate)
  _log(f"gate: {gate}")
  return True


def stage_rl(call: Call, arm: str) -> bool:
  """One RL arm in segments of curve_every steps; each segment's end exports hf_step<N>."""
  from dice_jax.config import load_config
  from dice_jax.rl.config import RLConfig
  from dice_jax.rl.loop import run_rl

  run_dir, sizes = call.out / f"rl_{arm}", call.sizes
  rl_file = call.out / "data" / "rl_problems.json"
  for end in sizes.curve_steps():
    if (run_dir / f"hf_step{end}").exists():
      continue
    cfg = load_config(RLConfig, str(CONFIGS / "synthetic_rl.yaml"), [
        f"run_dir={run_dir}", f"model.path={call.out / 'sft' / 'hf'}", f"data.phase1_files=[{rl_file}]",
        f"data.phase2_files=[{rl_file}]", f"verifier.targets=[{call.verifier}]", f"train.steps={end}",
        f"curriculum.phase1_steps={sizes.phase1_steps if arm == 'c' else 0}",
        f"checkpoint.every_steps={sizes.curve_every}", f"rollout.gen_length={sizes.gen_length}",
        *sizes.rl_overrides])
    t0 = time.monotonic()
    result = run_rl(cfg, should_stop=call.expired)
    seconds = time.monotonic() - t0
    entry = call.state.get(f"rl_{arm}", {})
    call.note(f"rl_{arm}", status=result.status, step=result.step, verifier=result.verifier,
              seconds=round(entry.get("seconds", 0) + seconds, 1))
    _log(f"rl-{arm}: {result.status} at step {result.step}/{end} ({seconds:.0f} s)")
    if result.status != "done":
      return False
    os.replace(run_dir / "hf", run_dir / f"hf_step{end}")
  return True


def _eval_jobs(call: Call) -> list[tuple[str, pathlib.Path | None, str, dict]]:
  sizes, out = call.sizes, call.out
  final = sizes.curve_steps()[-1]
  models = {"a": out / "sft" / "hf", "b": out / "rl_b" / f"hf_step{final}", "c": out / "rl_c" / f"hf_step{final}"}
  greedy = dict(samples=1, greedy=True, timing=True)
  jobs = [("known_good", None, "heldout", dict(samples=1, greedy=True, timing=False))] if sizes.known_good else []
  jobs += [(f"{arm}_greedy", m, "heldout", greedy) for arm, m in models.items()]
  jobs += [(f"{arm}_step{s}_greedy", out / f"rl_{arm}" / f"hf_step{s}", "heldout", greedy)
           for arm in ("b", "c") for s in sizes.curve_steps()[:-1]]
  jobs += [(f"{arm}_sampled", m, "heldout", dict(samples=sizes.samples, greedy=False, timing=False))
           for arm, m in models.items()]
  jobs += [(f"{arm}_unseen_greedy", m, "unseen_op", greedy) for arm, m in models.items()]
  return jobs


def stage_eval(call: Call) -> bool:
  from dice_jax.data.problems import load_problems

  problems = {split: load_problems(call.sizes.spec(split)) for split in ("heldout", "unseen_op")}
  missing = [str(m) for _, m, _, _ in _eval_jobs(call) if m is not None and not (m / "config.json").exists()]
  if missing:
    raise RuntimeError(f"eval needs the finished arms; missing: {', '.join(missing)} (run sft, rl-b, rl-c first)")
  connection = _connection(call)
  try:
    for name, model, split, kw in _eval_jobs(call):
      if not evaluate(call, name, model, problems[split], connection=connection, **kw):
        return False
  finally:
    connection.close()
  return True


def stage_report(call: Call) -> bool:
  import rl_learning_results as results
  from dice_jax.data.problems import load_problems

  ids = {split: [p.id for p in load_problems(call.sizes.spec(split))] for split in ("heldout", "unseen_op")}
  fig = results.figures(call.out, ids["heldout"], ids["unseen_op"], call.sizes.curve_steps(),
                        correctness=call.state.get("verifier", {}).get("has_gpu", False))
  extra = {"gate": call.state.get("gate"), "data": call.state.get("data"), "sizes": dataclasses.asdict(call.sizes),
           "stages": {k: v for k, v in call.state.items() if k.startswith(("sft", "rl_"))}}
  res = results.results_json(fig, extra)
  text = json.dumps(res, indent=1)
  (call.out / "results.json").write_text(text)
  table = results.markdown(res)
  (call.out / "results.md").write_text(table)
  target = call.args.results or (REPO / "benchmarks" / "results" / "rl_learning.json")
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_text(text + "\n")
  print(table, flush=True)
  _log(f"results: {call.out / 'results.json'} and {target}")
  return True


# ------------------------------------------------------------------------------------------ main


def install_wheels(folder: pathlib.Path, target: pathlib.Path) -> None:
  """pip-installs every wheel of `folder` into `target` (offline, no dependencies) and imports from there."""
  wheels = sorted(folder.expanduser().glob("*.whl"))
  if not wheels:
    raise SystemExit(f"--wheels {folder}: no .whl files there")
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                  "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)], check=True)
  sys.path.insert(0, str(target))
  os.environ["PYTHONPATH"] = os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument("--stage", required=True, help=f"comma-separated: {', '.join(STAGES)}, or all")
  parser.add_argument("--out", required=True, type=pathlib.Path, help="work folder (resumed when it exists)")
  parser.add_argument("--budget-s", type=float, default=530.0,
                      help="stop at the next safe point this many seconds after start, exit 3 (default %(default)s)")
  parser.add_argument("--smoke", action="store_true", help="tiny sizes: a CPU check that every stage runs")
  parser.add_argument("--results", type=pathlib.Path, help="where report writes the JSON table "
                      "(default benchmarks/results/rl_learning.json)")
  parser.add_argument("--verifier-cache", type=pathlib.Path, help="the loopback verifier's compile cache")
  parser.add_argument("--wheels", type=pathlib.Path, help="wheels to pip-install into OUT/site first (grain on "
                      "the GPU image)")
  parser.add_argument("--export", type=pathlib.Path, help="also write a .tar.gz of results, state, logs, metrics")
  size = parser.add_argument_group("sizes (keep them the same across the calls of one --out)")
  size.add_argument("--sft-epochs", type=float)
  size.add_argument("--gate-problems", type=int)
  size.add_argument("--rl-steps", type=int, help="per arm (default 60); the curve has a point every 20")
  size.add_argument("--seed", type=int, help="the synthetic data's seed (default 0)")
  size.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE", help="a `dice sft` override")
  size.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a `dice train` override for both arms, e.g. optimizer.lr=1e-5 (repeatable)")
  args = parser.parse_args(argv)
  args.stages = STAGES if args.stage == "all" else tuple(s.strip() for s in args.stage.split(","))
  unknown = [s for s in args.stages if s not in STAGES]
  if unknown:
    parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)} or all")
  return args


def sizes_for(args: argparse.Namespace) -> Sizes:
  sizes = Sizes.smoke() if args.smoke else Sizes()
  changes = {k: getattr(args, k) for k in ("sft_epochs", "gate_problems", "rl_steps", "seed")
             if getattr(args, k) is not None}
  return dataclasses.replace(sizes, sft_overrides=(*sizes.sft_overrides, *args.sft_set),
                             rl_overrides=(*sizes.rl_overrides, *args.rl_set), **changes)


def export(out: pathlib.Path, path: pathlib.Path) -> None:
  import tarfile
  with tarfile.open(path, "w:gz") as tar:
    for pattern in ("results.*", "state.json", "sizes.json", "gate.json", "logs/*.log", "*/metrics.jsonl",
                    "*/config.yaml", "eval/*/summary.*", "eval/*/*/summary.*", "rl_*/samples/*.jsonl"):
      for file in sorted(out.glob(pattern)):
        tar.add(file, arcname=str(file.relative_to(out)))


def main(argv: list[str] | None = None) -> int:
  args = parse(argv)
  start = time.monotonic()
  sizes = sizes_for(args)
  out = args.out.expanduser().resolve()
  (out / "logs").mkdir(parents=True, exist_ok=True)
  pinned = out / "sizes.json"
  mine = json.loads(json.dumps(dataclasses.asdict(sizes)))
  if pinned.exists():
    old = json.loads(pinned.read_text())
    changed = {k for k in set(old) | set(mine) if old.get(k) != mine.get(k)}
    state = json.loads((out / "state.json").read_text()) if (out / "state.json").exists() else {}
    rl_started = any(k.startswith("rl_") for k in state)
    if changed and (rl_started or not changed <= RL_SIZES):
      print(f"{out} holds a run with other sizes ({', '.join(sorted(changed))}; {pinned}); use the same flags, "
            "or a new --out (RL sizes may change until an arm has started)", file=sys.stderr)
      return EXIT_USAGE
  pinned.write_text(json.dumps(mine, indent=1))
  if args.wheels:
    install_wheels(args.wheels, out / "site")
  # Several processes share the GPU: this one (SFT, RL, sampling) and the verifier's workers.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  # This checkout, installed or not (the device runs it in place); the verifier child inherits it.
  paths = [str(REPO), str(REPO / "protos")]
  os.environ["PYTHONPATH"] = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  sys.path[:0] = [*paths, str(REPO / "benchmarks")]
  import jax
  jax.config.update("jax_compilation_cache_dir", str(out / "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  import logging
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  call = Call(out, sizes, start + args.budget_s, args)
  if any(s != "sft" and s != "report" for s in args.stages):
    call.start_verifier()
  _log(f"data: {prepare(call)}")
  runners = {"sft": stage_sft, "gate": stage_gate, "rl-b": lambda c: stage_rl(c, "b"),
             "rl-c": lambda c: stage_rl(c, "c"), "eval": stage_eval, "report": stage_report}
  code = EXIT_OK
  try:
    for stage in args.stages:
      t0 = time.monotonic()
      try:
        finished = runners[stage](call)
      except Exception as e:  # pylint: disable=broad-except  (one line for the caller, the trace in the log)
        logging.exception("stage %s failed", stage)
        _log(f"{stage}: FAILED: {e}")
        code = EXIT_FAILED
        break
      call.note("calls", **{stage: round(call.state.get("calls", {}).get(stage, 0) + time.monotonic() - t0, 1)})
      if not finished:
        _log(f"{stage}: stopped at the time budget; run the same command again to continue")
        code = EXIT_BUDGET
        break
      _log(f"{stage}: done")
  finally:
    call.close()
    if args.export:
      export(out, args.export)
  _log(f"this call: {time.monotonic() - start:.0f} s")
  return code


if __name__ == "__main__":
  sys.exit(main())
