"""Lab 4's zeroed scratch buffers (:mod:`hwlab.labs.fp8.workspace`): one per (device, name),
reused while large enough, grown when not, and a grown buffer's old tensor kept alive (a CUDA
graph captured before the growth still uses its address)."""
import torch

from hwlab.labs.fp8 import workspace as W


def test_buffers_are_reused_grown_and_the_old_one_kept_alive():
    a = W.zeroed("cpu", "test_buf", 10, torch.int32)
    assert a.numel() == 10 and a.abs().max() == 0 and W.buffer("cpu", "test_buf") is a
    assert W.zeroed("cpu", "test_buf", 4, torch.int32) is a  # large enough: the same tensor
    a[0] = 7  # what a graph captured on the old buffer would still touch
    b = W.zeroed("cpu", "test_buf", 32, torch.int32)
    assert b is not a and b.numel() == 32 and b.abs().max() == 0
    assert any(t is a for t in W._RETIRED) and int(a[0]) == 7  # kept, not freed
    assert W.zeroed("cpu", "other_buf", 4, torch.float32) is not b  # names are separate
