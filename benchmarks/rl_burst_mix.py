"""What one RL step sends the verifier: N problems x G samples, with the mix a policy produces.

Used by benchmarks/verifier_rl_burst.py. Every sample is built from a problem's known-good phase-1
middle (`source = \"\"\"...\"\"\"`, DICE's infilling items or the synthetic families), so its fate is
known before it is sent:

  correct         the known-good kernel, made a distinct text by one extra `__device__` helper (a
                  policy's samples differ; the helper changes nothing the kernel computes)
  wrong           compiles, wrong values: the launcher's last `return t;` becomes `return t.mul(1.5);`
  compile_error   an undeclared name at the top of the first kernel's body
  crash           `__trap()` at the top of the first kernel (a CUDA error in forward)
  hang            every thread of the first kernel spins on the SM clock and never returns (a spin on a
                  local volatile flag did return: such hangs ended OK on the H200)
  duplicate       the very text of an earlier sample of its group (a low-entropy policy repeating
                  itself; the trainer's client deduplicates these)
  near_duplicate  an earlier sample of its group re-indented with a comment added (the same
                  program; only the server's normalised-text cache can tell)
  repeat          a sample of the same problem from an earlier step, when there is one

Phase 1 completions are the middle in a fenced block (what the model is asked for); phase 2
completions are the whole candidate (prefix + middle + suffix) in a fenced block after a line of
prose. `dry` cuts every kernel launch (`<<<` inside a comment), so every candidate ends at the
static checks (NO_CUSTOM_KERNEL_LAUNCHED) and no compiler runs: the plumbing only, for CI.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence

KINDS = ("correct", "wrong", "compile_error", "crash", "hang", "duplicate", "near_duplicate",
         "repeat")
DEFAULT_MIX = {"correct": 0.40, "wrong": 0.15, "compile_error": 0.12, "crash": 0.03,
               "hang": 0.02, "duplicate": 0.15, "near_duplicate": 0.08, "repeat": 0.05}
_COPIES = ("duplicate", "near_duplicate")  # need an earlier sample of the group
_GLOBAL = re.compile(r"__global__")
_RETURN = re.compile(r"return\s+([A-Za-z_]\w*)\s*;")


@dataclasses.dataclass(frozen=True)
class Problem:
  """A phase-1 problem: its reference and the known-good candidate's three parts."""
  id: str
  reference: str
  prefix: str
  middle: str
  suffix: str


@dataclasses.dataclass(frozen=True)
class Sample:
  problem: Problem
  kind: str  # one of KINDS (a copy keeps its own kind; `of` is what it copies)
  middle: str
  completion: str


def parse_mix(text: str) -> dict[str, float]:
  """`correct=0.5,wrong=0.2,...` (kinds left out get 0); weights need not sum to 1."""
  mix = {}
  for part in filter(None, (p.strip() for p in text.split(","))):
    kind, _, weight = part.partition("=")
    if kind not in KINDS:
      raise ValueError(f"unknown sample kind {kind!r}; kinds: {', '.join(KINDS)}")
    mix[kind] = float(weight)
  if not any(w > 0 for k, w in mix.items() if k not in _COPIES):
    raise ValueError("the mix needs a kind that is not a copy (correct, wrong, ...)")
  return mix


def _split(middle: str) -> tuple[str, str, str]:
  """(opening `source = \"\"\"`, the CUDA text, closing quotes) of a middle."""
  match = re.match(r'(\s*\w+\s*=\s*[A-Za-z]{0,2}(?:"""|\'\'\'))(.*)((?:"""|\'\'\')\s*)$', middle,
                   re.S)
  if match is None:
    raise ValueError("middle is not a `source = \"\"\"...\"\"\"` assignment")
  return match.group(1), match.group(2), match.group(3)


def _kernel_body(cuda: str) -> int:
  """Index just after the `{` that opens the first __global__ function's body."""
  found = _GLOBAL.search(cuda)
  if found is None:
    raise ValueError("no __global__ kernel")
  return cuda.index("{", found.end()) + 1


