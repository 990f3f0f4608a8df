"""Tiny problems and candidates shared by the verifier tests (kept tiny: CI compiles them).

Every C++-only candidate below shares one load_inline call (same sources, same flags), so the
whole family costs one compile; candidates differ only in which exported function ModelNew calls.
"""

from __future__ import annotations

REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return (a + b) * self.scale


def get_inputs():
    return [torch.randn(64, 33), torch.randn(64, 33)]


def get_init_inputs():
    return [0.5]
'''

CUDA_SOURCE = r'''
#include <torch/extension.h>

__global__ void scaled_add_kernel(const float* a, const float* b, float* out, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (a[i] + b[i]) * s;
}

torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  auto out = torch::empty_like(a);
  int n = a.numel();
  scaled_add_kernel<<<(n + 255) / 256, 256>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), (float)s, n);
  return out;
}
'''

_CUDA_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """{source}"""
cpp_src = "torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s);"
ext = load_inline(name="{name}", cpp_sources=cpp_src, cuda_sources=source,
                  functions=["scaled_add"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return ext.scaled_add(a.contiguous(), b.contiguous(), self.scale)
'''


def cuda_candidate(source: str = CUDA_SOURCE, name: str = "scaled_add_ext") -> str:
  return _CUDA_CANDIDATE.replace("{source}", source).replace("{name}", name)


# A candidate whose CUDA source has a real compile error (undeclared identifier).
BROKEN_CUDA = cuda_candidate(CUDA_SOURCE.replace("(a[i] + b[i]) * s", "(a[i] + b[i]) * s_typo"),
                             name="broken_ext")

# Compiles with torch/extension.h but not with torch/types.h: exercises the light-header fallback.
NEEDS_EXTENSION_H = cuda_candidate(
    CUDA_SOURCE.replace("auto out = torch::empty_like(a);",
                        "auto out = torch::empty_like(a);\n  (void)torch::nn::functional::"
                        "ReLUFuncOptions(false);"), name="needs_ext_h")

# One C++ extension with many behaviours; CPU test mode runs these without a GPU.
CPP_SOURCE = r'''
#include <cstdlib>

torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  auto out = torch::empty_like(a);
  auto pa = a.data_ptr<float>(); auto pb = b.data_ptr<float>(); auto po = out.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = (pa[i] + pb[i]) * (float)s;
  return out;
}

torch::Tensor slightly_off(torch::Tensor a, torch::Tensor b, double s) {
  auto out = scaled_add(a, b, s);
  out.data_ptr<float>()[out.numel() - 1] += 1e-2f;
  return out;
}

torch::Tensor in_place(torch::Tensor a, torch::Tensor b, double s) {
  auto pa = a.data_ptr<float>(); auto pb = b.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) pa[i] = (pa[i] + pb[i]) * (float)s;
  return a;
}

torch::Tensor wrong_shape(torch::Tensor a, torch::Tensor b, double s) {
  return scaled_add(a, b, s).reshape({-1});
}

torch::Tensor uninitialised(torch::Tensor a, torch::Tensor b, double s) {
  return torch::empty_like(a);
}

torch::Tensor crash(torch::Tensor a, torch::Tensor b, double s) {
  std::abort();
}

torch::Tensor hang(torch::Tensor a, torch::Tensor b, double s) {
  volatile bool forever = true;
  while (forever) {}
  return a;
}

torch::Tensor throws(torch::Tensor a, torch::Tensor b, double s) {
  TORCH_CHECK(false, "deliberate failure in the candidate");
  return a;
}
'''

CPP_FUNCTIONS = ("scaled_add", "slightly_off", "in_place", "wrong_shape", "uninitialised", "crash",
                 "hang", "throws")

_CPP_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""{source}"""
ext = load_inline(name="cpu_family", cpp_sources=cpp_source, functions={functions},
                  with_cuda=True, verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return ext.{call}(a, b, self.scale)
'''


def cpp_candidate(call: str) -> str:
  """A C++-only candidate calling `call`; with_cuda=True shares the CUDA flag set (and PCH)."""
  return (_CPP_CANDIDATE.replace("{source}", CPP_SOURCE)
          .replace("{functions}", repr(list(CPP_FUNCTIONS))).replace("{call}", call))
