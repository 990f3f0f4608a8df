"""Chat prompts for the two phases, as overridable templates.

A prompt is a list of chat messages `[{"role": "system"|"user", "content": str}]`; the tokenizer's
`apply_chat_template(messages, add_generation_prompt=True)` turns it into tokens, so this module
knows nothing of any model's chat format.

Templates are `str.format` strings with named fields (write `{{`/`}}` for literal braces):
  {reference}   the PyTorch reference source (Model, get_inputs, get_init_inputs)
  {problem_id}  the problem's id
  {target}      a paragraph on the target GPU, precision and shapes ("" when none is set)
  {arch} {precision} {shapes}   the raw TargetSpec values ("" when unset)
and for phase 1 also
  {prefix} {suffix}  the fixed scaffold around the missing middle
  {scaffold}         prefix + MISSING_MARKER + suffix: the whole file with the gap marked

Phase-1 choice: the prompt shows the *whole* scaffold with the gap marked, not only the prefix,
because the middle must define exactly the host functions that the suffix declares in `cpp_src`,
exports through `load_inline(functions=[...])` and calls from `ModelNew.forward`; a model that
cannot see the suffix can only guess those names and signatures. It asks for the
`source = \"\"\"...\"\"\"` assignment alone in one fenced block: that is what extraction takes, and
anything else the model writes is discarded (the graded file is prefix + middle + suffix).

Phase 2 is KernelBench-style one-shot: a worked example (an element-wise add and its `ModelNew`,
written for this project), then the reference, then the instruction to write `ModelNew` with
`load_inline`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import string
from typing import Any

import yaml

from dice_jax.data.problems import Problem

MISSING_MARKER = '# <<< MISSING: source = """...""" (your answer goes here) >>>'
PRECISIONS = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}
_ARCH = re.compile(r"^sm_\d+[a-z]?$")

DEFAULT_SYSTEM = (
    "You are an expert in GPU programming, CUDA and PyTorch. You write CUDA kernels that are "
    "correct first and fast second, and you follow the requested output format exactly.")

INFILLING_USER = """\
Here is a PyTorch program (the reference):

```python
{reference}
```

Its computation is being moved into custom CUDA kernels compiled with \
`torch.utils.cpp_extension.load_inline`. The file below is complete except for one missing piece, \
marked `# <<< MISSING ... >>>`:

```python
{scaffold}
```
{target}
Write the missing piece: one Python assignment `source = \"\"\"...\"\"\"` whose string holds the \
CUDA code: the `#include` lines, the `__global__` kernels, and the host functions declared in \
`cpp_src`, which launch the kernels and return the results. `ModelNew.forward` calls those host \
functions, so keep their names and signatures exactly. The result must match the reference. \
Do not repeat the rest of the file: everything outside the assignment is discarded.

