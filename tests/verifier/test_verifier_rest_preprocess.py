"""The split's device halves preprocessed from a snapshot of their headers' macros
(compile/rest_preprocess.py): real nvcc and gcc, each half compiled that way and as usual, the
preprocessed files and objects compared byte for byte. The sources are written to tell the two
ways apart: macros of system headers (their expansions are marked as a system header's), blank
lines and comments where gcc's printer chooses between newlines and line markers, macros of the
candidate's own."""

from __future__ import annotations

import asyncio
import pathlib

from verifier_service.compile import nvcc_split
from verifier_service.compile import procs as compile_procs
from verifier_service.compile import rest_preprocess

HEADER = ("#include <cmath>\n#include <cstdio>\n#include <cuda_fp16.h>\n#include <cuda.h>\n"
          "#include <cuda_runtime.h>\n")
MARKER = '#include "dev.h"\n#line 1\n'

SERVED = {
    "plain": "__global__ void k(float* x, int n) {\n"
             "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) x[i] = fmaxf(x[i], 0.f);\n}\n",
    "system_macros": "\n// a comment\n#define BLOCK 256\n\n/* a block\n   comment */\n"
                     "template <typename T>\n__device__ T relu(T v) { return v > T(0) ? v : T(0); }"
                     "\n\n\n\n__global__ void k(float* __restrict__ x, int n) {\n"
                     "  int i = blockIdx.x * BLOCK + threadIdx.x;\n"
                     "  if (i < n) x[i] = relu(x[i]) + INFINITY + M_PI + EOF;\n}\n",
    "first_blank": "\n\n\n__global__ void k(__half* x) { x[0] = __float2half(HUGE_VALF); }\n",
    # its first token comes from a system header's macro
    "system_first": "__BEGIN_DECLS\n__device__ float f(float v) { return v + NAN; }\n__END_DECLS\n"
                    "__global__ void k(float* x) { x[0] = f(x[1]); }\n",
    # load_inline's lines: headers the device header holds, whose guards make them do nothing
    "quiet_includes": "#include <cuda.h>\n\n#include <cuda_runtime.h>\n#define TILE 256\n"
                      "__global__ void k(float* x) { x[threadIdx.x] *= TILE; }\n",
    "own_macros": "#define STR(x) #x\n#define CAT(a, b) a##b\n#define SQ(v) ((v) * (v))\n"
                  "__global__ void CAT(sq, _kernel)(float* x) { x[0] = SQ(x[1]); }\n"
                  "#undef SQ\n#define SQ(v) (v)\n"
                  "__global__ void named(float* x, const char** s) { x[0] = SQ(2.f); "
                  "*s = STR(named); }\n",
}
# The snapshot cannot stand for these: the usual pass runs.
REFUSED = {
    "counter": "__global__ void k(int* x) { x[0] = __COUNTER__; }\n",
    "include": "#include <vector>\n__global__ void k(float* x) { x[0] = 1.f; }\n",
    # <cmath> is entered again (not guarded as a whole): only quiet headers are blanked
    "loud_include": "#include <cmath>\n__global__ void k(float* x) { x[0] = 1.f; }\n",
    # a guard undone before its header: no longer quiet
    "unguarded": "#undef __CUDA_RUNTIME_H__\n#include <cuda_runtime.h>\n"
                 "__global__ void k(float* x) { x[0] = 1.f; }\n",
    "line": "#line 40 \"other.cu\"\n__global__ void k(float* x) { x[0] = __LINE__; }\n",
    "push_macro": "#pragma push_macro(\"M_PI\")\n#undef M_PI\n#pragma pop_macro(\"M_PI\")\n"
                  "__global__ void k(double* x) { x[0] = M_PI; }\n",
    # a candidate that would read a host file through the preprocessor: never in its own pass
    # (the usual pass runs, confined as every compiler process is)
    "host_file": "#include \"/etc/hostname\"\n__global__ void k(float* x) { x[0] = 1.f; }\n",
    "has_include": "#if __has_include(<vector>)\n__global__ void k(float* x) { x[0] = 1.f; }\n"
                   "#endif\n",
}
# Its own pass prints (M_PI redefined): the usual pass runs, and its warning is the log's.
TALKING = "#define M_PI 3\n__global__ void k(double* x) { x[0] = M_PI; }\n"


