"""A CPU's cost per aten op, measured: what a call of many tiny ops pays before any work is done.

On a GPU a step of many small kernels shows as GPU idle time between launches (the launch rule of
J). A CPU has no idle device: the same cost is each op's dispatch, output allocation and bookkeeping,
paid on the thread that also does the work. It is measured here as the time per op of a loop of
out-of-place adds on a one-element tensor (:data:`N_OPS` of them, the median of :data:`N_REP` loops,
net of the run-queue wait): the work is negligible, so the time is the per-op path.

A part's **per-op share** is its aten ops per call x that cost over its time: at
:data:`PER_OP_SHARE_MIN` or more, the ops' own overhead is what bounds it (J, "per-op overhead").
"""
from __future__ import annotations

from typing import Any

#: ops per timed loop, and loops timed
N_OPS = 400
N_REP = 7
#: a part whose op count x per-op cost is at least this share of its time is bound by per-op
#: overhead: half its time or more is spent getting to the work, so fewer, larger ops is the fix
PER_OP_SHARE_MIN = 0.5


def per_op_us(dev) -> dict[str, Any] | None:
    """``{"us", "us_p10", "us_p90", "source"}`` per aten op on this CPU (module doc); None on a GPU."""
    if getattr(dev, "type", "cpu") == "cuda":
        return None
    import torch

    from hwlab.core.measure import time_fn

    x = torch.randn(1)

    def loop(t):
        for _ in range(N_OPS):
            torch.add(t, 1.0)
        return t

    with torch.no_grad():
        m = time_fn(loop, [(x,)], dev, n_warmup=2, n_rep=N_REP, net_of_wait=True)
    return {"us": m.median_ms * 1e3 / N_OPS, "us_p10": m.p10_ms * 1e3 / N_OPS, "us_p90": m.p90_ms * 1e3 / N_OPS,
            "source": f"a loop of {N_OPS} out-of-place adds on a one-element tensor, median of {N_REP}, net of "
                      "the run-queue wait"}


def per_op_share(n_ops: float | None, t_ms: float, cost: dict[str, Any] | None) -> float | None:
    """Ops per call x the measured per-op cost, over ``t_ms`` (0-1, capped at 1); None unmeasured."""
    if not cost or not n_ops or t_ms <= 0:
        return None
    return min(1.0, n_ops * cost["us"] / (t_ms * 1e3))
