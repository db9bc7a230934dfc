"""A bf16 matrix product whose inner dimension K = 8191 is not a multiple of 8: the rows of
the operands are not 16-byte aligned, which keeps cuBLAS off its fastest tensor-core kernels."""
import torch


def gemm_misaligned(a, b):
    return a @ b


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n, k = (8192, 8191) if dev == "cuda" else (256, 255)
    return (torch.randn(n, k, device=dev, dtype=torch.bfloat16),
            torch.randn(k, n, device=dev, dtype=torch.bfloat16))
