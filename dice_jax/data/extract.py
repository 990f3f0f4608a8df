"""Code out of a model's generation, and the graded candidate file built from it.

Generations are messy: prose around fenced blocks, several blocks, a fence the sampler cut off,
no fence at all, a whole file when only the CUDA string was asked for. Extraction never raises on
any text: it returns an `Extraction` whose `failure` says why no candidate could be built (a
"format" failure, scored by the format reward and never sent to the verifier).

Phase 1 (infilling). The model is asked for the `source = '''...'''` assignment (ARCHITECTURE.md,
"Kernel format"). We take *only* that assignment from the generation and grade `prefix + middle +
suffix`, where the prefix and suffix are the problem's fixed scaffold. Whatever else the generation
contains (its own `cpp_src`, `load_inline`, a `ModelNew` that calls torch) is dropped, so a
generation that rewrites the scaffold cannot route around the kernel. The middle must be exactly one
statement assigning a plain string literal to `source` (no f-string, no expression), checked with
`ast`, so the middle cannot smuggle code into the graded file either. Where the assignment is found:
  1. the last fenced block (complete blocks first, then a cut-off one) containing it;
  2. the generation's bare text, when it has no fenced block with it;
  3. otherwise a fenced block of raw CUDA (contains `__global__`, no triple quotes) is wrapped as
     `source = r'''...'''` (raw, so `"\\n"` in a C string stays the two characters the model wrote).
     Bare unfenced CUDA is not wrapped: without a fence prose cannot be told from code.
When several assignments qualify, the last one wins (as it would in Python).

Phase 2 (end to end). The candidate is the last complete fenced block that defines `ModelNew`
(else the last complete block, else a cut-off block, else the bare text). It must parse and define
a top-level `class ModelNew`; everything else is the verifier's job.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
import warnings

FORMAT = "format"
MAX_GENERATION_CHARS = 1_000_000
_MAX_TRIES = 8

_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)(```|\Z)", re.S)
_ASSIGN_START = re.compile(r"^[ \t]*(?P<name>[A-Za-z_]\w*)[ \t]*=[ \t]*[A-Za-z]{0,2}(?:\"\"\"|''')", re.M)
_MODEL_NEW = re.compile(r"^class[ \t]+ModelNew\b", re.M)


@dataclasses.dataclass(frozen=True)
class CodeBlock:
  """A fenced block: its info string (lower-cased first word), body, and whether it was closed."""

  lang: str
  body: str
  complete: bool


@dataclasses.dataclass(frozen=True)
class Extraction:
  """What was taken from one generation.

  `candidate` is the file to grade (None on failure); `middle` is the phase-1 middle; `failure` is
  a one-line reason starting with "format:" when no candidate could be built.
  """

  candidate: str | None = None
  middle: str | None = None
  failure: str | None = None

  @property
  def ok(self) -> bool:
    return self.failure is None


def _fail(reason: str) -> Extraction:
  return Extraction(failure=f"{FORMAT}: {reason}")


def clean_text(text: str) -> str:
  """Makes any str safe to put on the wire: lone surrogates (from byte-level decoding) become '?'."""
  return text.encode("utf-8", errors="replace").decode("utf-8")


def code_blocks(text: str) -> list[CodeBlock]:
  """Every ``` fenced block in order; a final unclosed fence gives a block with complete=False."""
  blocks = []
  for m in _FENCE.finditer(text):
    info = m.group(1).strip().split()
    blocks.append(CodeBlock(lang=info[0].lower() if info else "", body=m.group(2),
                            complete=m.group(3) == "```"))
  return blocks


def _ordered(blocks: list[CodeBlock]) -> list[CodeBlock]:
  """Preference order: complete blocks last-to-first, then incomplete ones last-to-first."""
  return ([b for b in reversed(blocks) if b.complete] + [b for b in reversed(blocks) if not b.complete])


def _parse(code: str) -> ast.Module | str:
  """The module, or a short reason it does not parse (SyntaxError, or NUL bytes: ValueError)."""
  try:
    with warnings.catch_warnings():  # odd escapes in generated code are not our warnings to print
      warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
      return ast.parse(code)
  except SyntaxError as e:
    where = f"line {e.lineno}: " if e.lineno else ""
    return f"does not parse as Python ({where}{e.msg})"
  except ValueError as e:  # NUL bytes on Python 3.11
    return f"does not parse as Python ({e})"


def _assignment_at(code: str, start: int, var: str) -> str | None:
  """The complete `var = <string literal>` statement starting at `start`, or None.

  `tokenize` finds where the statement ends (escapes, implicit concatenation, both quote styles);
  `ast` then checks it is one assignment of a plain str constant to `var`.
  """
  rest = code[start:]
  lines = io.StringIO(rest).readlines()  # the lines tokenize numbers: split at "\n" only
  tokens = tokenize.generate_tokens(io.StringIO(rest).readline)
  end = None
  try:
    for tok in tokens:
      if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.COMMENT):
        break
      if tok.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
        end = tok.end
  except (tokenize.TokenError, SyntaxError, ValueError):
    return None
  if end is None:
    return None
  segment = "".join(lines[:end[0] - 1]) + lines[end[0] - 1][:end[1]]
  segment = segment.lstrip(" \t")
  tree = _parse(segment)
  if isinstance(tree, str) or len(tree.body) != 1:
    return None
  stmt = tree.body[0]
  if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
          and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == var
          and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
    return None
  return segment


