"""Shared by tests/eval and tests/generate: one real loopback verifier and one tiny random model
per pytest session (so the few real nvcc compiles happen once), and a CLI runner.

The fixtures are imported by the test modules that use them (no conftest.py: a second module
named `conftest` on sys.path would shadow tests/conftest.py for `from conftest import ...`).

The verifier is `dice-verifier serve` started through `--verifier local`'s own LocalVerifier, with
its compile cache under the session's temporary directory. On this CPU machine it compiles and
answers NO_GPU. The model is a random SDAR-layout checkpoint written with `save_pretrained` and the
byte tokenizer, with a context long enough for the real prompts.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib

import pytest

from dice_jax.verifier.local import LocalVerifier

_SHARED: dict[str, object] = {}

# A correct candidate for bundled:tiny's tiny_relu whose build is cheap: no implicit torch headers,
# so nvcc and g++ parse only cuda_runtime.h and pybind11 (about 10 s here instead of a minute for
# a torch/extension.h build). It is the one real compile the eval and generate tests share.
LIGHT_RELU = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = \"\"\"
#include <cstdint>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_launch(int64_t x, int64_t out, int64_t n) {
    relu_kernel<<<(unsigned)((n + 255) / 256), 256>>>((const float*)x, (float*)out, n);
}
\"\"\"

cpp_src = \"\"\"
#include <cstdint>
#include <pybind11/pybind11.h>
void relu_launch(int64_t x, int64_t out, int64_t n);
\"\"\"

ext = load_inline(name="light_relu", cpp_sources=cpp_src, cuda_sources=source, functions=["relu_launch"],
                  no_implicit_headers=True, with_pytorch_error_handling=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        ext.relu_launch(x.data_ptr(), out.data_ptr(), x.numel())
        return out
'''


TINY_MODEL = dict(model_type="sdar", vocab_size=264, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  block_size=4, mask_token_id=259, rope_theta=10000.0, max_position_embeddings=8192,
                  eos_token_id=258, bos_token_id=256)


@pytest.fixture(scope="session")
def verifier_target(request, tmp_path_factory) -> str:
  """HOST:PORT of the session's loopback verifier (started on first use, stopped at exit)."""
  if "verifier" not in _SHARED:
    base = tmp_path_factory.getbasetemp()
    local = LocalVerifier(cache_dir=base / "eval-verifier-cache", log_path=base / "eval-verifier.log",
                          compile_workers=2)
    local.start()
    request.config.add_cleanup(local.stop)
    _SHARED["verifier"] = local
  return _SHARED["verifier"].target


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> pathlib.Path:
  """A random tiny SDAR checkpoint (HF layout + byte tokenizer), written once per session."""
  if "model" not in _SHARED:
    from dice_jax.model import hf_io, transformer  # pylint: disable=import-outside-toplevel
    from dice_jax.model.config import ModelConfig  # pylint: disable=import-outside-toplevel
    from dice_jax.train import tiny_tokenizer  # pylint: disable=import-outside-toplevel
    base = tmp_path_factory.getbasetemp()
    tok = tiny_tokenizer.write_byte_tokenizer(base / "tiny-tokenizer")
    model = transformer.init_model(ModelConfig.from_hf_dict(dict(TINY_MODEL)), seed=0)
    _SHARED["model"] = hf_io.save_pretrained(model, base / "tiny-model", tokenizer_dir=tok)
  return _SHARED["model"]


def run_cli(command: str, *argv: str) -> int:
  """Runs `dice <command> argv...` through the module's own add_parser/run."""
  module = importlib.import_module(f"dice_jax.cli.{command}")
  parser = argparse.ArgumentParser(prog="dice")
  module.add_parser(parser.add_subparsers())
  return module.run(parser.parse_args([command, *map(str, argv)]))
