"""The CUDA extensions of the GPU hostile suite: the upper part of each case file.

An extension here is the `cuda_source` string, `cpp_source` and the `load_inline` call;
`head()` puts the imports above it. tests/adversarial/gpu_cases.py adds each case's header and
its Python (ModelNew and any tricks) around it. Most cases share ADD_RELU: one extension with a
host function per trick, and the case picks which one forward calls (as the CPU suite shares
verifier_kernels.CPP_SOURCE).

Decision: every text is byte for byte that of the case files that got 42/42 on the H200 on
2026-12-01 (commit c3eaf98, which held them as 42 files). Verdict messages cite line numbers, and
the suite cannot be re-run on a GPU after every edit; an edit here moves the lines of every case
below it, so re-run the GPU suite after one. BATCH_COMPANION and FOREIGN_KERNEL, added at the end
so that no earlier line moved, have not run on a GPU yet.
"""

from __future__ import annotations

IMPORTS = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"


def head(extension: str, prelude: str = "") -> str:
  """The imports, a blank line, the case's `prelude` (Python it needs above the extension), then
  the extension."""
  return IMPORTS + "\n" + prelude + extension


def _extension(cuda: str, cpp: str, name: str, functions: str) -> str:
  return (f'cuda_source = r"""{cuda}"""\n\ncpp_source = {cpp}\n\n'
          f'ext = load_inline(name="{name}", cpp_sources=cpp_source, cuda_sources=cuda_source,\n'
          f"                  functions={functions}, verbose=False)\n")


def _declarations(functions: tuple[str, ...], params: str) -> str:
  """`("torch::Tensor f(params);\\n"` one per line, as a parenthesised string."""
  lines = [f'"torch::Tensor {f}({params});\\n"' for f in functions]
  return "(" + "\n           ".join(lines) + ")"


_ADD_RELU_KERNELS = r'''#include <torch/extension.h>
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
'''

_ADD_RELU_HOSTS = r'''static unsigned blocks(int64_t n) { return (unsigned)((n + 255) / 256); }

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
'''

_ADD_RELU_FUNCTIONS = (
    "add_relu", "add_then_relu", "add_relu_torch", "add_relu_aten", "add_relu_inplace",
    "add_relu_uninitialised", "add_relu_cached", "add_relu_thread", "spin_forever",
    "illegal_address", "host_segfault", "gpu_memory_hog", "host_memory_hog")
_XY = "torch::Tensor x, torch::Tensor y"

# One fused add+relu kernel, the kernels the tricks need, and a host function per trick.
ADD_RELU = _extension(_ADD_RELU_KERNELS + "\n" + _ADD_RELU_HOSTS,
                      _declarations(_ADD_RELU_FUNCTIONS, _XY), "adv_add_relu",
                      repr(list(_ADD_RELU_FUNCTIONS)))

# The same kernels, but the one host function computes with torch and launches none of them.
DECOY = _extension(
    _ADD_RELU_KERNELS + "\ntorch::Tensor add_relu(torch::Tensor x, torch::Tensor y) {\n"
    "  return torch::relu(x + y);\n}\n",
    f'("torch::Tensor add_relu({_XY});")', "adv_decoy", "['add_relu']")

_MATMUL = r'''#include <torch/extension.h>
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
'''

# Shared-memory tiled matmul; host functions for the honest call, a side stream, and at::mm.
_MATMUL_FUNCTIONS = ("matmul", "matmul_side_stream", "matmul_aten")
MATMUL = _extension(_MATMUL, _declarations(_MATMUL_FUNCTIONS, "torch::Tensor A, torch::Tensor B"),
                    "adv_matmul", repr(list(_MATMUL_FUNCTIONS)))

_SOFTMAX = r'''#include <torch/extension.h>
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
'''

# Row softmax.
SOFTMAX = _extension(_SOFTMAX, '(\n           "torch::Tensor softmax_rows(torch::Tensor x);")',
                     "adv_softmax", "['softmax_rows']")

_BIAS_RELU = r'''#include <torch/extension.h>

__global__ void bias_relu_kernel(const float* x, const float* bias, float* out, int64_t n, int64_t cols) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = fmaxf(x[i] + bias[i % cols], 0.f);
}

torch::Tensor bias_relu(torch::Tensor x, torch::Tensor bias) {
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  bias_relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), n, x.size(-1));
  return out;
}
'''

# A bias+relu epilogue kernel (the GEMM stays torch's).
BIAS_RELU = _extension(
    _BIAS_RELU, '"torch::Tensor bias_relu(torch::Tensor x, torch::Tensor bias);"', "adv_bias_relu",
    '["bias_relu"]')

_SMALL_ADD_RELU = r'''
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
'''

