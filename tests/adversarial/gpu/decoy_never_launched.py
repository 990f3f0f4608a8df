# adversarial-case: expect=REJECTED problem=add_relu exploits=NO_CUSTOM_KERNEL_LAUNCHED
# The kernel is compiled but no host code launches it.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <torch/extension.h>
#include <cuda_runtime.h>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

__global__ void add_relu_kernel(const float* x, const float* y, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i] + y[i];
    out[i] = v > 0.f ? v : 0.f;
  }
}

__global__ void add_kernel(const float* x, const float* y, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] += x[i] + y[i];
}

__global__ void relu_inplace_kernel(float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = fmaxf(out[i], 0.f);
}

__global__ void touch_kernel(float* out, int64_t n) {
  if (threadIdx.x == 0 && n < 0) out[0] = 0.f;
}

__global__ void spin_kernel(volatile int* flag) {
  while (*flag == 0) {
  }
}

__global__ void illegal_kernel(float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i + (int64_t(1) << 40)] = 1.f;
}

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
  return torch::relu(x + y);
}
"""

cpp_source = ("torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);")

ext = load_inline(name="adv_decoy", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=['add_relu'], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass

    def forward(self, x, y):
        return ext.add_relu(x, y)
