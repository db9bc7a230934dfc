"""A plain fp32 matrix product with PyTorch's default precision ("highest": no TF32), so it
runs on the CUDA cores instead of the tensor cores."""
import torch


def gemm_fp32(a, b):
    return a @ b


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 8192 if dev == "cuda" else 256
    return torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