def _last_assignment(code: str, var: str) -> tuple[str | None, bool]:
  """(the last valid `var = '''...'''` statement in `code`, whether any attempt was seen)."""
  starts = [m.start("name") for m in _ASSIGN_START.finditer(code) if m.group("name") == var]
  for start in reversed(starts[-_MAX_TRIES:]):  # bounded: each try may tokenize to the end
    segment = _assignment_at(code, start, var)
    if segment is not None:
      return segment, True
  return None, bool(starts)


def _wrap_cuda(body: str, var: str) -> str | None:
  if "__global__" not in body:
    return None
  for quote in ('"""', "'''"):
    if quote not in body:
      middle = f"{var} = r{quote}\n{body.strip(chr(10))}\n{quote}"
      return middle if _assignment_at(middle, 0, var) is not None else None
  return None


def extract_middle(text: str, *, var: str = "source") -> Extraction:
  """The phase-1 middle (`var = '''<CUDA>'''`) from a generation; see the module docstring."""
  if len(text) > MAX_GENERATION_CHARS:
    return _fail(f"generation is {len(text)} characters, over the {MAX_GENERATION_CHARS} limit")
  text = clean_text(text)
  blocks = _ordered(code_blocks(text))
  attempted = False
  for code in [b.body for b in blocks] + [text]:
    segment, seen = _last_assignment(code, var)
    attempted |= seen
    if segment is not None:
      return Extraction(middle=segment)
  if attempted:  # an assignment that went wrong is not raw CUDA to be wrapped
    return _fail(f"the `{var} = \"\"\"...\"\"\"` assignment is unterminated or not a plain string literal")
  for block in blocks:
    if block.complete and (wrapped := _wrap_cuda(block.body, var)) is not None:
      return Extraction(middle=wrapped)
  if not blocks and not text.strip():
    return _fail("empty generation")
  return _fail(f"no `{var} = \"\"\"...\"\"\"` assignment and no fenced CUDA block with a __global__ kernel")


def assemble(prefix: str, middle: str, suffix: str) -> str:
  """The graded phase-1 file: `prefix + middle + suffix`, with a line break at each seam if missing.

  For DICE's items (prefix ends and suffix starts with a newline) this is exact concatenation, so
  the known-good middle reassembles the original `cuda_code` byte for byte.
  """
  if prefix and not prefix.endswith("\n"):
    prefix += "\n"
  if not suffix.startswith("\n"):
    suffix = "\n" + suffix
  return prefix + middle + suffix


def extract_infilling(text: str, prefix: str, suffix: str, *, var: str = "source") -> Extraction:
  """Phase 1: the middle from `text`, assembled into the scaffold."""
  found = extract_middle(text, var=var)
  if not found.ok:
    return found
  return Extraction(candidate=assemble(prefix, found.middle, suffix), middle=found.middle)


def _defines_model_new(tree: ast.Module) -> bool:
  return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)


def extract_end_to_end(text: str) -> Extraction:
  """Phase 2: the whole candidate file from `text`; see the module docstring for the choice."""
  if len(text) > MAX_GENERATION_CHARS:
    return _fail(f"generation is {len(text)} characters, over the {MAX_GENERATION_CHARS} limit")
  text = clean_text(text)
  blocks = code_blocks(text)
  complete = [b for b in reversed(blocks) if b.complete]
  choices = ([b.body for b in complete if _MODEL_NEW.search(b.body)] + [b.body for b in complete]
             + [b.body for b in reversed(blocks) if not b.complete])
  if not blocks:
    choices.append(text)
  code = next((c for c in choices if c.strip()), None)
  if code is None:
    return _fail("no code in the generation")
  code = code.strip("\n") + "\n"
  tree = _parse(code)
  if isinstance(tree, str):
    return _fail(f"the code {tree}")
  if not _defines_model_new(tree):
    return _fail("the code does not define a top-level `class ModelNew`")
  return Extraction(candidate=code)


def extract_candidate(text: str, *, phase: int, prefix: str | None = None,
                      suffix: str | None = None) -> Extraction:
  """Dispatch on the phase: 1 → `extract_infilling` (needs the scaffold), 2 → `extract_end_to_end`."""
  if phase == 1:
    if prefix is None or suffix is None:
      raise ValueError("phase-1 extraction needs the problem's prefix and suffix")
    return extract_infilling(text, prefix, suffix)
  if phase == 2:
    return extract_end_to_end(text)
  raise ValueError(f"phase must be 1 or 2, got {phase!r}")