Answer with the assignment alone in one ```python code block."""

_EXAMPLE_REFERENCE = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(1, 128), torch.randn(1, 128)]


def get_init_inputs():
    return []"""

_EXAMPLE_CANDIDATE = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    auto out = torch::empty_like(ac);
    int64_t n = ac.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    add_kernel<<<blocks, threads>>>(ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_src = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(name="add_ext", cpp_sources=cpp_src, cuda_sources=source, functions=["add_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add_ext.add_cuda(a, b)'''

END_TO_END_USER = ("""\
You write custom CUDA kernels that replace the PyTorch operators of a given architecture to make \
it faster. You may replace some operators and keep others, fuse several operators into one kernel \
(for example matmul + relu), or change the algorithm (for example an online softmax). The \
computation in `ModelNew.forward` must run in your kernels, compiled inline with \
`torch.utils.cpp_extension.load_inline`; calling the PyTorch operators you are replacing does not \
count.

Here is an example. The given architecture:

```python
""" + _EXAMPLE_REFERENCE.replace("{", "{{").replace("}", "}}") + """
```

The same architecture with a custom CUDA kernel:

```python
""" + _EXAMPLE_CANDIDATE.replace("{", "{{").replace("}", "}}") + """
```

Now the architecture to optimize:

```python
{reference}
```
{target}
Write `ModelNew`: the same constructor and forward signature as `Model`, with the computation in \
custom CUDA kernels. Output the complete new file (imports, the CUDA source, `load_inline`, \
`ModelNew`) in one ```python code block. Do not output `Model`, `get_inputs`, testing code or \
explanations.""")


@dataclasses.dataclass(frozen=True)
class TargetSpec:
  """What the kernels are for; fills the {target} paragraph (set per request)."""

  arch: str | None = None        # "sm_90"
  precision: str | None = None   # "fp32" | "fp16" | "bf16"
  shapes: str | None = None      # free text: "x: float32[16, 256]; y: float32[16, 256]"

  def __post_init__(self):
    if self.arch is not None and not _ARCH.match(self.arch):
      raise ValueError(f"TargetSpec.arch must look like 'sm_90', got {self.arch!r}")
    if self.precision is not None and self.precision not in PRECISIONS:
      raise ValueError(f"TargetSpec.precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}")

  def paragraph(self) -> str:
    """The {target} text: empty, or a blank-line-delimited paragraph."""
    lines = []
    if self.arch:
      lines.append(f"The kernels are compiled for and run on an NVIDIA GPU of architecture {self.arch}.")
    if self.precision:
      dtype = PRECISIONS[self.precision]
      lines.append(f"Floating-point inputs and parameters are {self.precision} ({dtype}); "
                   "integer inputs keep their dtype. Outputs are compared with that precision's tolerance.")
    if self.shapes:
      lines.append(f"Input shapes and dtypes: {self.shapes}.")
    return "\n" + " ".join(lines) + "\n" if lines else ""


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  """A user message template and an optional system message (both `str.format` templates)."""

  user: str
  system: str | None = DEFAULT_SYSTEM

  @classmethod
  def from_yaml(cls, path: str | os.PathLike[str]) -> PromptTemplate:
    """A template file: a YAML mapping with `user` (required) and `system` (optional, may be null)."""
    try:
      with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    except OSError as e:
      raise ValueError(f"{path}: cannot read prompt template: {e.strerror}") from None
    except yaml.YAMLError as e:
      raise ValueError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("user"), str):
      raise ValueError(f"{path}: a prompt template is a mapping with a string field 'user'")
    unknown = set(data) - {"user", "system"}
    if unknown:
      raise ValueError(f"{path}: unknown prompt template keys {sorted(unknown)}; expected user, system")
    system = data.get("system", DEFAULT_SYSTEM)
    if system is not None and not isinstance(system, str):
      raise ValueError(f"{path}: 'system' must be a string or null")
    return cls(user=data["user"], system=system)

  def render(self, **fields: Any) -> list[dict[str, str]]:
    """The chat messages; a field the template names but `fields` lacks is a clear ValueError."""
    messages = []
    for role, text in (("system", self.system), ("user", self.user)):
      if text is None:
        continue
      _check_fields(text, fields, role)
      messages.append({"role": role, "content": text.format(**fields)})
    return messages


def _check_fields(template: str, fields: dict[str, Any], role: str) -> None:
  try:
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
  except ValueError as e:
    raise ValueError(f"{role} prompt template is malformed ({e}); "
                     "write {{ and }} for literal braces") from None
  for name in names:
    if name == "" or name.isdigit():
      raise ValueError(f"{role} prompt template uses a positional field {{{name}}}; use named fields")
    base = re.split(r"[.\[]", name, maxsplit=1)[0]
    if base not in fields:
      raise ValueError(f"{role} prompt template refers to unknown field {{{name}}}; "
                       f"available: {', '.join(sorted(fields))}")


INFILLING = PromptTemplate(user=INFILLING_USER)
END_TO_END = PromptTemplate(user=END_TO_END_USER)


def _common_fields(problem: Problem, target: TargetSpec | None) -> dict[str, str]:
  target = target or TargetSpec()
  return {"reference": problem.reference_source.strip("\n"), "problem_id": problem.id,
          "target": target.paragraph(), "arch": target.arch or "",
          "precision": target.precision or "", "shapes": target.shapes or ""}


def infilling_messages(problem: Problem, *, template: PromptTemplate = INFILLING,
                       target: TargetSpec | None = None) -> list[dict[str, str]]:
  """Phase-1 prompt: reference + scaffold with the gap marked; asks for the middle only."""
  if not problem.has_scaffold:
    raise ValueError(f"problem {problem.id!r} has no prefix/middle/suffix scaffold; it can only be "
                     "used for phase 2 (end to end)")
  prefix, suffix = problem.prefix, problem.suffix
  scaffold = (prefix if prefix.endswith("\n") or not prefix else prefix + "\n") + MISSING_MARKER
  scaffold += suffix if suffix.startswith("\n") else "\n" + suffix
  fields = _common_fields(problem, target) | {
      "prefix": prefix, "suffix": suffix, "scaffold": scaffold.strip("\n")}
  return template.render(**fields)


def end_to_end_messages(problem: Problem, *, template: PromptTemplate = END_TO_END,
                        target: TargetSpec | None = None) -> list[dict[str, str]]:
  """Phase-2 prompt: KernelBench-style one-shot, reference → `ModelNew` with load_inline."""
  return template.render(**_common_fields(problem, target))


def build_messages(problem: Problem, phase: int, *, infilling: PromptTemplate = INFILLING,
                   end_to_end: PromptTemplate = END_TO_END,
                   target: TargetSpec | None = None) -> list[dict[str, str]]:
  """The prompt for `problem` in `phase` (1 = infilling, 2 = end to end)."""
  if phase == 1:
    return infilling_messages(problem, template=infilling, target=target)
  if phase == 2:
    return end_to_end_messages(problem, template=end_to_end, target=target)
  raise ValueError(f"phase must be 1 or 2, got {phase!r}")
