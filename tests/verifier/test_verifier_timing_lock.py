"""The per-GPU timing lock (timing.GpuLock): one job's timing at a time, never a stuck GPU; and
the CPU core both sides time on (timing.timing_core, timing.on_core).

Real processes contend for a real lock file: a second judge waits for the first, gives up after
its wait (and says so) instead of timing out, and gets the lock once a holder dies, since the
kernel drops an flock with its last descriptor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from verifier_service.run import timing

HOLDER = textwrap.dedent("""
    import sys, time
    from verifier_service.run import timing
    lock = timing.GpuLock(sys.argv[1])
    with lock.held(wait_s=5) as state:
      print(state, flush=True)
      time.sleep(float(sys.argv[2]))
""")


def _holder(path, hold_s):
  proc = subprocess.Popen([sys.executable, "-c", HOLDER, path, str(hold_s)], stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_second_timing_waits_for_the_first(tmp_path):
  path = str(tmp_path / "gpu-x.lock")
  first = _holder(path, 0.5)
  start = time.monotonic()
  with timing.GpuLock(path).held(wait_s=10) as state:
    waited = time.monotonic() - start
  first.wait()
  assert state.startswith("held (waited") and waited >= 0.3  # the holder held it for 0.5 s


def test_a_busy_lock_is_given_up_after_the_wait_and_a_dead_holder_frees_it(tmp_path):
  path = str(tmp_path / "locks" / "gpu-y.lock")
  holder = _holder(path, 60)
  try:
    with timing.GpuLock(path).held(wait_s=0.2) as state:
      assert state.startswith("not acquired in 0.2 s")
    holder.kill()
    holder.wait()
    with timing.GpuLock(path).held(wait_s=5) as state:
      assert state == "held"
  finally:
    holder.kill()


def test_no_lock_off_the_gpu_and_an_unusable_folder_is_reported(tmp_path):
  import torch  # pylint: disable=import-outside-toplevel
  with timing.GpuLock.for_device(torch.device("cpu")).held() as state:
    assert state == "off (not a GPU)"
  blocker = tmp_path / "file"
  blocker.write_text("")
  with timing.GpuLock(str(blocker / "gpu-z.lock")).held() as state:
    assert state.startswith("unavailable (") and "gpu-z.lock" in state


def test_the_timing_core_binds_the_thread_and_gives_its_cpu_set_back():
  import torch  # pylint: disable=import-outside-toplevel
  before = os.sched_getaffinity(0)
  core = timing.timing_core(torch.device("cpu"))
  assert core == max(before)
  with timing.on_core(core) as where:
    assert where == f"on cpu {core}"
    assert os.sched_getaffinity(0) == {core}
  assert os.sched_getaffinity(0) == before
  with timing.on_core(None) as where:
    assert where == "no cpu binding"
  missing = max(before) + 4096  # no such CPU: reported, nothing changed
  with timing.on_core(missing) as where:
    assert where.startswith(f"not bound to cpu {missing}: ")
    assert os.sched_getaffinity(0) == before


def test_a_lock_handed_over_at_once_shortens_the_warm_up_and_one_that_idled_does_not(tmp_path):
  """The warm-up under the lock (GpuLock.warmup_s): short only when another holder released it
  moments ago (the GPU was timing until then), full after an idle gap or on a fresh lock."""
  path = str(tmp_path / "gpu-w.lock")
  lock = timing.GpuLock(path)
  with lock.held() as state:
    assert state == "held" and lock.warmup_s() == timing.WARMUP_S  # nobody released it before
  first = _holder(path, 0.3)  # another process holds it, then releases it
  with lock.held(wait_s=10) as state:
    assert lock.handover_s is not None and lock.handover_s < timing.HANDOVER_S
    assert lock.warmup_s() == timing.HANDOVER_WARMUP_S
    assert state.startswith("held (waited ") and "handed over after" in state
  first.wait()
  time.sleep(timing.HANDOVER_S * 2)
  with lock.held() as state:
    assert state == "held" and lock.warmup_s() == timing.WARMUP_S
  assert lock.warmup_s() == timing.WARMUP_S  # not held


def test_warm_up_runs_for_its_minimum_calls_and_seconds():
  calls = []
  start = time.perf_counter()
  n = timing.warm_up(lambda: calls.append(time.sleep(0.001)), min_s=0.05)
  assert n == len(calls) >= timing.WARMUP_CALLS and time.perf_counter() - start >= 0.05
  assert timing.warm_up(lambda: None, min_s=0.0) == timing.WARMUP_CALLS