class _Builds:
  """Device halves compiled by nvcc_split with and without a RestPreprocessor."""

  def __init__(self, toolchain, root: pathlib.Path, check_every: int = 32,
               module: str | None = None):
    self.toolchain = toolchain
    self.module = module  # load_inline's -DTORCH_EXTENSION_NAME=, per build
    self.root = root
    self.runner = compile_procs.ProcessRunner(2, toolchain.build_env())
    self.rest = rest_preprocess.RestPreprocessor(self.run, MARKER, check_every=check_every)

  async def run(self, argv: list[str], cwd: pathlib.Path) -> tuple[int, str]:
    return await self.runner.run(argv, cwd, echo=False)

  async def compile(self, name: str, rest: str, fast: bool) -> tuple[int, str, bytes, dict]:
    work = self.root / f"{name}-{'fast' if fast else 'usual'}"
    work.mkdir()
    (work / "dev.h").write_text(HEADER)
    text = MARKER + rest
    (work / "cuda.cu").write_text(text)
    argv = [self.toolchain.nvcc, "-gencode=arch=compute_90,code=sm_90", "-c", "cuda.cu", "-o",
            "cuda.o", *([f"-DTORCH_EXTENSION_NAME={name}"] if self.module else [])]
    result = await nvcc_split.compile_split(
        argv, text, work, self.run, module_id="_fixed_dice_id",
        preprocess=self.rest.run if fast else None)
    assert result is not None, "nvcc's dry run is not the one nvcc_split knows"
    rc, output = result
    obj = work / "cuda.o"
    # The preprocessed files, by their suffix (nvcc names them per process).
    steps = {p.name.rsplit("_", 1)[-1]: p.read_bytes()
             for p in (work / "nvcc-steps").glob("*.ii")}
    return rc, output, obj.read_bytes() if obj.is_file() else b"", steps


def _both(builds: _Builds, name: str, rest: str):
  async def go():
    return (await builds.compile(name, rest, fast=True),
            await builds.compile(name, rest, fast=False))
  return asyncio.run(go())


def test_halves_from_the_snapshot_are_the_usual_ones_byte_for_byte(toolchain, tmp_path):
  builds = _Builds(toolchain, tmp_path)
  for name, rest in SERVED.items():
    fast, usual = _both(builds, name, rest)
    assert usual[0] == 0 and usual[2], (name, usual[1])
    assert sorted(usual[3]) == ["cuda.cpp1.ii", "cuda.cpp4.ii"], sorted(usual[3])
    assert fast[3] == usual[3], name  # both preprocessed files, byte for byte
    assert fast[:3] == usual[:3], name  # return code, printed output, object
  stats = builds.rest.stats()
  # Per command (host and device pass): the first half gives the snapshot, the second checks it
  # (both ways), every later one is served from it.
  assert stats == {"rest_preprocessed": 2 * (len(SERVED) - 2), "rest_checked": 2,
                   "rest_commands": 2, "rest_off": 0}, stats


def test_one_snapshot_serves_every_module_name(toolchain, tmp_path):
  """load_inline names each candidate's module on the command line; the name is left out of a
  command's key and snapshot, and each half's own pass defines its own (here it reaches the code)."""
  builds = _Builds(toolchain, tmp_path, module="each")
  rest = ("#define STR2(x) #x\n#define STR(x) STR2(x)\n"
          "__device__ const char* name = STR(TORCH_EXTENSION_NAME);\n"
          "__global__ void k(char* x) { x[0] = name[0]; }\n")
  for name in ("first", "second", "third"):
    fast, usual = _both(builds, name, rest)
    assert fast == usual and usual[0] == 0, name
    assert f'"{name}"'.encode() in fast[3]["cuda.cpp1.ii"], name
  assert builds.rest.stats() == {"rest_preprocessed": 2, "rest_checked": 2, "rest_commands": 2,
                                 "rest_off": 0}, builds.rest.stats()


def test_what_a_snapshot_cannot_stand_for_runs_as_usual(toolchain, tmp_path):
  builds = _Builds(toolchain, tmp_path)
  _both(builds, "learn", SERVED["plain"])
  served = builds.rest.stats()["rest_preprocessed"]
  for name, rest in {**REFUSED, "talking": TALKING}.items():
    fast, usual = _both(builds, name, rest)
    assert fast == usual, name
  assert "M_PI" in usual[1] and "redefined" in usual[1], usual[1]  # the talking one's warning
  stats = builds.rest.stats()
  assert stats["rest_preprocessed"] == served and stats["rest_off"] == 0, stats


