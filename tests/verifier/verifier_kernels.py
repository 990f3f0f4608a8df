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

# A macro that doubles its argument 39 times over (2^39 tokens): a compile that expands it runs
# out of any memory bound long before it ends (the compile stage's hostile inputs).
MACRO_BOMB = "\n".join(["#define DICE_X1(a) a a"] + [
    f"#define DICE_X{i}(a) DICE_X{i - 1}(DICE_X{i - 1}(a))" for i in range(2, 40)])
MACRO_BOMB_KERNEL = MACRO_BOMB + "\n__global__ void boom(int* p) { p[0] = DICE_X39(1 +) 0; }\n"

# Compiles with torch/extension.h but not with torch/types.h: exercises the light-header fallback.
NEEDS_EXTENSION_H = cuda_candidate(
    CUDA_SOURCE.replace("auto out = torch::empty_like(a);",
                        "auto out = torch::empty_like(a);\n  (void)torch::nn::functional::"
                        "ReLUFuncOptions(false);"), name="needs_ext_h")

# The C++ host implementation of the problem, shared by the C++-only test sources.
SCALED_ADD_CPP = r'''torch::Tensor scaled_add(torch::Tensor a, torch::Tensor b, double s) {
  auto out = torch::empty_like(a);
  auto pa = a.data_ptr<float>(); auto pb = b.data_ptr<float>(); auto po = out.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = (pa[i] + pb[i]) * (float)s;
  return out;
}
'''

