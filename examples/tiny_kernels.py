"""An update written as a Python loop over a small tensor: 128 tiny kernels per call, each
finishing long before the next one is launched."""
import torch


def tiny_kernels(x):
    for _ in range(64):
        x = x * 0.999 + 0.001
    return x


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return (torch.randn(4096, device=dev),)
