"""Deliberately wrong CUDA candidates (GPU tests): every one must come back INCORRECT.

Each entry: name -> (reference source, candidate source). They cover the classic ways a kernel
is wrong while still compiling and running: an off-by-one bound, a grid that misses the tail, a
data race, arithmetic in too low a precision, the wrong output dtype, a transposed index and an
in-place write into an input.
"""

from __future__ import annotations

import verifier_kernels as kernels

ROW_SUM_REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(256, 4096)]


def get_init_inputs():
    return []
'''

_RACY_ROW_SUM = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void racy_row_sum(const float* x, float* out, int cols) {
  int row = blockIdx.x;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    out[row] += x[row * cols + c];  // read-modify-write from 256 threads, no atomics
  }
}

torch::Tensor row_sum(torch::Tensor x) {
  auto out = torch::zeros({x.size(0)}, x.options());
  racy_row_sum<<<x.size(0), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
  return out;
}
"""
ext = load_inline(name="racy_row_sum_ext", cpp_sources="torch::Tensor row_sum(torch::Tensor x);",
                  cuda_sources=source, functions=["row_sum"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.row_sum(x.contiguous())
'''


def _scaled_add(body_replacements: dict[str, str], name: str) -> str:
  source = kernels.CUDA_SOURCE
  for old, new in body_replacements.items():
    assert old in source, old
    source = source.replace(old, new)
  return kernels.cuda_candidate(source, name=name)


WRONG = {
    "off_by_one": (kernels.REFERENCE, _scaled_add({"if (i < n)": "if (i < n - 1)"}, "wk_obo")),
    "grid_misses_tail": (kernels.REFERENCE, _scaled_add(
        {"(n + 255) / 256, 256": "n / 256, 256"}, "wk_grid")),
    "data_race": (ROW_SUM_REFERENCE, _RACY_ROW_SUM),
    "half_precision_math": (kernels.REFERENCE, _scaled_add(
        {"out[i] = (a[i] + b[i]) * s;":
         "out[i] = __half2float(__float2half((a[i] + b[i]) * s) );"}, "wk_half")),
    "wrong_output_dtype": (kernels.REFERENCE, _scaled_add(
        {"float* out, float s": "double* out, float s",
         "auto out = torch::empty_like(a);": "auto out = torch::empty_like(a, torch::kFloat64);",
         "out.data_ptr<float>()": "out.data_ptr<double>()"}, "wk_dtype")),
    "transposed_index": (kernels.REFERENCE, _scaled_add(
        {"out[i] = (a[i] + b[i]) * s;":
         "{ int j = (i % 33) * 64 + i / 33; out[i] = (a[j] + b[j]) * s; }"}, "wk_transpose")),
    "writes_into_input": (kernels.REFERENCE, _scaled_add(
        {"auto out = torch::empty_like(a);": "auto out = a;"}, "wk_inplace")),
}

# The kernel is launched only from a host function nobody calls; forward computes with ATen.
RUNTIME_DECOY = kernels.cuda_candidate(
    kernels.CUDA_SOURCE.replace("torch::Tensor scaled_add(", "torch::Tensor unused_launcher(")
    + "\ntorch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {\n"
      "  return (a + b) * s;\n}\n", name="runtime_decoy")

# Writes far outside its output: a CUDA error (illegal address) that poisons the context.
ILLEGAL_ADDRESS = _scaled_add({"out[i] = (a[i] + b[i]) * s;":
                               "out[i + (1ll << 34)] = (a[i] + b[i]) * s;"}, "wk_illegal")