# One C++ extension with many behaviours; CPU test mode runs these without a GPU. The hostile
# functions at the end try to leave the sandbox (tests/adversarial); each one that gets through
# fails loudly with "ESCAPED: ..." and otherwise returns the right answer.
CPP_SOURCE = r'''
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

''' + SCALED_ADD_CPP + r'''
torch::Tensor add_only(torch::Tensor a, torch::Tensor b, double s) {  // part of the work
  return scaled_add(a, b, 1.0);
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

torch::Tensor wrong_dtype(torch::Tensor a, torch::Tensor b, double s) {  // right values, float64
  auto out = torch::empty(a.sizes(), a.options().dtype(torch::kFloat64));
  auto pa = a.data_ptr<float>(); auto pb = b.data_ptr<float>(); auto po = out.data_ptr<double>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = ((double)pa[i] + pb[i]) * s;
  return out;
}

torch::Tensor wrong_from_7th(torch::Tensor a, torch::Tensor b, double s) {  // right 6 times
  static int calls = 0;
  auto out = scaled_add(a, b, s);
  if (++calls >= 7) out.data_ptr<float>()[0] += 1.0f;
  return out;
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

static void escaped(const std::string& what) { TORCH_CHECK(false, "ESCAPED: " + what); }

torch::Tensor net_connect(torch::Tensor a, torch::Tensor b, double s, int64_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (sockaddr*)&addr, sizeof addr) == 0) escaped("connected to port " + std::to_string(port));
    close(fd);
  }
  return scaled_add(a, b, s);
}

torch::Tensor read_path(torch::Tensor a, torch::Tensor b, double s, std::string path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    char buf[16];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n > 0) escaped("read " + path);
  }
  return scaled_add(a, b, s);
}

torch::Tensor write_path(torch::Tensor a, torch::Tensor b, double s, std::string path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) { close(fd); unlink(path.c_str()); escaped("created " + path); }
  return scaled_add(a, b, s);
}

torch::Tensor parent_memory(torch::Tensor a, torch::Tensor b, double s) {
  pid_t parent = getppid();
  std::string mem = "/proc/" + std::to_string(parent) + "/mem";
  int fd = open(mem.c_str(), O_RDONLY);
  if (fd >= 0) { close(fd); escaped("opened " + mem); }
  char buf[8];
  iovec local{buf, sizeof buf}, remote{(void*)&parent_memory, sizeof buf};
  if (process_vm_readv(parent, &local, 1, &remote, 1, 0) > 0) escaped("process_vm_readv");
  if (ptrace(PTRACE_ATTACH, parent, nullptr, nullptr) == 0) escaped("ptrace attach");
  return scaled_add(a, b, s);
}

torch::Tensor fork_bomb(torch::Tensor a, torch::Tensor b, double s) {
  for (int i = 0; i < 64; ++i) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid > 0) escaped("forked a process");
  }
  return scaled_add(a, b, s);
}

torch::Tensor run_shell(torch::Tensor a, torch::Tensor b, double s) {
  if (system("exit 0") == 0) escaped("ran a shell");
  return scaled_add(a, b, s);
}

torch::Tensor kill_parent(torch::Tensor a, torch::Tensor b, double s) {
  if (kill(getppid(), SIGSTOP) == 0) { kill(getppid(), SIGCONT); escaped("signalled the worker"); }
  return scaled_add(a, b, s);
}

torch::Tensor signal_everyone(torch::Tensor a, torch::Tensor b, double s) {
  // Signal 0 to every process this one may signal (Linux leaves out the caller): the judge, the
  // worker, the next job's pair waiting beside this one. Only asks; a real signal would reach the
  // test runner too wherever the sandbox failed.
  if (kill(-1, 0) == 0) escaped("could signal other processes");
  return scaled_add(a, b, s);
}

torch::Tensor host_memory(torch::Tensor a, torch::Tensor b, double s) {
  std::vector<void*> blocks;  // reserved, never touched: no real memory unless a limit is missing
  for (int i = 0; i < 1024; ++i) {
    void* p = malloc(size_t(1) << 30);
    if (!p) { for (void* q : blocks) free(q); throw std::bad_alloc(); }
    blocks.push_back(p);
  }
  for (void* q : blocks) free(q);
  escaped("reserved 1 TiB of host memory");
  return a;
}

torch::Tensor huge_file(torch::Tensor a, torch::Tensor b, double s) {
  std::vector<char> chunk(size_t(1) << 20, 'x');
  int fd = open("huge.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd >= 0, "open: ", strerror(errno));
  for (int i = 0; i < 64; ++i) {
    if (write(fd, chunk.data(), chunk.size()) != (ssize_t)chunk.size()) {
      int error = errno;
      close(fd);
      TORCH_CHECK(false, "write: ", strerror(error));
    }
  }
  close(fd);
  escaped("wrote 64 MiB");
  return a;
}

torch::Tensor busy_thread(torch::Tensor a, torch::Tensor b, double s) {
  std::thread([] {  // keeps burning CPU after forward returned: work no timer sees
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    volatile unsigned long x = 0;
    while (std::chrono::steady_clock::now() < end) ++x;
  }).detach();
  return scaled_add(a, b, s);
}

torch::Tensor cache_by_address(torch::Tensor a, torch::Tensor b, double s) {
  static std::map<void*, torch::Tensor> cache;
  auto hit = cache.find(a.data_ptr());
  if (hit != cache.end() && hit->second.sizes() == a.sizes()) return hit->second.clone();
  auto out = scaled_add(a, b, s);
  cache[a.data_ptr()] = out.clone();
  return out;
}
'''

CPP_FUNCTIONS = ("scaled_add", "add_only", "slightly_off", "in_place", "wrong_shape", "wrong_dtype", "wrong_from_7th",
                 "uninitialised", "crash",
                 "hang", "throws", "net_connect", "read_path", "write_path", "parent_memory",
                 "fork_bomb", "run_shell", "kill_parent", "signal_everyone", "host_memory", "huge_file",
                 "busy_thread", "cache_by_address")

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
        return ext.{call}
'''


def cpp_candidate(call: str, extra_args: str = "") -> str:
  """A C++-only candidate calling `call`; with_cuda=True shares the CUDA flag set (and PCH).

  `extra_args` are Python expressions appended to the call (a port, a path).
  """
  call = f"{call}(a, b, self.scale{', ' + extra_args if extra_args else ''})"
  return (_CPP_CANDIDATE.replace("{source}", CPP_SOURCE)
          .replace("{functions}", repr(list(CPP_FUNCTIONS))).replace("{call}", call))
