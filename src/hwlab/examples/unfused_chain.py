"""A user's activation chain written op by op: six elementwise kernels, each reading and
writing the whole tensor, where one pass would do. Expected to be bandwidth-bound and
wasteful: every intermediate crosses DRAM."""
import torch


def unfused_chain(x):
    y = x * 1.5           # read x, write y
    y = y + 0.25          # read y, write y'
    y = torch.relu(y)     # read, write
    y = y * x             # read y and x, write
    y = torch.sigmoid(y)  # read, write
    return y + 1.0        # read, write


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = (1 << 26) if dev == "cuda" else (1 << 16)  # 256 MiB of fp32 on a GPU: far past L2
    return (torch.randn(n, device=dev),)
