"""The kit's one CUDA-graph helper: capture a callable once, check what a replay computes, then
time the replays under the measurement protocol (:func:`hwlab.core.measure.time_fn`).

Why a graph: one replay is one launch for the whole captured sequence, so its time is the
kernels plus the gaps the GPU itself leaves, without the host's per-kernel launch cost (Lab 2's
launch-bound step, the launch drill, Lab 4's decode TPOT). Why the checks: a graph replays
whatever was captured, with the inputs baked in by address; a replay that computes the wrong
thing must not be timed (the protocol's "correct first"). Where there are no CUDA graphs (a CPU)
the same steps run eagerly and say so (``graphed`` False), so the path is tested on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from hwlab.core.measure import Timing, synchronize, time_fn


@dataclass
class CapturedGraph:
    """One call of a function captured in a CUDA graph (or, where there are no CUDA graphs, the
    function itself): ``replay()`` re-runs it; ``out`` is the captured call's output, a static
    buffer every replay rewrites; ``graphed`` says which of the two it is."""

    replay: Callable[[], Any]
    out: Any
    graphed: bool
    graph: Any = None  # the torch.cuda.CUDAGraph, kept alive as long as this object


def capture_graph(fn: Callable[[], Any], device: torch.device, n_warmup: int = 3) -> CapturedGraph:
    """Capture one call of ``fn()`` in a CUDA graph, after ``n_warmup`` calls on a side stream.

    Why the side stream and the warm-up: a capture records what the first calls would allocate
    and compile (cuBLAS workspaces, Triton autotuning, lazy module init), which must happen
    before capture, off the capturing stream (PyTorch's CUDA-graph recipe). The inputs ``fn``
    reads are baked in by address: to feed new data, copy it into those tensors before a replay.
    On a CPU (no CUDA graphs) ``replay`` is ``fn`` itself and ``graphed`` is False: callers
    that time it must say the time is eager, not a graph's.
    """
    if device.type != "cuda":
        return CapturedGraph(replay=fn, out=fn(), graphed=False)
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(n_warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return CapturedGraph(replay=g.replay, out=out, graphed=True, graph=g)


def graph_time(fn: Callable[[], Any], device: torch.device, *, check: Callable[[Any], Any] | None = None,
               n_capture_warmup: int = 3, **time_kw: Any) -> tuple[Timing, CapturedGraph]:
    """Capture ``fn()`` once (:func:`capture_graph`), replay it once and pass the replay's output
    to ``check`` (compare it with a reference: a graph that captured the wrong thing is not
    timed), then time the replays with :func:`time_fn` (``time_kw``: ``n_warmup``, ``n_rep``,
    ...). One CUDA graph replay is one launch for the whole captured sequence, so the time is the
    kernels plus the gaps the GPU itself leaves, without the host's per-kernel launch cost. On a
    CPU the same steps run eagerly (``captured.graphed`` is False)."""
    cap = capture_graph(fn, device, n_capture_warmup)
    if check is not None:
        cap.replay()
        synchronize(device)
        check(cap.out)
    return time_fn(cap.replay, [()], device, **time_kw), cap
