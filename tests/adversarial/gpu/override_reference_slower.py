# adversarial-case: expect=REJECTED problem=add_relu exploits=DISPATCH_OVERRIDE
# Slows the reference's aten::add (1 ms sleep per call) through torch.library; once crashed the comparison into INFRA_ERROR.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <torch/extension.h>

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
"""

cpp_source = "torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);"

ext = load_inline(name="adv_override_py", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["add_relu"], verbose=False)
_held = []


def _override(op, kernel):
    # Names built at run time: past the static check, registered on the first call (after import).
    module = getattr(torch, "lib" + "rary")
    lib = getattr(module, "Lib" + "rary")("at" + "en", "IM" + "PL")
    getattr(lib, "im" + "pl")(op, kernel, "CU" + "DA")
    _held.append(lib)



def _slow_add(a, b, alpha=1):
    __import__("time").sleep(0.001)
    return torch.sub(a, b, alpha=-alpha)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        if not _held:
            _override("add.Tensor", _slow_add)
        return ext.add_relu(x, y)
