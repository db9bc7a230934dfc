"""The launch-bound step: many tiny kernels, each shorter on the GPU than its launch on the CPU.

A small-batch decode step (:func:`decode_like_step`) runs 3 elementwise kernels per layer on a
hidden vector of a few thousand floats: each launch costs microseconds of CPU and driver time
while its GPU work is shorter, so the GPU idles between kernels. Captured once in a CUDA graph,
the same kernels replay without the launch path; the replay is the step's floor. The GPU's idle
share of the eager step is estimated as ``1 - t_graph / t_eager`` (percent).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hwlab.core.measure import TOL_BY_DTYPE, Measurement, check_close, device_name, device_of, time_fn
from hwlab.core.measure_graph import graph_time
from hwlab.labs import scenarios

#: tolerance of the float32 step against its float64 reference: 10x float32's, since every
#: layer's silu compounds the rounding of the previous one
STEP_TOL = TOL_BY_DTYPE["float32"] * 10


def decode_like_step(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """A small-batch decode step: per layer a scale, a bias add and an activation on a tiny
    hidden vector: 3 kernels per layer, each far shorter than its launch."""
    for w in weights:
        x = torch.nn.functional.silu(x * w[0] + w[1])
    return x


@dataclass
class LaunchResult:
    n_kernels: int
    eager: Measurement
    graph: Measurement | None
    us_per_launch_eager: float
    us_per_kernel_graph: float | None
    gpu_idle_pct_eager: float | None  # estimated: 1 - t_graph / t_eager
    note: str = ""
    #: the eager step as one process serves it (D and K), :func:`scenarios.one_gpu_service`
    service: dict | None = None

    @property
    def speedup(self) -> float | None:
        return self.eager.t_ms / self.graph.t_ms if self.graph else None

    def to_dict(self) -> dict:
        return {"n_kernels": self.n_kernels, "eager": self.eager.to_dict(),
                "graph": self.graph.to_dict() if self.graph else None,
                "us_per_launch_eager": self.us_per_launch_eager,
                "us_per_kernel_graph": self.us_per_kernel_graph,
                "gpu_idle_pct_eager": self.gpu_idle_pct_eager, "speedup": self.speedup,
                "note": self.note, "service": self.service}


def launch_bound(n_layers: int = 64, hidden: int = 4096, device=None, n_rep: int = 50) -> LaunchResult:
    """Eager step vs the same step replayed from a CUDA graph (GPU); eager only on CPU. The
    eager step is also run as one process serves it (back-to-back steps timed as one, D and K)."""
    dev = device_of(device)
    weights = [torch.randn(2, hidden, device=dev) for _ in range(n_layers)]
    x = torch.randn(hidden, device=dev)
    n_k = 3 * n_layers
    ref = decode_like_step(x.double().cpu(), [w.double().cpu() for w in weights])
    out = decode_like_step(x, weights)
    err = check_close(out, ref, STEP_TOL, "decode step")
    t = time_fn(lambda: decode_like_step(x, weights), [()], dev, n_warmup=5, n_rep=n_rep)
    eager = Measurement("eager step", t.median_ms, t.p10_ms, t.p90_ms, n_bytes=n_k * 2 * hidden * 4,
                        n_flops=n_k * hidden, device=device_name(dev), timer=t.timer,
                        n_rep=len(t.samples_ms), rel_err=err, tol=STEP_TOL,
                        params={"n_layers": n_layers, "hidden": hidden, "n_kernels": n_k})
    svc = scenarios.one_gpu_service(decode_like_step, lambda: (x, weights), t.median_ms, dev,
                                    n_rep=min(n_rep, 10))
    if dev.type != "cuda":
        return LaunchResult(n_k, eager, None, t.median_ms * 1e3 / n_k, None, None,
                            note="CUDA graphs need a GPU: eager dispatch cost only (CPU)", service=svc)
    static_x = x.clone()
    tg, _ = graph_time(lambda: decode_like_step(static_x, weights), dev,
                       check=lambda out: check_close(out, ref, STEP_TOL, "graph replay"), n_warmup=5, n_rep=n_rep)
    graph = Measurement("graph replay", tg.median_ms, tg.p10_ms, tg.p90_ms, n_bytes=eager.n_bytes,
                        n_flops=eager.n_flops, device=device_name(dev), timer=tg.timer,
                        n_rep=len(tg.samples_ms), params=dict(eager.params))
    idle = max(0.0, 100.0 * (1 - tg.median_ms / t.median_ms))
    return LaunchResult(n_k, eager, graph, t.median_ms * 1e3 / n_k, tg.median_ms * 1e3 / n_k, idle,
                        note="GPU idle share estimated as 1 - t_graph / t_eager", service=svc)
