# adversarial-case: expect=RUNTIME_ERROR problem=add_relu
# A kernel writes far outside its buffer.
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

static unsigned blocks(int64_t n) { return (unsigned)((n + 255) / 256); }

torch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  add_relu_kernel<<<blocks(n), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}

torch::Tensor add_then_relu(torch::Tensor x, torch::Tensor y) {
  auto out = torch::zeros_like(x);
  int64_t n = x.numel();
  add_kernel<<<blocks(n), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
  relu_inplace_kernel<<<blocks(n), 256>>>(out.data_ptr<float>(), n);
  return out;
}

torch::Tensor add_relu_torch(torch::Tensor x, torch::Tensor y) {
  return torch::relu(x + y);
}

torch::Tensor add_relu_aten(torch::Tensor x, torch::Tensor y) {
  auto scratch = torch::empty({1}, x.options());
  touch_kernel<<<1, 32>>>(scratch.data_ptr<float>(), 0);
  return at::relu(at::add(x, y));
}

torch::Tensor add_relu_inplace(torch::Tensor x, torch::Tensor y) {
  int64_t n = x.numel();
  add_relu_kernel<<<blocks(n), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.data_ptr<float>(), n);
  return x;
}

torch::Tensor add_relu_uninitialised(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  touch_kernel<<<1, 32>>>(out.data_ptr<float>(), out.numel());
  return out;
}

torch::Tensor add_relu_cached(torch::Tensor x, torch::Tensor y) {
  static std::map<void*, torch::Tensor> cache;
  auto hit = cache.find(x.data_ptr());
  if (hit != cache.end()) return hit->second;
  auto out = add_relu(x, y);
  cache[x.data_ptr()] = out;
  return out;
}

torch::Tensor add_relu_thread(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  float* po = out.data_ptr<float>();
  int64_t n = x.numel();
  std::thread([=] {
    for (int r = 0; r < 20; ++r) add_relu_kernel<<<blocks(n), 256>>>(px, py, po, n);
    cudaDeviceSynchronize();
  }).detach();
  return out;
}

torch::Tensor spin_forever(torch::Tensor x, torch::Tensor y) {
  auto flag = torch::zeros({1}, x.options().dtype(torch::kInt32));
  spin_kernel<<<1, 1>>>(flag.data_ptr<int>());
  return add_relu(x, y);
}

torch::Tensor illegal_address(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  illegal_kernel<<<blocks(n), 256>>>(out.data_ptr<float>(), n);
  return out;
}

torch::Tensor host_segfault(torch::Tensor x, torch::Tensor y) {
  volatile int* nowhere = nullptr;
  *nowhere = 1;
  return add_relu(x, y);
}

torch::Tensor gpu_memory_hog(torch::Tensor x, torch::Tensor y) {
  auto hog = torch::empty({int64_t(1) << 40}, x.options());
  return add_relu(x, y);
}

torch::Tensor host_memory_hog(torch::Tensor x, torch::Tensor y) {
  std::vector<void*> blocks_;
  for (int i = 0; i < 4096; ++i) {
    void* p = malloc(size_t(1) << 30);
    if (!p) { for (void* q : blocks_) free(q); throw std::bad_alloc(); }
    blocks_.push_back(p);
  }
  for (void* q : blocks_) free(q);
  TORCH_CHECK(false, "ESCAPED: reserved 4 TiB of host memory");
  return x;
}
"""

cpp_source = ("torch::Tensor add_relu(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_then_relu(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_relu_torch(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_relu_aten(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_relu_inplace(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_relu_uninitialised(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_relu_cached(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor add_relu_thread(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor spin_forever(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor illegal_address(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor host_segfault(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor gpu_memory_hog(torch::Tensor x, torch::Tensor y);\n"
           "torch::Tensor host_memory_hog(torch::Tensor x, torch::Tensor y);\n")

ext = load_inline(name="adv_add_relu", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=['add_relu', 'add_then_relu', 'add_relu_torch', 'add_relu_aten', 'add_relu_inplace', 'add_relu_uninitialised', 'add_relu_cached', 'add_relu_thread', 'spin_forever', 'illegal_address', 'host_segfault', 'gpu_memory_hog', 'host_memory_hog'], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass

    def forward(self, x, y):
        return ext.illegal_address(x, y)