def test_a_check_that_finds_a_difference_switches_the_command_off(toolchain, tmp_path):
  """A snapshot that no longer stands for the headers (here one macro taken out of it) is caught
  by the next check, whose usual output is the one used; the command is then off."""
  builds = _Builds(toolchain, tmp_path, check_every=1)
  _both(builds, "learn", SERVED["plain"])
  snapshots = builds.rest._snapshots  # pylint: disable=protected-access
  assert len(snapshots) == 2
  for snapshot in snapshots.values():
    snapshot.macros = "\n".join(line for line in snapshot.macros.split("\n")
                                if not line.startswith("#define M_PI "))
  fast, usual = _both(builds, "checked", SERVED["system_macros"])
  assert fast == usual
  again, plain = _both(builds, "after", SERVED["system_macros"].replace("256", "128"))
  assert again == plain
  assert builds.rest.stats() == {"rest_preprocessed": 0, "rest_checked": 0, "rest_commands": 0,
                                 "rest_off": 2}, builds.rest.stats()


def test_only_a_plain_gcc_preprocessing_step_is_taken():
  step = rest_preprocess.parse_step(
      'gcc -D__CUDA_ARCH__=900 -E -x c++ -D__CUDACC__ "-I/usr/local/cuda/include" '
      '-isystem /opt/torch/include -include "cuda_runtime.h" -m64 "cuda.cu" '
      '-o "nvcc-steps/tmpxft_1_cuda.cpp1.ii"')
  assert step is not None and step.input_name == "cuda.cu"
  assert step.with_files("a.cu", "a.ii", drop_includes=True, extra=("-imacros", "m.h")) == [
      "gcc", "-D__CUDA_ARCH__=900", "-E", "-x", "c++", "-D__CUDACC__", "-I/usr/local/cuda/include",
      "-isystem", "/opt/torch/include", "-m64", "-imacros", "m.h", "a.cu", "-o", "a.ii"]
  for command in ['gcc -E -I"$CUDA/include" cuda.cu -o x.ii',  # a shell variable
                  "gcc -E -Iinclude cuda.cu -o x.ii",  # a folder relative to the build's
                  "gcc -E -isystem include cuda.cu -o x.ii",
                  "gcc -E a.cu b.cu -o x.ii",  # two inputs
                  "gcc -E sub/cuda.cu -o x.ii",  # an input in another folder
                  "gcc -c cuda.cu -o x.o",  # not preprocessing
                  "cicc --orig_src_file_name cuda.cu x.ii -o x.ptx",
                  "gcc -E 'unbalanced cuda.cu -o x.ii"]:
    assert rest_preprocess.parse_step(command) is None, command


def test_the_snapshot_keeps_the_headers_macros_under_their_files_markers():
  dd = ('# 0 "head.cu"\n# 0 "<built-in>"\n#define __GNUC__ 13\n#define __x86_64__ 1\n'
        '# 0 "<command-line>"\n#define __CUDACC__ 1\n'
        '# 1 "/usr/include/math.h" 1 3 4\nextern double sin(double);\n#define M_PI 3.14\n'
        '# 2 "head.cu" 2\n#undef M_PI\nint code;\n')
  assert rest_preprocess.macro_snapshot(dd) == (
      '# 0 "head.cu"\n# 0 "<command-line>"\n#define __CUDACC__ 1\n'
      '# 1 "/usr/include/math.h" 1 3 4\n#define M_PI 3.14\n# 2 "head.cu" 2\n#undef M_PI\n')


def test_the_stub_is_the_prefixs_end_from_its_last_marker_that_code_follows():
  prefix = ('# 1 "/usr/include/a.h" 1 3 4\nint a;\n# 9 "/usr/include/b.h" 1 3\nint b;\n'
            'int c;\n# 10 "/usr/include/a.h" 2 3 4\n# 5 "dev.h" 2\n')
  assert rest_preprocess.stub_text(prefix) == (
      '# 9 "/usr/include/b.h" 3\nint b;\nint c;\n# 10 "/usr/include/a.h" 3 4\n# 5 "dev.h"\n')
  assert rest_preprocess.stub_text('# 1 "dev.h" 1\n') == ""


def test_a_repeated_include_is_quiet_unless_it_entered_its_file():
  output = ('# 0 "h.q.cu"\n# 1 "dev.h" 1\nint dev;\n# 2 "h.q.cu" 2\n'
            '# 1 "/usr/include/c++/12/cmath" 1 3\nint again;\n# 4 "h.q.cu" 2\n')
  # line 2: cuda.h (nothing printed), line 3: cmath (entered, back at line 4), line 4: cstdio
  assert rest_preprocess.quiet_includes(output, "h.q.cu", ["cuda.h", "cmath", "cstdio"]) == {
      "cuda.h", "cstdio"}
