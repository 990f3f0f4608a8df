"""Synthetic problem files: the PyTorch reference and the known-good candidate, and its phase-1 split.

The candidate is rendered whole, as one file, and then cut where DICE's infilling items are cut:
`prefix` (the imports, up to the `source = \"\"\"` line), `middle` (the `source` assignment, through
its closing quotes) and `suffix` (`cpp_src`, `load_inline`, `ModelNew`). `split_candidate` cuts any
such file and checks that the three pieces give the file back byte for byte.

Decision: short files for a byte-level model. One host function `f` and one kernel `k` per answer
(plus the reduction helper), the extension named `ext`, `ModelNew.forward` a single call, no
`verbose`/`extra_cflags`; the reference is a bare `nn.Module` with no docstring.

Decision: no `#include <torch/extension.h>` in `source`: load_inline already puts
`#include <torch/types.h>` (and the CUDA runtime headers) in front of it, which declares all the
answers use. Shorter, and cheaper to verify: a source at the `torch/types.h` level that fails to
compile is final after the verifier's light-header attempt and one `torch/types.h` build, while one
including torch/extension.h is rebuilt with that whole header before COMPILE_ERROR is final
(measured on the 2-core CPU VM: ~7 vs ~18 CPU-s per broken candidate; ~11 CPU-s per
good one either way).
"""

from __future__ import annotations

import re

from dice_jax.data.synthetic.families import Params

_HEADER = "import torch\nimport torch.nn as nn\n"
_PREFIX = _HEADER + "from torch.utils.cpp_extension import load_inline\n\n"
_INIT = """\
    def __init__(self, c):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(c))

"""
_REFERENCE = """\
{header}

class Model(nn.Module):
{init}    def forward(self, {args}):
        return {expr}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return [{init_inputs}]
"""
_SUFFIX = """

cpp_src = "{signature};"

ext = load_inline(name="ext", cpp_sources=cpp_src, cuda_sources=source, functions=["f"])


class ModelNew(nn.Module):
{init}    def forward(self, {args}):
        return ext.f({call})
"""
_SIGNATURE = re.compile(r"^torch::Tensor f\([^)]*\)", re.M)
_MIDDLE = re.compile(r'^source = """\n.*?\n"""', re.S | re.M)


def reference(p: Params) -> str:
  """The PyTorch program: `Model`, `get_inputs`, `get_init_inputs`."""
  header = _HEADER + ("import torch.nn.functional as F\n" if p.needs_functional else "")
  inputs = ", ".join(f"torch.randn({p.rows}, {p.cols})" for _ in p.forward_args)
  return _REFERENCE.format(header=header, init=_INIT if p.bias else "", args=", ".join(p.forward_args),
                           expr=p.torch_expr, inputs=inputs, init_inputs=str(p.cols) if p.bias else "")


def candidate(p: Params) -> str:
  """The known-good KernelBench candidate: `ModelNew` calling the CUDA of `p` through load_inline."""
  signature = _SIGNATURE.search(p.cuda)
  if signature is None:
    raise ValueError(f"{p.problem_id}: the CUDA text has no host function `torch::Tensor f(...)`")
  source = f'source = """\n{p.cuda}\n"""'
  return _PREFIX + source + _SUFFIX.format(signature=signature.group(0), init=_INIT if p.bias else "",
                                           args=", ".join(p.forward_args), call=", ".join(p.call_args))


def split_candidate(text: str) -> tuple[str, str, str]:
  """(prefix, middle, suffix) of a candidate file whose CUDA is one `source = \"\"\"...\"\"\"` at the
  start of a line (ValueError unless there is exactly one); the three concatenate to `text`."""
  found = list(_MIDDLE.finditer(text))
  if len(found) != 1:
    raise ValueError(f"expected one `source = \"\"\"...\"\"\"` assignment, found {len(found)}")
  start, end = found[0].span()
  return text[:start], text[start:end], text[end:]