def _insert(cuda: str, at: int, text: str) -> str:
  return cuda[:at] + text + cuda[at:]


def mutate(middle: str, kind: str, tag: str) -> str:
  """The middle of a fresh sample of `kind` (not a copy), distinct by `tag`."""
  head, cuda, tail = _split(middle)
  _kernel_body(cuda)  # raises ValueError when there is no kernel to edit
  first = _GLOBAL.search(cuda).start()
  cuda = _insert(cuda, first, f"__device__ int dice_sample_{tag}() {{ return 0; }}\n")
  if kind == "wrong":
    returns = list(_RETURN.finditer(cuda))
    if returns:
      last = returns[-1]
      cuda = cuda[:last.start()] + f"return {last.group(1)}.mul(1.5);" + cuda[last.end():]
    else:  # no plain `return t;`: half the grid, half the output left unwritten
      cuda = cuda.replace("<<<", "<<<1 + 0 * ", 1)
  elif kind == "compile_error":
    cuda = _insert(cuda, _kernel_body(cuda), " dice_undeclared_name += 1;")
  elif kind == "crash":
    cuda = _insert(cuda, _kernel_body(cuda), " __trap();")
  elif kind == "hang":
    cuda = _insert(cuda, _kernel_body(cuda), " while (clock64() >= 0) { }")
  elif kind not in ("correct", "repeat"):
    raise ValueError(f"not a fresh kind: {kind}")
  return head + cuda + tail


def reformat(middle: str) -> str:
  """The same program, laid out otherwise: code lines indented two more spaces (not directives,
  not lines continued from the one before) and a comment after the first kernel's `{`."""
  head, cuda, tail = _split(middle)
  cuda = _insert(cuda, _kernel_body(cuda), "  // one thread per element")
  lines, out, continued = cuda.split("\n"), [], False
  for line in lines:
    directive = line.lstrip().startswith("#")
    out.append(line if (directive or continued or not line.strip()) else "  " + line)
    continued = line.endswith("\\")
  return head + "\n".join(out) + tail


def cut_launches(middle: str) -> str:
  """`dry`: every `<<<...>>>` inside a comment, so the static checks end the candidate."""
  return middle.replace("<<<", "/*<<<").replace(">>>", ">>>*/")


def completion(problem: Problem, middle: str, phase: int) -> str:
  if phase == 1:
    return f"```python\n{middle}\n```\n"
  return ("Here is an optimized version with a custom CUDA kernel.\n\n```python\n"
          f"{problem.prefix}{middle}{problem.suffix}```\n")


def plan_step(problems: Sequence[Problem], samples: int, phase: int, mix: dict[str, float],
              rng: random.Random, step: int, history: dict[str, list[str]],
              dry: bool = False) -> list[Sample]:
  """One step's samples, group after group. `history` (problem id -> middles of earlier steps) is
  read for `repeat` and extended with this step's fresh middles."""
  kinds, weights = zip(*((k, w) for k, w in mix.items() if w > 0))
  fresh_kinds = [(k, w) for k, w in zip(kinds, weights) if k not in _COPIES]
  out = []
  for p, problem in enumerate(problems):
    group: list[str] = []
    for g in range(samples):
      kind = rng.choices(kinds, weights)[0]
      if kind in _COPIES and not group:
        kind = rng.choices(*zip(*fresh_kinds))[0]
      if kind == "repeat" and not history.get(problem.id):
        kind = "correct"
      if kind == "duplicate":
        middle = rng.choice(group)
      elif kind == "near_duplicate":
        middle = reformat(rng.choice(group))
      elif kind == "repeat":
        middle = rng.choice(history[problem.id])
      else:
        middle = mutate(problem.middle, kind, f"s{step}p{p}g{g}")
        middle = cut_launches(middle) if dry else middle
      group.append(middle)
      out.append(Sample(problem, kind, middle, completion(problem, middle, phase)))
    history.setdefault(problem.id, []).extend(
        s.middle for s in out[-samples:] if s.kind not in _COPIES + ("repeat",))
  return out
