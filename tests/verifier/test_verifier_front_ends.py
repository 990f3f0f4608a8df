"""Warm front ends (compile/front_ends.py): cudafe++ and cicc started on the shared headers before
the candidate exists must write exactly what they write when run as usual. Real nvcc throughout
(it compiles here; nothing runs on a GPU)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal

import verifier_kernels as kernels

from verifier_service.compile import checks
from verifier_service.compile import compiler as compile_lib
from verifier_service.compile import confine as confine_lib
from verifier_service.compile import front_ends as front_ends_lib
from verifier_service.compile import limits as limits_lib
from verifier_service.compile import nvcc_split
from verifier_service.compile import procs as compile_procs

# A header the candidates share: big enough to parse for a while, with a device-side warning
# (cicc rereads the header's line to print it, while the warm process is still on the prefix).
_HEADER = """#pragma once
#include <vector>
#include <map>
#include <string>
#include <cmath>
#include <cuda_fp16.h>
constexpr int host_only() { return 3; }
__host__ __device__ inline int both() { return host_only(); }
"""
_BODY = """#include "shared.h"
__global__ void k(float* x) {{ x[threadIdx.x] = {} + both(); }}
std::vector<float> keep;
"""


class _Session:
  """Compiles in one event loop with one FrontEnds, as a server does."""

  def __init__(self, toolchain, root: pathlib.Path,
               confinement: confine_lib.Confinement | None = None):
    self.toolchain = toolchain
    self.root = root
    self.runner = compile_procs.ProcessRunner(2, toolchain.build_env(), confinement=confinement)
    self.front_ends = front_ends_lib.FrontEnds(
        root / "scratch", root / "shim", self.runner.env,
        lambda argv, cwd: self.runner.run(argv, cwd, echo=False), nice=0,
        confinement=confinement)
    (root / "scratch").mkdir()

  async def compile(self, name: str, text: str, warm: bool = True) -> tuple[int, str, bytes]:
    work = self.root / name
    work.mkdir()
    (work / "shared.h").write_text(_HEADER)
    (work / "k.cu").write_text(text)
    argv = [self.toolchain.nvcc, "-gencode=arch=compute_90,code=sm_90", "-c", "k.cu", "-o",
            "k.o"]
    rc, output = await nvcc_split.compile_split(
        argv, text, work, lambda a, cwd: self.runner.run(a, cwd, echo=False),
        module_id="_fixed_dice_id", front_end=self.front_ends.run if warm else None)
    obj = work / "k.o"
    return rc, output, obj.read_bytes() if obj.is_file() else b""


def test_a_warm_front_end_writes_what_the_usual_one_writes(toolchain, tmp_path):
  session = _Session(toolchain, tmp_path)

  async def go():
    try:
      await session.compile("learn", _BODY.format("1.f"))  # no warm process yet: starts them
      await session.front_ends.settle()
      assert session.front_ends.stats()["warm_front_ends"] == 2  # cudafe++ and cicc
      warm = await session.compile("warm", _BODY.format("2.f"))  # first claim: checked
      await session.front_ends.settle()
      broken = await session.compile("warm_broken", _BODY.format("undeclared_name"))
      plain = await session.compile("plain", _BODY.format("2.f"), warm=False)
      plain_broken = await session.compile("plain_broken", _BODY.format("undeclared_name"),
                                           warm=False)
      return warm, broken, plain, plain_broken, session.front_ends.stats()
    finally:
      await session.front_ends.close()

  warm, broken, plain, plain_broken, stats = asyncio.run(go())
  assert warm[0] == 0 and warm[2], warm[1]
  assert warm[2] == plain[2]  # the same object, byte for byte
  assert warm[1] == plain[1]  # and the same printed output (the header's warning included)
  assert "both" in plain[1] or "host_only" in plain[1], plain[1]  # the warning is there to see
  assert broken[0] != 0 and broken[0] == plain_broken[0]
  assert broken[1] == plain_broken[1] and "undeclared_name" in broken[1]
  assert stats["warm_claimed"] >= 3 and stats["warm_off"] == 0, stats
  assert not list((tmp_path / "scratch").iterdir())  # every warm folder removed


def test_an_input_with_another_prefix_or_a_dead_warm_process_runs_as_usual(toolchain, tmp_path):
  session = _Session(toolchain, tmp_path)
  other = "#include <cstdio>\n" + _BODY.format("3.f")  # another first include: another prefix

  async def go():
    try:
      await session.compile("learn", _BODY.format("1.f"))
      await session.front_ends.settle()
      missed = session.front_ends.missed
      mismatch = await session.compile("other", other)
      assert session.front_ends.missed == missed + 2  # both front ends ran as usual
      await session.front_ends.settle()
      for pool in session.front_ends._warm.values():  # an operator kills the warm processes
        for warm in pool:
          os.killpg(warm.process.pid, signal.SIGKILL)
          await warm.process.wait()
      dead = await session.compile("dead", other)
      plain = await session.compile("plain", other, warm=False)
      return mismatch, dead, plain
    finally:
      await session.front_ends.close()

  mismatch, dead, plain = asyncio.run(go())
  assert mismatch[0] == dead[0] == plain[0] == 0, (mismatch[1], dead[1])
  assert mismatch[2] == dead[2] == plain[2]


def test_a_failed_check_says_what_differed():
  describe = front_ends_lib.describe_difference
  files = {"k.ptx": b"ptx", "k.module_id": b"id"}
  assert describe((0, "warn"), (0, "warn"), files, dict(files)) == ""
  assert describe((0, ""), None, files, {}) == "the warm run did not finish"
  said = describe((0, "k.cu(3): warning"), (1, "k.cu(3): error"), files,
                  {"k.ptx": b"other ptx", "extra.o": b""})
  assert "return code 1 (usual 0)" in said
  assert "first differing at 9: 'error' (usual 'warning')" in said
  assert "output files ['extra.o', 'k.ptx'] (usual ['k.module_id', 'k.ptx'])" in said
  assert "contents of k.ptx (9 bytes, usual 3)" in said


def test_the_header_prefix_ends_where_the_main_file_resumes():
  text = (b'# 0 "cuda.cu"\n# 0 "<built-in>"\n# 0 "<command-line>"\n# 1 "cuda.cu"\n'
          b'# 1 "/x/dice_tier_lite.h" 1 3\nint header;\n# 2 "cuda.cu" 2\nint candidate;\n')
  assert text[front_ends_lib.header_prefix(text):] == b'# 2 "cuda.cu" 2\nint candidate;\n'
  assert front_ends_lib.header_prefix(b'# 0 "cuda.cu"\n# 1 "cuda.cu"\nint k;\n') == 0
  assert front_ends_lib.header_prefix(b"int k;\n") == 0
  cudafe = ('cudafe++ --c++17 --orig_src_path_name "/tmp/w/cuda.cu" --module_id_file_name '
            '"nvcc-steps/cuda.module_id" "nvcc-steps/cuda.cpp4.ii"')
  assert nvcc_split.front_end_tool(cudafe) == "cudafe++"
  assert front_ends_lib.input_path(cudafe) == "nvcc-steps/cuda.cpp4.ii"
  assert nvcc_split.front_end_tool('"$CICC_PATH/cicc" --c++17 "a.cpp1.ii" -o "a.ptx"') == "cicc"
  assert nvcc_split.front_end_tool("ptxas -arch=sm_90 a.ptx") is None


def test_the_compiler_warms_its_front_ends_at_start_up_and_builds_with_them(toolchain,
                                                                           tmp_path):
  """The start-up probe (two lite compiles) leaves checked warm front ends; a candidate then
  builds through them."""
  (ext,) = checks.check_candidate(kernels.cuda_candidate(kernels.CUDA_SOURCE, "warmfe")
                                  ).extensions

  async def go():
    compiler = compile_lib.Compiler(toolchain, tmp_path / "cache",
                                    compile_lib.CompilerOptions(max_jobs=2, warm_front_ends=True))
    try:
      await compiler.warm_up()
      await compiler.settle()
      after_probe = compiler.front_end_stats()
      result = await compiler.build(ext, 900)
      return after_probe, result, compiler.front_end_stats()
    finally:
      await compiler.close()

  after_probe, result, stats = asyncio.run(go())
  assert after_probe["warm_claimed"] == 2 and after_probe["warm_off"] == 0, after_probe
  assert result.ok and result.header_tier == "lite", result.log
  assert stats["warm_claimed"] == 4, stats
  steps = {s["step"] for s in result.steps}
  assert steps >= {"cudafe++ (warm)", "cicc (warm)"}, result.steps
  assert any(step.endswith("main.cpp") for step in steps), result.steps  # c++ or g++


def _children(pid: int) -> list[int]:
  try:
    return [int(c) for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
  except OSError:
    return []


def _servers(session: _Session) -> list:
  return [w for pool in session.front_ends._warm.values() for w in pool]


def test_one_fork_server_per_command_serves_a_burst_as_the_usual_runs_would(toolchain, tmp_path):
  """Candidates compiled at once each finish in a child of the same two warm processes (no
  header parsed again, no process started), and each writes what its usual run writes."""
  session = _Session(toolchain, tmp_path)
  values = ["4.f", "5.f", "undeclared_burst", "6.f"]

  async def go():
    try:
      await session.compile("learn", _BODY.format("1.f"))
      await session.front_ends.settle()
      await session.compile("checked", _BODY.format("2.f"))  # the first claim, compared
      servers = {w.process.pid for w in _servers(session)}
      claimed, cpu = session.front_ends.claimed, session.front_ends.cpu_s
      burst = await asyncio.gather(*(session.compile(f"burst{i}", _BODY.format(v))
                                     for i, v in enumerate(values)))
      after = {w.process.pid for w in _servers(session)}
      own = session.front_ends.stats()["warm_server_cpu_s"]
      plain = [await session.compile(f"plain{i}", _BODY.format(v), warm=False)
               for i, v in enumerate(values)]
      return (servers, after, session.front_ends.claimed - claimed,
              session.front_ends.cpu_s - cpu, own, burst, plain)
    finally:
      await session.front_ends.close()

  servers, after, claimed, cpu, own, burst, plain = asyncio.run(go())
  assert len(servers) == 2 and after == servers  # the same cudafe++ and cicc served all four
  # each candidate's cudafe++ and cicc, but the broken one's cicc when its failed host chain
  # cancels it first
  assert 2 * len(values) - 1 <= claimed <= 2 * len(values), claimed
  assert cpu > 0 and own > 0  # the children's CPU, and the servers' own (the prefix, parsed)
  for got, want in zip(burst, plain):
    assert got == want  # return code, printed output, object: byte for byte
  assert burst[2][0] != 0 and "undeclared_burst" in burst[2][1]
  assert not list((tmp_path / "scratch").iterdir())


def test_a_cancelled_compile_kills_its_child_and_the_fork_server_serves_on(toolchain, tmp_path):
  session = _Session(toolchain, tmp_path)

  async def go():
    try:
      await session.compile("learn", _BODY.format("1.f"))
      await session.front_ends.settle()
      await session.compile("checked", _BODY.format("2.f"))
      servers = _servers(session)
      task = asyncio.ensure_future(session.compile("cancelled", _BODY.format("3.f")))
      while not any(w.pending for w in servers):  # until a child runs
        await asyncio.sleep(0.005)
      task.cancel()
      await asyncio.gather(task, return_exceptions=True)
      for _ in range(1000):  # the waiter is killed, its child with it (PR_SET_PDEATHSIG)
        if not any(_children(w.process.pid) for w in servers):
          break
        await asyncio.sleep(0.01)
      left = [_children(w.process.pid) for w in servers]
      codes = [w.process.returncode for w in servers]
      folders = sorted(p.name for w in servers for p in w.folder.iterdir()
                       if p.is_dir() and p.name != "nvcc-steps")
      claimed = session.front_ends.claimed
      again = await session.compile("again", _BODY.format("3.f"))
      plain = await session.compile("plain", _BODY.format("3.f"), warm=False)
      return (task.cancelled(), left, codes, folders, session.front_ends.claimed - claimed,
              again, plain)
    finally:
      await session.front_ends.close()

  cancelled, left, codes, folders, claimed, again, plain = asyncio.run(go())
  assert cancelled
  assert left == [[], []], left  # no child left running
  assert codes == [None, None]  # the fork servers live on
  assert folders == [], folders  # the child's folder went with it
  assert claimed == 2 and again == plain
  assert [p.name for p in (tmp_path / "scratch").iterdir()] == []


# A warm child's hostile candidates, each naming `hostile` wherever it lands (a copy left behind
# is found by that word). A front end reads preprocessed text: an `#include` of a host file is
# resolved (confined: refused) before it, so these are what a child parses itself.
# Front-end state a leaking child would hand on: a diagnostic suppressed (the honest candidate's
# own warning), a packing left pushed (its struct's size, in its object), a global and a header
# function defined again; and line markers naming a host file and the shared header.
_POISON = """#include "shared.h"
#pragma nv_diag_suppress 177
#pragma nv_diagnostic push
#pragma pack(push, 1)
struct Layout { char c; double d; };
int keep = sizeof(Layout);
#line 1 "/etc/passwd"
int hostile_keep = undeclared_hostile;
#line 7 "shared.h"
constexpr int host_only() { return 4; }
"""
# Each of 1000 warnings quotes the whole line: 24 MB printed from 16 KB, past the bound on a file
# (a warm child's printed output is one) and the bound on output read back (a usual run's).
_FLOOD = ('#include "shared.h"\n__global__ void hostile_flood() { '
          + " ".join(f"int hostile{i};" for i in range(1000)) + " }\n")
# The front end's own "catastrophic error: out of memory", at the bound on its data.
_OUT_OF_MEMORY = """#include "shared.h"
template <unsigned long... I>
constexpr unsigned long hostile_count(std::index_sequence<I...>) { return sizeof...(I); }
__global__ void k(unsigned long* x) { x[0] = hostile_count(std::make_index_sequence<1ul << 27>{}); }
"""
# What a leak from _POISON would change: its own warning (#177) and its struct's size.
_HONEST = _BODY.format("7.f") + """struct Layout { char c; double d; };
__global__ void sized(int* x) { int unused_honest; x[0] = sizeof(Layout); }
"""
# Small enough for the hostile candidates to reach quickly; an honest compile fits (its
# preprocessed input is 2 MB).
_BOUNDS = limits_lib.Limits(memory_bytes=1 << 30, cpu_s=60, file_bytes=8 << 20,
                            output_bytes=1 << 20)


def test_hostile_candidates_in_warm_children_leave_the_fork_servers_as_they_were(toolchain,
                                                                                 tmp_path):
  """Confined and bounded as a server's compiles are, hostile candidates finish in children of
  the two warm processes, and an honest one then builds in the same two exactly as its usual run
  does. It fails if a child's front-end state reached its server (the honest candidate's own
  warning would be suppressed, its struct packed, `keep` defined twice), if a child's printed
  output reached the server's (every later child's output starts with the server's), if a
  child's folder or a copy of its input outlives it (one that failed, or was cancelled when its
  other chain failed), or if a hostile candidate cost its server (killed, replaced, a miss)."""
  confinement = confine_lib.Confinement(tmp_path / "cache", toolchain.cuda_root, toolchain.cxx,
                                        toolchain.build_env(), _BOUNDS)
  session = _Session(toolchain, tmp_path, confinement)
  scratch = tmp_path / "scratch"
  hostile = {"poison": _POISON, "flood": _FLOOD, "out_of_memory": _OUT_OF_MEMORY}

  async def outcome(name: str, text: str, warm: bool = True):
    try:
      return await session.compile(name, text, warm)
    except compile_procs.LimitExceeded as e:
      return e.limit, e.log

  def left(servers) -> list[str]:
    """What is in the scratch folder besides the servers' own files, and any file there that
    names `hostile`."""
    own = {w.folder for w in servers}
    extra = [p.name for p in scratch.iterdir() if p not in own]
    extra += [f"{w.folder.name}/{p.name}" for w in servers if w.folder.is_dir()
              for p in w.folder.iterdir() if p.name not in ("nvcc-steps", front_ends_lib.OUTPUT)]
    return extra + [str(p.relative_to(scratch)) for p in scratch.rglob("*")
                    if p.is_file() and b"hostile" in p.read_bytes()]

  async def go():
    try:
      await session.compile("learn", _BODY.format("1.f"))
      await session.front_ends.settle()
      await session.compile("checked", _BODY.format("2.f"))  # the first claim, compared
      servers = _servers(session)
      missed = session.front_ends.missed
      warm, leftovers = {}, {}
      for name, text in hostile.items():
        warm[name] = await outcome(name, text)
        await session.front_ends.settle()  # a cancelled chain's child: its folder removed again
        leftovers[name] = left(servers)
      claimed = session.front_ends.claimed
      honest = await session.compile("honest", _HONEST)
      served = (session.front_ends.claimed - claimed, session.front_ends.missed - missed,
                [w.process.returncode for w in servers],
                {w.process.pid for w in _servers(session)} == {w.process.pid for w in servers})
      plain = {name: await outcome(f"plain_{name}", text, warm=False)
               for name, text in hostile.items()}
      return warm, leftovers, honest, served, plain, await outcome("plain_honest", _HONEST, False)
    finally:
      await session.front_ends.close()
      confinement.close()

  warm, leftovers, honest, served, plain, plain_honest = asyncio.run(go())
  assert served == (2, 0, [None, None], True), served  # the same two servers claimed it, alive
  assert honest[0] == 0 and honest[2], honest[1]
  assert honest == plain_honest  # return code, printed output, object: byte for byte
  assert "unused_honest" in honest[1]  # its warning is there to see (#177, which _POISON hides)
  assert leftovers == {name: [] for name in hostile}, leftovers
  assert warm["poison"] == plain["poison"] and warm["poison"][0] != 0, warm["poison"]
  assert "undeclared_hostile" in warm["poison"][1] and "/etc/passwd(1)" in warm["poison"][1]
  # Over a bound, a child's compile runs as usual (front_ends._over_a_bound): the front ends
  # ignore SIGXFSZ, so over the output bound a child exits 0 with its printed output cut, and out
  # of memory it fails in the front end's own words; the usual runs name the bound.
  for name, limit in (("flood", limits_lib.Limit.OUTPUT),
                      ("out_of_memory", limits_lib.Limit.MEMORY)):
    assert plain[name][0] == limit, plain[name][:2]
    assert plain[name][1].startswith(_BOUNDS.message(limit) + "\n"), plain[name][1][:200]
    assert warm[name] == plain[name], name
  assert not list(scratch.iterdir())


def test_two_builders_of_the_preload_library_at_once_both_get_it(toolchain, tmp_path):
  """Two compilers of one process on one cache build the preload library at the same time (the
  benchmarks' pairs of compilers did): each gets the library, and no partial file is left."""
  env = toolchain.build_env()

  async def both():
    return await asyncio.gather(*(front_ends_lib._build_shim(tmp_path, env) for _ in range(4)))

  paths = asyncio.run(both())
  assert len(set(paths)) == 1 and paths[0] is not None and paths[0].is_file()
  assert os.listdir(tmp_path) == [paths[0].name]
