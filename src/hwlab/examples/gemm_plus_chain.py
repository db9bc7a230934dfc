"""A function built from two parts of known cost: a GEMM, and an activation chain written op by
op (six elementwise passes where one would do). ``hwlab examine`` splits its time into the two
parts; each part can also be examined alone (``gemm_only``, ``chain_only``) to check the split:
the parts' times in the whole should match the parts timed alone, and the headline should be
the part whose expected gain is larger."""
import torch


def chain_only(x):
    y = x * 1.5
    y = y + 0.25
    y = torch.relu(y)
    y = y * x
    y = torch.sigmoid(y)
    return y + 1.0


def gemm_only(a, b):
    return a @ b


def gemm_plus_chain(a, b, x):
    return gemm_only(a, b), chain_only(x)


def sizes():
    gpu = torch.cuda.is_available()
    return ("cuda", torch.bfloat16, 4096, 1 << 26) if gpu else ("cpu", torch.float32, 512, 1 << 23)


def inputs():
    dev, dt, n, m = sizes()
    return (torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt),
            torch.randn(m, device=dev))
