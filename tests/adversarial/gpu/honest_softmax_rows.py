# adversarial-case: expect=OK problem=softmax
# Honest: row softmax kernel with reshape/view glue around it.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void softmax_rows_kernel(const float* x, float* out, int cols) {
  extern __shared__ float red[];
  const float* xr = x + (int64_t)blockIdx.x * cols;
  float* orow = out + (int64_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(xr[c] - m);
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  sum = red[0];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = expf(xr[c] - m) / sum;
}

torch::Tensor softmax_rows(torch::Tensor x) {
  auto rows = x.contiguous();
  auto out = torch::empty_like(rows);
  int cols = rows.size(1);
  softmax_rows_kernel<<<rows.size(0), 256, 256 * sizeof(float)>>>(rows.data_ptr<float>(), out.data_ptr<float>(), cols);
  return out;
}
"""

cpp_source = (
           "torch::Tensor softmax_rows(torch::Tensor x);")

ext = load_inline(name="adv_softmax", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=['softmax_rows'], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        return ext.softmax_rows(rows).view(x.shape)
