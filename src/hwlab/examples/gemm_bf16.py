"""A healthy bf16 matrix product at a large, aligned shape: cuBLAS's tensor-core kernels."""
import torch


def gemm_bf16(a, b):
    return a @ b


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 8192 if dev == "cuda" else 256
    return (torch.randn(n, n, device=dev, dtype=torch.bfloat16),
            torch.randn(n, n, device=dev, dtype=torch.bfloat16))
