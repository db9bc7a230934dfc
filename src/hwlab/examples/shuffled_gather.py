"""Reading a tensor through a shuffled index (an embedding-style lookup of single values):
neighbouring output elements come from far-apart places, so each 4-byte value drags its own
32-byte sector out of memory."""
import torch


def shuffled_gather(x, perm):
    return x[perm]


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = (1 << 26) if dev == "cuda" else (1 << 16)
    return torch.randn(n, device=dev), torch.randperm(n, device=dev)
