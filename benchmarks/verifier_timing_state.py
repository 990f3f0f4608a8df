"""Which state of the candidate's process slows its timed calls (issue 26 item 4; GPU).

On an H100 (2026-12-05) a verdict timed DICE's known-good candidates 1.56x slower than the same
kernel timed cold in one process, and the references (timed in the judge's process) only 1.06x.
This benchmark times each DICE pair in fresh processes, one per state, with the verifier's own
Timer, in the loop each side of a verdict uses:

  plain   as verifier_timing.ours(): the same inputs every call, the output dropped
  judge   as trusted/judge.time_both times the reference: rolled values copied into a buffer,
          batches of 20 calls (cold, warm, ...; fewer for large outputs, as the judge's plan),
          each output dropped at the next call
  child   as untrusted/child.on_time times the candidate: the same, plus a snapshot of every output
          right after the timer stopped and every output held to the end of its batch, as many
          calls kept to the end as the secret draw keeps (24 of 200 for small outputs)

then puts the process in one `--states` state, as the candidate's process is by the time it is
timed, and times `child` again:

  none    nothing (drift)
  calls   five calls of each model, nothing observing them (the control for the next three)
  dynamo  torch._dynamo imported (the first TorchDispatchMode imports it)
  audit   guards.Tripwire installed and armed (the candidate's audit hook)
  trace   five calls of each model under guards.ForwardTracer (sys.settrace, as the trials)
  ops     five calls under ops.OpRecorder (a TorchDispatchMode, as the trials)
  both    five calls under both (what the trials do)
  mon     five calls under a sys.monitoring tool (PY_START and RAISE, Python 3.12+), freed after:
          what ForwardTracer would be on sys.monitoring

Prints per state the median over pairs of child-after / plain and child-after - plain (us) for
each side: a state whose ratio stands out is where the verdict's extra time comes from.

  python benchmarks/verifier_timing_state.py DICE_JSON [--pairs 12] [--states none,audit,trace]
  python benchmarks/verifier_timing_state.py DICE_JSON --pairs 2 --trials 5 --dry-run   # no GPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import verifier_timing as vt  # noqa: E402  # pylint: disable=wrong-import-position

from verifier_service.compile import checks  # noqa: E402
from verifier_service.compile import toolchain as toolchain_lib  # noqa: E402
from verifier_service.run import ops, problem, timing, wire  # noqa: E402
from verifier_service.service import config as config_lib  # noqa: E402
from verifier_service.service import scheduler as scheduler_lib  # noqa: E402
from verifier_service.trusted import judge  # noqa: E402
from verifier_service.untrusted import child, guards  # noqa: E402

STATES = ("none", "calls", "dynamo", "audit", "trace", "ops", "both", "mon")


def compile_modules(pairs: list[dict], cache_dir: pathlib.Path) -> dict[str, str]:
  """The candidates' modules, built by the verifier's own compile path (no worker pool)."""
  async def go() -> dict[str, str]:
    config = config_lib.ServerConfig(listen="127.0.0.1:0", cache_dir=str(cache_dir),
                                     slots_per_gpu=1, queue_capacity=4096, gpus=[])
    scheduler = scheduler_lib.Scheduler.create(config, toolchain_lib.discover())
    await scheduler.start()
    try:
      return await vt._compile_all(scheduler, pairs)  # pylint: disable=protected-access
    finally:
      await scheduler.stop()
  return asyncio.run(go())


def _sync(device: torch.device) -> None:
  if device.type == "cuda":
    torch.cuda.synchronize()


def plain(model, args, trials: int, device: torch.device) -> float:
  timer = timing.Timer(device)
  timing.warm_up(lambda: (model(*args), _sync(device)))
  cold = []
  for _ in range(trials):
    cold.append(timer(lambda: model(*args), True)[0])
    timer(lambda: model(*args), False)
  return statistics.median(cold)


def batched(model, base, trials: int, device: torch.device, hold: bool) -> float:
  timer = timing.Timer(device)
  buf = problem.clone_tree(base)
  timing.warm_up(lambda: (model(*buf), _sync(device)))
  plan = judge.plan_timing(0, wire.payload_bytes(wire.spec(model(*buf))), verify=True)
  # As many calls kept as the secret draw keeps, at fixed places.
  drawn = set(range(1, 2 * trials, max(1, 2 * trials // plan.quota))[:plan.quota])
  rng = random.Random(1)
  calls = [(rng.randrange(1, 1 << 30), i % 2 == 0) for i in range(2 * trials)]
  kept, cold = [], []
  for start in range(0, len(calls), plan.batch):
    early: list = []
    outs = []
    keep = (lambda out, early=early: early.append(problem.clone_tree(out))) if hold else None
    for shift, is_cold in calls[start:start + plan.batch]:
      problem.copy_into(buf, problem.roll(base, shift))
      elapsed, out = timer(lambda: model(*buf), is_cold, keep)
      if hold:
        outs.append(out)
      if is_cold:
        cold.append(elapsed)
    if hold:
      kept = [] if plan.each_batch else kept  # checked after their batch (judge.TimingPlan)
      kept += [(early[k], outs[k]) for k in range(len(outs)) if start + k in drawn]
  return statistics.median(cold)


@contextlib.contextmanager
def monitored():
  """PY_START and RAISE events through a free sys.monitoring tool, as ForwardTracer records."""
  mon = sys.monitoring  # type: ignore[attr-defined]  # pylint: disable=no-member
  tool = next(t for t in range(6) if mon.get_tool(t) is None)
  mon.use_tool_id(tool, "timing-state")
  seen: list = []
  def start(code, offset):
    del offset
    seen.append(code.co_filename)
    return mon.DISABLE
  mon.register_callback(tool, mon.events.PY_START, start)
  mon.register_callback(tool, mon.events.RAISE, lambda code, offset, exc: seen.append(exc))
  mon.set_events(tool, mon.events.PY_START | mon.events.RAISE)
  try:
    yield
  finally:
    mon.set_events(tool, 0)
    mon.register_callback(tool, mon.events.PY_START, None)
    mon.register_callback(tool, mon.events.RAISE, None)
    mon.free_tool_id(tool)
    mon.restart_events()


def enter_state(state: str, built: list) -> None:
  """Puts this process in `state` (see the module's docstring)."""
  if state == "dynamo":
    importlib.import_module("torch._dynamo")
  if state == "audit":
    tripwire = guards.Tripwire({problem.CANDIDATE_FILE}, tempfile.mkdtemp(), [])
    tripwire.install()
    tripwire.armed = True
  if state == "mon" and not hasattr(sys, "monitoring"):
    raise SystemExit("state mon needs Python 3.12+ (sys.monitoring)")
  if state in ("calls", "trace", "ops", "both", "mon"):
    for _, ref, cand, inputs in built:
      for model in (ref, cand):
        for _ in range(5):
          with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if state in ("ops", "both"):
              stack.enter_context(ops.OpRecorder())
            if state in ("trace", "both"):
              stack.enter_context(guards.ForwardTracer({"candidate.py"}, {"reference.py"}))
            if state == "mon":
              stack.enter_context(monitored())
            model(*inputs)


def measure(args: argparse.Namespace) -> None:
  """One state, in this process: every pair's sides before and after it."""
  device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
  torch.set_num_threads(1)  # as both job processes
  modules = json.loads(pathlib.Path(args.modules).read_text())
  pairs = [p for p in vt.load_pairs(args.data, args.pairs + 8)
           if all(e.fingerprint in modules
                  for e in checks.check_candidate(p["cuda_code"]).extensions)][:args.pairs]
  child._patch_load_inline(modules)  # pylint: disable=protected-access
  built = []
  for item in pairs:
    try:
      built.append((item["id"], *vt.build_pair(item, device)))
    except Exception as e:  # pylint: disable=broad-except
      print(f"{item['id']}: could not build: {type(e).__name__}: {e}", flush=True)
  rows = []
  with torch.no_grad():
    for pid, ref, cand, inputs in built:
      row = {"id": pid}
      for side, model in (("ref", ref), ("cand", cand)):
        row[f"{side}_plain"] = plain(model, inputs, args.trials, device)
        row[f"{side}_judge"] = batched(model, inputs, args.trials, device, hold=False)
        row[f"{side}_child"] = batched(model, inputs, args.trials, device, hold=True)
      rows.append(row)
  enter_state(args.state, built)
  with torch.no_grad():
    for (_, ref, cand, inputs), row in zip(built, rows):
      for side, model in (("ref", ref), ("cand", cand)):
        row[f"{side}_after"] = batched(model, inputs, args.trials, device, hold=True)
  pathlib.Path(args.rows).write_text(json.dumps(rows))


def summarise(state: str, rows: list[dict]) -> dict[str, float]:
  med = lambda xs: round(statistics.median(xs), 3) if xs else float("nan")
  out: dict[str, float] = {"pairs": len(rows)}
  for side in ("ref", "cand"):
    for loop in ("judge", "child", "after"):
      out[f"{side} {loop}/plain"] = med([r[f"{side}_{loop}"] / r[f"{side}_plain"] for r in rows])
    out[f"{side} after-plain us"] = med([r[f"{side}_after"] - r[f"{side}_plain"] for r in rows])
  print(f"{state:6s} " + "  ".join(f"{k} {v}" for k, v in out.items()), flush=True)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("data", help="DICE infilling JSON (kernel_infilling_evaluation.json)")
  parser.add_argument("--pairs", type=int, default=12, help="pairs to time (default %(default)s)")
  parser.add_argument("--trials", type=int, default=100,
                      help="cold calls a loop (default %(default)s)")
  parser.add_argument("--states", default=",".join(STATES),
                      help="comma-separated, of " + ", ".join(STATES))
  parser.add_argument("--cache-dir", default="", help="compile cache (default: a fresh one)")
  parser.add_argument("--out", default="", help="write every number to this JSON file")
  parser.add_argument("--dry-run", action="store_true", help="on the CPU: the plumbing only")
  parser.add_argument("--state", default="", help=argparse.SUPPRESS)  # a child process's state
  parser.add_argument("--modules", default="", help=argparse.SUPPRESS)
  parser.add_argument("--rows", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if not pathlib.Path(args.data).is_file():
    parser.error(f"no DICE file at {args.data}")
  if args.state:
    measure(args)
    return
  states = [s for s in args.states.split(",") if s]
  unknown = sorted(set(states) - set(STATES))
  if unknown:
    parser.error(f"unknown states {unknown}: choose from {', '.join(STATES)}")
  work = pathlib.Path(tempfile.mkdtemp(prefix="timing-state-"))
  cache = pathlib.Path(args.cache_dir) if args.cache_dir else work / "cache"
  modules = compile_modules(vt.load_pairs(args.data, args.pairs + 8), cache)
  (work / "modules.json").write_text(json.dumps(modules))
  report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "python": sys.version.split()[0], "torch": torch.__version__, "states": {}}
  for state in states:  # a fresh process each: a state cannot be left once entered
    rows = work / f"{state}.json"
    cmd = [sys.executable, __file__, args.data, "--state", state, "--modules",
           str(work / "modules.json"), "--rows", str(rows), "--pairs", str(args.pairs),
           "--trials", str(args.trials)] + (["--dry-run"] if args.dry_run else [])
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0 or not rows.is_file():
      print(f"{state}: its process exited {done.returncode}", flush=True)
      continue
    data = json.loads(rows.read_text())
    report["states"][state] = {"summary": summarise(state, data), "rows": data}
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
