"""A row-by-row Python loop over a small matrix: per row an index, a multiply, a tanh and a
copy into the output, so 192 tiny kernels per call, each finishing long before the host has
launched the next one."""
import torch


def tiny_kernels(x, w):
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = torch.tanh(x[i] * w)
    return out


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.randn(64, 1024, device=dev), torch.randn(1024, device=dev)
