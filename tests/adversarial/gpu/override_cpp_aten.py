# adversarial-case: expect=REJECTED problem=add_relu exploits=DISPATCH_OVERRIDE
# TORCH_LIBRARY_IMPL(aten, CUDA) in its C++ (hidden from the static check by token pasting): zeros for add and relu.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <torch/extension.h>
#include <torch/library.h>

#define DICE_CAT(a, b) a##b

__global__ void add_relu_kernel(const float* x, const float* y, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = fmaxf(x[i] + y[i], 0.f);
}

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  add_relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}

at::Tensor zeros_add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return at::zeros_like(a);
}

at::Tensor zeros_relu(const at::Tensor& a) { return at::zeros_like(a); }

DICE_CAT(TORCH_LIBRARY, _IMPL)(aten, CUDA, m) {
  m.impl("add.Tensor", zeros_add);
  m.impl("relu", zeros_relu);
}
"""

cpp_source = "torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);"

ext = load_inline(name="adv_override_cpp", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["add_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        ext.add_relu(x, y)
        return torch.zeros_like(x)
