"""Extraction of code from odd generations and assembly of the graded phase-1 file."""

import ast
import random

import pytest

from dice_jax.data import extract as E
from dice_jax.data import problems as P

MIDDLE = 'source = """\n#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = 1.0f; }\n"""'
PREFIX = "import torch\nfrom torch.utils.cpp_extension import load_inline\n\n"
SUFFIX = "\n\ncpp_src = 'void f();'\next = load_inline(name='e', cpp_sources=cpp_src, cuda_sources=source)\n"
MODEL_NEW = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def _middle(text):
  return E.extract_middle(text).middle


@pytest.mark.parametrize("text", [
    MIDDLE,
    f"```python\n{MIDDLE}\n```",
    f"Sure! Here is the kernel:\n\n```python\n{MIDDLE}\n```\nIt launches one thread per element.",
    f"```py\n{MIDDLE}\n```",
    f"```\n{MIDDLE}\n```",
    f"```python\n{MIDDLE}\n",                     # fence cut off by the token limit
    f"```python\n{MIDDLE}```",                    # closing fence glued to the last line
    f"Text first.\n{MIDDLE}\nThen a remark.",    # no fence, prose around
    f"```python\n    {MIDDLE}\n```",              # indented
    f"```python\n{MIDDLE}  # the kernel\n```",    # trailing comment
])
def test_middle_found_in_odd_wrappings(text):
  assert _middle(text) == MIDDLE


def test_unusual_line_separators_inside_the_cuda_string():
  middle = 'source = """\n// form\x0cfeed and \u2028 line separator\n__global__ void k() {}\n"""'
  assert _middle(f"```python\n{middle}\n```\nDone.") == middle


def test_whole_file_emission_keeps_only_the_source_assignment():
  hostile = (PREFIX + MIDDLE + "\n\ncpp_src = 'x'\nimport os\nos.system('rm -rf /')\n"
             "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n")
  found = E.extract_infilling(f"```python\n{hostile}\n```", PREFIX, SUFFIX)
  assert found.ok and found.middle == MIDDLE
  assert found.candidate == PREFIX + MIDDLE + SUFFIX
  assert "os.system" not in found.candidate and "torch.relu" not in found.candidate


def test_last_complete_block_wins_and_complete_beats_cut_off():
  first = MIDDLE.replace("1.0f", "2.0f")
  cut_off = '```python\nsource = """\n__global__ void half('
  text = f"```python\n{first}\n```\nbetter:\n```python\n{MIDDLE}\n```\n{cut_off}"
  assert _middle(text) == MIDDLE
  both = f"```python\n{first}\n{MIDDLE}\n```"
  assert _middle(both) == MIDDLE  # last assignment wins, as in Python


@pytest.mark.parametrize("text,reason", [
    ("", "empty generation"),
    ("   \n\t", "empty generation"),
    ("I cannot help with that.", "no `source"),
    ("```python\nprint('hello')\n```", "no `source"),
    ('```python\nsource = """\n__global__ void k() {}\n', "unterminated"),   # cut off inside the string
    ('```python\nsource = f"""{x}"""\n```', "not a plain string literal"),
    ('```python\nsource = """a""" + evil()\n```', "not a plain string literal"),
    ('```python\nsource = b"""__global__"""\n```', "not a plain string literal"),
    ("__global__ void k() {}", "no `source"),                  # bare CUDA without a fence is not wrapped
    ("```cuda\nint main() {}\n```", "no `source"),              # fenced, but no kernel
    ('```cuda\n__global__ void k() { /* """ */ }\n/* \'\'\' */\n```', "no `source"),  # cannot be quoted
])
def test_format_failures_are_values_not_exceptions(text, reason):
  found = E.extract_infilling(text, PREFIX, SUFFIX)
  assert not found.ok and found.candidate is None
  assert found.failure.startswith("format: ") and reason in found.failure


