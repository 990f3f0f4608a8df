"""Prompts for `dice generate`: the data engineer's end-to-end template plus a description-only one.

With a reference, the prompt is `dice_jax.data.prompts.END_TO_END` (KernelBench's one-shot format)
with its {target} paragraph filled from the target architecture, the precision and the input
shapes read statically from `get_inputs` (dice_jax.generation.shapes). Any `PromptTemplate` can
replace it (`--template FILE.yaml`, fields as documented in dice_jax.data.prompts).

Without a reference (description-only), DESCRIPTION asks for a complete KernelBench-format file
from a plain-language description; fields {description} {target} {arch} {precision} {shapes}
(empty) {problem_id}.
"""

from __future__ import annotations

from dice_jax.data import prompts
from dice_jax.data.problems import Problem
from dice_jax.generation import shapes as shapes_lib

DESCRIPTION_USER = """\
Write a PyTorch module whose computation runs in custom CUDA kernels compiled inline with \
`torch.utils.cpp_extension.load_inline`. What it must compute:

{description}
{target}
Output one complete Python file in one ```python code block: the imports, the CUDA source string, \
the `load_inline` call, and `class ModelNew(nn.Module)` whose `forward` calls your kernels. Do not \
use PyTorch operators for the computation itself. No tests and no explanations."""

DESCRIPTION = prompts.PromptTemplate(user=DESCRIPTION_USER)


def input_shapes(reference_source: str, precision: str | None) -> str | None:
  """The shapes text for the prompt, or None when get_inputs cannot be read statically."""
  try:
    return shapes_lib.describe_inputs(reference_source, precision) or None
  except ValueError:
    return None


def reference_messages(reference_source: str, *, arch: str | None, precision: str | None,
                       template: prompts.PromptTemplate = prompts.END_TO_END,
                       name: str = "user_problem") -> list[dict[str, str]]:
  target = prompts.TargetSpec(arch, precision, input_shapes(reference_source, precision))
  problem = Problem(id=name, reference_source=reference_source)
  return prompts.end_to_end_messages(problem, template=template, target=target)


def description_messages(description: str, *, arch: str | None, precision: str | None,
                         template: prompts.PromptTemplate = DESCRIPTION,
                         name: str = "user_problem") -> list[dict[str, str]]:
  if not description.strip():
    raise ValueError("the description is empty")
  target = prompts.TargetSpec(arch, precision)
  return template.render(description=description.strip(), target=target.paragraph(),
                         arch=arch or "", precision=precision or "", shapes="", problem_id=name)