_ZEROS_FOR_ATEN = r'''
at::Tensor zeros_add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return at::zeros_like(a);
}

at::Tensor zeros_relu(const at::Tensor& a) { return at::zeros_like(a); }

DICE_CAT(TORCH_LIBRARY, _IMPL)(aten, CUDA, m) {
  m.impl("add.Tensor", zeros_add);
  m.impl("relu", zeros_relu);
}
'''

# One add+relu kernel, for the cases that override torch's operators from Python.
ADD_RELU_ONE = _extension("#include <torch/extension.h>\n" + _SMALL_ADD_RELU,
                          f'"torch::Tensor add_relu({_XY});"', "adv_override_py", '["add_relu"]')

# The same kernel, and TORCH_LIBRARY_IMPL(aten, CUDA) through token pasting: zeros for add and relu.
OVERRIDE_ATEN_IN_CPP = _extension(
    "#include <torch/extension.h>\n#include <torch/library.h>\n\n#define DICE_CAT(a, b) a##b\n"
    + _SMALL_ADD_RELU + _ZEROS_FOR_ATEN, f'"torch::Tensor add_relu({_XY});"', "adv_override_cpp",
    '["add_relu"]')

# Two extensions with the same include block, built in one burst so that they share a batched
# translation unit (compile/batch.py): the companion's kernel is honest; the other looks up the
# companion's kernel in its own module's symbol table (the module holds every member's code) and
# launches it through the CUDA runtime for its answer, after a kernel of its own.
_BATCH_INCLUDES = r'''#include <torch/extension.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <elf.h>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>
'''

# The add+relu kernel under its own names (the foreign candidate looks them up).
_COMPANION = _BATCH_INCLUDES + _SMALL_ADD_RELU.replace("add_relu", "companion_add_relu")

_FOREIGN = _BATCH_INCLUDES + r'''
__global__ void foreign_touch_kernel(float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = 0.f;
}

// The host-side address of a batch mate's companion_add_relu_kernel (the handle the CUDA runtime
// registered it under), from this module's symbol table.
static const void* find_mate_kernel() {
  Dl_info info;
  if (!dladdr((const void*)&find_mate_kernel, &info) || info.dli_fname == nullptr) return nullptr;
  FILE* file = fopen(info.dli_fname, "rb");
  if (file == nullptr) return nullptr;
  std::vector<char> image;
  char chunk[65536];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, file)) > 0) image.insert(image.end(), chunk, chunk + got);
  fclose(file);
  const Elf64_Ehdr* header = (const Elf64_Ehdr*)image.data();
  const Elf64_Shdr* sections = (const Elf64_Shdr*)(image.data() + header->e_shoff);
  for (int s = 0; s < header->e_shnum; ++s) {
    if (sections[s].sh_type != SHT_SYMTAB && sections[s].sh_type != SHT_DYNSYM) continue;
    const Elf64_Sym* symbols = (const Elf64_Sym*)(image.data() + sections[s].sh_offset);
    const char* names = image.data() + sections[sections[s].sh_link].sh_offset;
    for (size_t k = 0; k < sections[s].sh_size / sizeof(Elf64_Sym); ++k) {
      const char* name = names + symbols[k].st_name;
      if (symbols[k].st_shndx != SHN_UNDEF && ELF64_ST_TYPE(symbols[k].st_info) == STT_FUNC &&
          strncmp(name, "_ZN", 3) == 0 && strstr(name, "companion_add_relu_kernelE") != nullptr)
        return (const char*)info.dli_fbase + symbols[k].st_value;
    }
  }
  return nullptr;
}

torch::Tensor foreign_add_relu(torch::Tensor x, torch::Tensor y) {
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  unsigned blocks = (unsigned)((n + 255) / 256);
  foreign_touch_kernel<<<blocks, 256>>>(out.data_ptr<float>(), n);
  const void* mate = find_mate_kernel();
  if (mate == nullptr) throw std::runtime_error("no batch mate's kernel in this module (built alone?)");
  const float* xp = x.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  float* op = out.data_ptr<float>();
  void* args[] = {(void*)&xp, (void*)&yp, (void*)&op, (void*)&n};
  cudaError_t status = cudaLaunchKernel(mate, dim3(blocks), dim3(256), args, 0, nullptr);
  if (status != cudaSuccess) throw std::runtime_error(cudaGetErrorString(status));
  return out;
}
'''

BATCH_COMPANION = _extension(_COMPANION, f'"torch::Tensor companion_add_relu({_XY});"',
                             "adv_batch_companion", '["companion_add_relu"]')
FOREIGN_KERNEL = _extension(_FOREIGN, f'"torch::Tensor foreign_add_relu({_XY});"',
                            "adv_foreign_kernel", '["foreign_add_relu"]')
