"""The same kind of activation chain as unfused_chain.py, handed to torch.compile, which
fuses it into one kernel: each byte read once, written once. The first call compiles (tens of
seconds); hwlab examine keeps that out of the timed median and reports it."""
import torch


def _chain(x):
    y = x * 1.5
    y = y + 0.25
    y = torch.relu(y)
    y = y * x
    y = torch.sigmoid(y)
    return y + 1.0


compiled_chain = torch.compile(_chain, dynamic=False)


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = (1 << 26) if dev == "cuda" else (1 << 16)
    return (torch.randn(n, device=dev),)
