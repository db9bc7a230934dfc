"""A random row gather: ``index_select`` of 32-byte rows (8 fp32 values) from a large table
through random indices, as an embedding or a sparse feature lookup does. No matmul: the
tensor-core question does not apply; each row is one 32-byte sector fetched from a random place,
so the GPU waits on memory latency unless many requests are in flight."""
import torch


def row_gather(table, idx):
    return table.index_select(0, idx)


def inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n_rows, n_idx = ((1 << 24), (1 << 22)) if dev == "cuda" else ((1 << 20), (1 << 18))
    return torch.randn(n_rows, 8, device=dev), torch.randint(0, n_rows, (n_idx,), device=dev)
