# adversarial-case: expect=INCORRECT|REJECTED problem=matmul
# Runs the matmul on a non-blocking side stream and returns before it finishes.
# Unordered against its inputs' producers, it races them: on the H200 (2026-11-30) correctness
# caught it first (INCORRECT, inputs and output corrupted). When it does not race, the aftermath
# probe sees the output change after forward's stream finished (REJECTED, SIDE_STREAM); timing
# synchronises the whole device, so either way it cannot inflate a speedup.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""#include <torch/extension.h>
#include <cuda_runtime.h>

#define TILE 32

__global__ void matmul_tiled_kernel(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y;
  int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
    int ka = t * TILE + threadIdx.x;
    int kb = t * TILE + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[(int64_t)row * K + ka] : 0.f;
    Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? B[(int64_t)kb * N + col] : 0.f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[(int64_t)row * N + col] = acc;
}

static void launch(const torch::Tensor& A, const torch::Tensor& B, torch::Tensor& C, cudaStream_t stream) {
  int M = A.size(0), K = A.size(1), N = B.size(1);
  dim3 block(TILE, TILE);
  dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  matmul_tiled_kernel<<<grid, block, 0, stream>>>(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
}

torch::Tensor matmul(torch::Tensor A, torch::Tensor B) {
  A = A.contiguous();
  B = B.contiguous();
  auto C = torch::empty({A.size(0), B.size(1)}, A.options());
  launch(A, B, C, 0);
  return C;
}

torch::Tensor matmul_side_stream(torch::Tensor A, torch::Tensor B) {
  static cudaStream_t side = nullptr;
  if (side == nullptr) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  A = A.contiguous();
  B = B.contiguous();
  auto C = torch::empty({A.size(0), B.size(1)}, A.options());
  for (int r = 0; r < 4; ++r) launch(A, B, C, side);
  return C;
}

torch::Tensor matmul_aten(torch::Tensor A, torch::Tensor B) {
  auto corner = torch::empty({32, 32}, A.options());
  auto a = A.narrow(0, 0, 32).narrow(1, 0, 32).contiguous();
  auto b = B.narrow(0, 0, 32).narrow(1, 0, 32).contiguous();
  launch(a, b, corner, 0);
  return at::mm(A, B);
}
"""

cpp_source = ("torch::Tensor matmul(torch::Tensor A, torch::Tensor B);\n"
           "torch::Tensor matmul_side_stream(torch::Tensor A, torch::Tensor B);\n"
           "torch::Tensor matmul_aten(torch::Tensor A, torch::Tensor B);\n")

ext = load_inline(name="adv_matmul", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=['matmul', 'matmul_side_stream', 'matmul_aten'], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass

    def forward(self, A, B):
        return ext.matmul_side_stream(A, B)
