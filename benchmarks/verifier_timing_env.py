"""What in the verifier's job processes slows a timed call down (GPU; issue 16, timing).

benchmarks/verifier_timing.py found the service's timings of DICE references 1.38x and of
candidates 1.85x what the same timer measures in a plain process, at one slot per GPU (H200,
2026-12-01): not concurrency, then, but something in the processes the verdict's times come from.
This script times the same DICE references with the verifier's own Timer in fresh processes that
differ in one respect each, so the ratio to `plain` names the cause:

  plain                 CUDA set up, the reference built, timed: the in-process figure
  plain_again           the same, last: what running first (after the GPU idled) costs
  rolled                plain, with fresh rolled input values copied in before each timed call
                        (outside the events), as the judge times
  forked                plain, in a fork of a process that imported torch before CUDA existed,
                        as the worker forks the judge
  profile_after_sandboxed  the fix to try for the candidate's process: sandboxed, no profiler
                        session before timing (libcupti is mapped by `import torch` already), then
                        a first session after timing, inside the sandbox: does it still work?
  profiled              after one `probes.kernel_profile` (torch.profiler with CUDA activity,
                        CUPTI), as the candidate's process runs at set-up and for its profile probe
  profiled_teardown     the same with TEARDOWN_CUPTI=1 (kineto finalises CUPTI when it stops)
  seccomp               the verifier's seccomp filter alone (sandbox._seccomp)
  sandboxed             every sandbox layer (sandbox.lock_down), as the judge times the reference
  candidate_like        sandboxed + profiled + the armed audit hook (guards.Tripwire)
  tripwire              plain + the armed audit hook alone
  pinned                plain, the process bound to one CPU core (the last) before CUDA starts

With --conditions and --repeat the chosen conditions run in turn, that many rounds (process-to-
process spread: each process is compared with the median over every `plain` process).

  python benchmarks/verifier_timing_env.py DICE_JSON [--pairs 12] [--trials 100]   # GPU, ~2 min
  python benchmarks/verifier_timing_env.py DICE_JSON --conditions plain,pinned,tripwire --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CONDITIONS = ("plain", "profiled", "profiled_teardown", "seccomp", "sandboxed", "candidate_like",
              "rolled", "forked", "profile_after_sandboxed", "plain_again", "tripwire", "pinned")
DEFAULT_RUN = CONDITIONS[:10]


def child(condition: str, data: str, count: int, trials: int) -> dict[str, object]:
  """Runs in a fresh process: per reference, (warm median, cold median) in microseconds; "_note"
  says what else the condition found."""
  condition = condition.replace("_again", "")
  if condition != "forked":
    return _measure(condition, data, count, trials)
  import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (as the worker)
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # the judge's situation: a fork of a process that imported torch, CUDA set up here
    os.close(read)
    with os.fdopen(write, "w") as f:
      json.dump(_measure("plain", data, count, trials), f)
    os._exit(0)  # pylint: disable=protected-access
  os.close(write)
  with os.fdopen(read) as f:
    text = f.read()
  os.waitpid(pid, 0)
  return json.loads(text)


def _measure(condition: str, data: str, count: int, trials: int) -> dict[str, object]:
  """The references built, the condition applied, each timed (`child` describes the result)."""
  from verifier_service.run import sandbox  # pylint: disable=import-outside-toplevel
  if condition == "pinned":
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
  sandboxed = condition in ("sandboxed", "candidate_like", "profile_after_sandboxed")
  job_dir = tempfile.mkdtemp(prefix="timing-env-")
  netns = sandbox.enter_namespaces() if sandboxed else ""
  note = ""
  import torch  # pylint: disable=import-outside-toplevel
  from verifier_service.run import problem, timing  # pylint: disable=import-outside-toplevel
  from verifier_service.untrusted import guards, probes  # pylint: disable=import-outside-toplevel
  device = torch.device("cuda")
  torch.cuda.init()
  torch.zeros(1, device=device)
  items = json.load(open(data))[:count]
  refs = []
  for item in items:
    module = problem.exec_module(f"ref_{item['id']}", item["pytorch_code"], f"ref_{item['id']}.py")
    model = problem.build(module.Model, module.get_init_inputs, 42, device).to(device)
    refs.append((item["id"], model, problem.inputs(module.get_inputs, 43, device, None)))
  if condition in ("profiled", "profiled_teardown", "candidate_like"):
    for _, model, args in refs:
      probes.kernel_profile(lambda m=model, a=args: m(*a), [])
  if condition == "seccomp":
    sandbox._seccomp(None)  # pylint: disable=protected-access
  if sandboxed:
    os.chdir(job_dir)
    cuda_root = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    sandbox.lock_down(sandbox.Policy(job_dir=job_dir, read_only=sandbox.default_read_only(
        [cuda_root]), memory_bytes=32 << 30), netns, None)
  if condition in ("candidate_like", "tripwire"):
    wire = guards.Tripwire({problem.CANDIDATE_FILE}, job_dir, sandbox.default_read_only([]))
    wire.install()
    wire.armed = True
  timer = timing.Timer(device)
  out: dict[str, object] = {}
  with torch.no_grad():
    for ident, model, args in refs:
      rolled = condition == "rolled"  # as the judge: fresh rolled values copied in before each call
      buf = problem.clone_tree(args) if rolled else args
      fn = lambda m=model, b=buf: m(*b)
      timing.warm_up(lambda f=fn: (f(), torch.cuda.synchronize()))
      warm, cold = [], []
      for k in range(trials):  # warm and cold calls interleaved, as the judge times
        for cold_call, samples in ((False, warm), (True, cold)):
          if rolled:
            problem.copy_into(buf, problem.roll(args, 2 * k + 1 + cold_call))
          samples.append(timer(fn, cold_call)[0])
      out[str(ident)] = [statistics.median(warm), statistics.median(cold)]
    if condition == "profile_after_sandboxed":  # does a first session work after the sandbox closed?
      _, model, args = refs[0]
      profile = probes.kernel_profile(lambda: model(*args), [])
      note = (f"a first profiler session after timing, inside the sandbox: {profile['note']}"
              if profile["note"] else "a first profiler session after timing, inside the sandbox, "
              f"worked: {len(profile['library'])} kernel name(s), e.g. {profile['library'][:1]}")
  out["_note"] = note
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("data")
  parser.add_argument("--pairs", type=int, default=12)
  parser.add_argument("--trials", type=int, default=100)
  parser.add_argument("--child", choices=CONDITIONS, help=argparse.SUPPRESS)
  parser.add_argument("--conditions", default=",".join(DEFAULT_RUN),
                      help="conditions to run, in this order (default: %(default)s)")
  parser.add_argument("--repeat", type=int, default=1, help="rounds of --conditions")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  if args.child:
    print("RESULT " + json.dumps(child(args.child, args.data, args.pairs, args.trials)), flush=True)
    return
  chosen = args.conditions.split(",")
  if "plain" not in chosen or not set(chosen) <= set(CONDITIONS):
    sys.exit(f"--conditions must include plain and name only {', '.join(CONDITIONS)}")
  results = {}
  for condition, round_ in [(c, r) for r in range(args.repeat) for c in chosen]:
    label = condition if args.repeat == 1 else f"{condition}#{round_ + 1}"
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}  # as the verifier runs
    if condition == "profiled_teardown":
      env["TEARDOWN_CUPTI"] = "1"
    proc = subprocess.run([sys.executable, __file__, args.data, "--pairs", str(args.pairs),
                           "--trials", str(args.trials), "--child", condition],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
      print(f"{label}: failed (exit {proc.returncode}): {proc.stderr[-1500:]}", flush=True)
      continue
    results[label] = json.loads(lines[-1][len("RESULT "):])
  notes = {c: r.pop("_note", "") for c, r in results.items()}
  plains = [r for c, r in results.items() if c.split("#")[0] == "plain"]
  if not plains:
    sys.exit("the plain condition failed; nothing to compare")
  base = {i: [statistics.median(r[i][k] for r in plains if i in r) for k in (0, 1)]
          for i in plains[0]}
  print(f"{'condition':22} {'warm x plain':>12} {'cold x plain':>12} {'warm +us':>9} {'cold +us':>9}"
        f"   (medians over {len(base)} DICE references; plain warm median "
        f"{statistics.median(v[0] for v in base.values()):.1f} us)")
  summary = {}
  for condition, got in results.items():
    ids = [i for i in got if i in base]
    ratio = [statistics.median(got[i][k] / base[i][k] for i in ids) for k in (0, 1)]
    added = [statistics.median(got[i][k] - base[i][k] for i in ids) for k in (0, 1)]
    summary[condition] = {"warm_ratio": ratio[0], "cold_ratio": ratio[1], "warm_added_us": added[0],
                          "cold_added_us": added[1]}
    print(f"{condition:22} {ratio[0]:12.2f} {ratio[1]:12.2f} {added[0]:9.1f} {added[1]:9.1f}"
          + (f"   {notes[condition]}" if notes[condition] else ""))
    summary[condition]["note"] = notes[condition]
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"summary": summary, "per_reference_us": results}, f, indent=1)


if __name__ == "__main__":
  main()
