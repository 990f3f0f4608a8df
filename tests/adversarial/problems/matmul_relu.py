import torch
import torch.nn as nn


class Model(nn.Module):
    """relu(A @ B + bias), 1024 x 1024 float32: a GEMM with an epilogue."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(1024))

    def forward(self, A, B):
        return torch.relu(torch.matmul(A, B) + self.bias)


def get_inputs():
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]


def get_init_inputs():
    return []