def test_fenced_raw_cuda_is_wrapped_as_a_raw_string():
  cuda = '#include <cstdio>\n__global__ void k() { printf("%d\\n", 1); }'
  found = E.extract_infilling(f"```cuda\n{cuda}\n```", PREFIX, SUFFIX)
  assert found.ok and found.middle.startswith('source = r"""')
  namespace = {}
  exec(found.middle, namespace)
  assert namespace["source"].strip() == cuda  # the backslash-n the model wrote survives


def test_assembly_adds_missing_line_breaks_only():
  assert E.assemble("a\n", "m", "\nz") == "a\nm\nz"
  assert E.assemble("a", "m", "z") == "a\nm\nz"
  assert E.assemble("", "m", "\nz") == "m\nz"


def test_real_dice_and_bundled_middles_round_trip(shared_dir):
  problems = P.load_problems(shared_dir / "data/dice/kernel_infilling_evaluation.json") + P.load_bundled()
  for p in problems:
    found = E.extract_infilling(f"Here you go.\n```python\n{p.known_good}\n```\n", p.prefix, p.suffix)
    assert found.ok, (p.id, found.failure)
    assert found.middle == p.middle and found.candidate == p.known_good, p.id


@pytest.mark.parametrize("text,ok", [
    (f"```python\n{MODEL_NEW}```", True),
    (f"Explanation.\n```python\n{MODEL_NEW}```\nDone.", True),
    (MODEL_NEW, True),                                                        # bare code
    (f"```cuda\n__global__ void k() {{}}\n```\n```python\n{MODEL_NEW}```", True),
    (f"```python\n{MODEL_NEW}```\n```bash\npython run.py\n```", True),        # ModelNew block preferred
    (f"```python\n{MODEL_NEW}", True),                                        # cut off after a complete file
    (f"```python\n```\nAgain:\n```python\n{MODEL_NEW}", True),                  # empty block, then cut-off one
    ("```python\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n", False),  # cut off mid-body
    ("hello", False),
    ("```python\nimport torch\n```", False),
    ("```python\n```", False),
    ("```python\ndef f(:\n```", False),
    ("```python\nx = '\x00'\n```", False),  # a raw NUL is never valid Python source
])
def test_end_to_end_extraction(text, ok):
  found = E.extract_end_to_end(text)
  assert found.ok == ok, found.failure
  if ok:
    assert ast.parse(found.candidate)
  else:
    assert found.failure.startswith("format: ")


def test_non_utf8_and_huge_generations():
  lone_surrogate = MODEL_NEW + "# \udcff\n"
  found = E.extract_end_to_end(f"```python\n{lone_surrogate}```")
  assert found.ok and "\udcff" not in found.candidate
  found.candidate.encode("utf-8")  # safe for protobuf
  huge = "x" * (E.MAX_GENERATION_CHARS + 1)
  assert "over the" in E.extract_end_to_end(huge).failure
  assert "over the" in E.extract_middle(huge).failure


def test_extract_candidate_dispatch_and_errors():
  found = E.extract_candidate(MIDDLE, phase=1, prefix=PREFIX, suffix=SUFFIX)
  assert found.candidate == PREFIX + MIDDLE + SUFFIX
  assert E.extract_candidate(f"```python\n{MODEL_NEW}```", phase=2).candidate == MODEL_NEW
  with pytest.raises(ValueError, match="needs the problem's prefix and suffix"):
    E.extract_candidate(MIDDLE, phase=1)
  with pytest.raises(ValueError, match="phase must be 1 or 2"):
    E.extract_candidate(MIDDLE, phase=3)


def test_random_garbage_never_raises():
  rng = random.Random(0)
  alphabet = ['```', '```python\n', '"""', "'''", 'source = ', '__global__ ', 'class ModelNew:', '\n', ' ',
              '\\', '{', '(', 'x', '\x00', '\udc80', 'r"""', '#', 'é', '\t']
  for _ in range(400):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    for found in (E.extract_middle(text), E.extract_end_to_end(text),
                  E.extract_infilling(text, PREFIX, SUFFIX)):
      assert found.ok != (found.failure is not None)
      if found.middle is not None:
        tree = ast.parse(found.middle)
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Assign)
