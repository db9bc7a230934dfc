"""Small scenarios for the two flowchart leaves no big lab holds.

* **Tensor-Core / dtype path** (leaf I): the same GEMM in fp32 with TF32 off (the CUDA cores),
  in TF32, and in bf16 (the MMA path), plus a bf16 GEMM whose K is not a multiple of 8 (the
  MMA-friendly alignment). Floor: the FLOPs at this machine's measured bf16 GEMM rate.
  Each case is also run as a one-GPU "service" (the GEMM called back to back as a layer's
  step would) so the chart's service and rank-tail questions are measured, not assumed.
* **Workload** (leaf M): a benchmark on one tuned shape (a large bf16 GEMM) predicts a
  serving step of decode- and prefill-shaped GEMMs; the real mix runs slower than predicted,
  on one GPU, with no rank tail. Measuring each bucket on its own (decode GEMMs are
  memory-bound and follow the copy roofline, not the GEMM rate) predicts it.

Every flowchart answer is measured in the run (:data:`hwlab.diagnosis.flowchart` question ids):

* B ``slowdown_vs_floor``: the workload's own kernels run alone on one device against this
  machine's roofline floor (FLOPs at the measured GEMM ceiling or bytes at the measured copy
  ceiling, whichever is larger);
* D ``e2e_slowdown``: the measured step over what those single-kernel measurements predict;
* K ``rank_tail_pct`` with ``n_ranks``: from the measured per-rank step distribution; a
  one-process workload has one rank, measured, so its tail is 0 by measurement.

``metric_sources`` in each evidence dict says what measured each metric.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

import torch

from hwlab.core.measure import Measurement, device_of, time_fn
from hwlab.core.probes import gemm, matmul_at
from hwlab.core.tails import tail_pct_of_step

#: calls of the workload's kernel per measured service step (a layer's worth of launches)
SERVICE_CALLS = 8


def rank_tail_pct(per_rank_step_ms: Sequence[Sequence[float]]) -> float:
    """The K figure of per-rank step series: the slowest rank's median step minus the median rank's,
    in % of the median step (:func:`hwlab.core.tails.tail_pct_of_step` with no tail split off).
    One rank: its own median against itself, 0.0 by measurement."""
    meds = [statistics.median(r) for r in per_rank_step_ms if len(r)]
    if not meds:
        raise ValueError("rank_tail_pct needs at least one rank with measured steps")
    return tail_pct_of_step(dict(enumerate(meds)), [], statistics.median(meds))


def one_gpu_service(fn: Callable[..., Any], make_inputs: Callable[[], Sequence[Any]], kernel_ms: float,
                    device=None, n_calls: int = SERVICE_CALLS, n_rep: int = 10,
                    predicted_ms: float | None = None) -> dict[str, Any]:
    """Measure the workload as one process serves it: ``n_calls`` back-to-back calls timed as
    one step (per-step samples from this one rank). ``e2e_slowdown`` = measured step over the
    single-kernel prediction (``predicted_ms``, default ``n_calls * kernel_ms``); the rank tail
    comes from the measured steps of the one rank (``n_ranks`` = 1)."""
    dev = device_of(device)
    args = tuple(make_inputs())

    def step():
        for _ in range(n_calls):
            fn(*args)

    t = time_fn(step, [()], dev, n_warmup=2, n_rep=n_rep)
    pred = predicted_ms if predicted_ms is not None else n_calls * kernel_ms
    return {"e2e_slowdown": t.median_ms / pred, "rank_tail_pct": rank_tail_pct([t.samples_ms]),
            "n_ranks": 1, "service_step_ms": t.median_ms, "service_calls": n_calls,
            "service_predicted_ms": pred}


SERVICE_SOURCE = {
    "e2e_slowdown": "step of back-to-back calls timed in this run over the kernel's own median x calls",
    "rank_tail_pct": "per-step times of the one process (n_ranks=1), measured",
}


def floor_ms(n_flops: int, n_bytes: int, tflops: float, gbps: float) -> float:
    """Roofline floor: the larger of FLOPs at the measured GEMM rate and bytes at the copy rate."""
    return max(n_flops / (tflops * 1e12) * 1e3, n_bytes / (gbps * 1e9) * 1e3)


def _gemm_fn(dtype: str, M: int, N: int, K: int, dev):
    return matmul_at(dtype, M, N, K, dev)


def dtype_path(size: int | None = None, device=None, copy_gbps: float | None = None,
               cases: Sequence[str] = ("fp32", "tf32", "bf16", "bf16_unaligned")) -> dict[str, Any]:
    """GEMM by dtype path; ``copy_gbps`` (this machine's copy ceiling, default: cached ceilings)
    gives the estimated DRAM share the flowchart's memory question needs. The floor is the
    FLOPs at the bf16 rate measured in this run (the MMA path this card offers)."""
    dev = device_of(device)
    if copy_gbps is None:
        from hwlab.core.ceilings import get
        copy_gbps = get(dev, quick=True).copy_gbps
    gpu = dev.type == "cuda"
    size = size or (8192 if gpu else 256)
    shapes = {"fp32": ("fp32", size), "tf32": ("tf32", size), "bf16": ("bf16", size),
              "bf16_unaligned": ("bf16", size - 1)}
    want = list(dict.fromkeys([*cases, "bf16"]))  # bf16 sets the floor
    ms: dict[str, Measurement] = {}
    for k in want:
        dt, kk = shapes[k]
        ms[k] = gemm(m=size, n=size, k=kk, dtype=dt, device=dev, n_rep=10)
        if k == "bf16_unaligned":
            ms[k].name = "gemm[bf16, K not a multiple of 8]"
    best = ms["bf16"].tflops
    evid, services = {}, {}
    for k in cases:
        m = ms[k]
        if k == "tf32":  # a tensor-core path at half bf16's rate: a partial fix, shown, not diagnosed
            continue
        dt, kk = shapes[k]
        fn, make = _gemm_fn(dt, size, size, kk, dev)
        svc = services[k] = one_gpu_service(fn, make, m.t_ms, dev)
        evid[k] = {"slowdown_vs_floor": best / m.tflops, "tensor_pct_of_peak": 100.0 * m.tflops / best,
                   "dram_pct_estimated": 100.0 * m.gbps / copy_gbps,
                   "e2e_slowdown": svc["e2e_slowdown"], "rank_tail_pct": svc["rank_tail_pct"],
                   "n_ranks": svc["n_ranks"],
                   "metric_sources": {
                       "slowdown_vs_floor": f"{m.name} alone vs the FLOPs at bf16's measured rate (this run)",
                       "tensor_pct_of_peak": f"{m.name} TFLOP/s over bf16's in this run",
                       "dram_pct_estimated": f"{m.name} bytes/time over the measured copy ceiling",
                       **SERVICE_SOURCE}}
    return {"measurements": ms, "flowchart_evidence": evid, "size": size, "copy_gbps": copy_gbps,
            "service": services}


#: a serving step: (label, M, N, K, count) — decode GEMMs at batch 16, one prefill chunk
def step_mix(gpu: bool) -> list[tuple[str, int, int, int, int]]:
    if gpu:
        return [("decode qkv/out/mlp", 16, 8192, 8192, 24), ("prefill chunk", 2048, 8192, 8192, 4)]
    return [("decode qkv/out/mlp", 4, 128, 128, 6), ("prefill chunk", 64, 128, 128, 2)]


def workload_mix(device=None, n_rep: int = 10, ceilings=None) -> dict[str, Any]:
    """Predict the step from one tuned shape, then from per-bucket measurements; measure it.

    B (``slowdown_vs_floor``): the tuned shape alone against this machine's floor (its FLOPs
    at the measured GEMM ceiling, its bytes at the measured copy ceiling); for the bucketed
    case, the buckets' kernels alone against the sum of their floors. D (``e2e_slowdown``):
    the measured mixed step over what the single-shape (or per-bucket) measurements predict.
    K: the one process's measured step distribution (``n_ranks`` = 1). ``ceilings``: this
    machine's :class:`~hwlab.core.ceilings.Ceilings` (default: the cached ones, quick)."""
    dev = device_of(device)
    gpu = dev.type == "cuda"
    if ceilings is None:
        from hwlab.core.ceilings import get
        ceilings = get(dev, quick=True)
    dname = "bf16" if gpu else "fp32"
    dt = torch.bfloat16 if gpu else torch.float32
    rate = ceilings.gemm_tflops.get(dname) or max(ceilings.gemm_tflops.values())
    copy = ceilings.copy_gbps
    tuned = gemm(size=8192 if gpu else 128, dtype=dname, device=dev, n_rep=n_rep)
    mix = step_mix(gpu)
    buckets: dict[str, Measurement] = {}
    for label, M, N, K, _count in mix:
        m = gemm(m=M, n=N, k=K, dtype=dname, device=dev, n_rep=n_rep)
        m.name = f"bucket: {label} {M}x{N}x{K}"
        buckets[label] = m
    weights = [(torch.randn(M, K, device=dev, dtype=dt), torch.randn(K, N, device=dev, dtype=dt), c)
               for _l, M, N, K, c in mix]

    def step():
        for a, b, c in weights:
            for _ in range(c):
                a @ b

    t = time_fn(step, [()], dev, n_warmup=3, n_rep=n_rep)
    flops = sum(2 * M * N * K * c for _l, M, N, K, c in mix)
    pred_tuned_ms = flops / (tuned.tflops * 1e12) * 1e3
    pred_bucket_ms = sum(buckets[label].t_ms * c for label, *_s, c in mix)
    measured = t.median_ms
    tail = rank_tail_pct([t.samples_ms])
    tuned_floor = floor_ms(tuned.n_flops, tuned.n_bytes, rate, copy)
    bucket_floor = sum(floor_ms(buckets[label].n_flops, buckets[label].n_bytes, rate, copy) * c
                       for label, *_s, c in mix)
    bucket_bytes = sum(buckets[label].n_bytes * c for label, *_s, c in mix)
    k_src = "per-step times of the one process serving the mix (n_ranks=1), measured"
    ceil_src = f"this machine's ceilings ({dname} GEMM {rate:.4g} TFLOP/s, copy {copy:.4g} GB/s)"
    return {"tuned": tuned, "buckets": buckets, "measured_step_ms": measured,
            "step_samples_ms": list(t.samples_ms),
            "predicted_from_tuned_ms": pred_tuned_ms, "predicted_from_buckets_ms": pred_bucket_ms,
            "floor_tuned_ms": tuned_floor, "floor_buckets_ms": bucket_floor,
            "ceilings": {"gemm_tflops": rate, "copy_gbps": copy, "dtype": dname},
            "mix": [list(x) for x in mix],
            "flowchart_evidence": {
                "tuned-shape prediction": {
                    "slowdown_vs_floor": tuned.t_ms / tuned_floor, "e2e_slowdown": measured / pred_tuned_ms,
                    "dram_pct_estimated": 100.0 * tuned.gbps / copy, "tensor_pct_of_peak": 100.0 * tuned.tflops / rate,
                    "rank_tail_pct": tail, "n_ranks": 1,
                    "metric_sources": {
                        "slowdown_vs_floor": f"{tuned.name} alone vs its floor at {ceil_src}",
                        "e2e_slowdown": "measured mixed step over the tuned shape's rate x the step's FLOPs",
                        "rank_tail_pct": k_src}},
                "bucketed prediction": {
                    "slowdown_vs_floor": pred_bucket_ms / bucket_floor, "e2e_slowdown": measured / pred_bucket_ms,
                    "dram_pct_estimated": 100.0 * bucket_bytes / (pred_bucket_ms * 1e-3) / 1e9 / copy,
                    "tensor_pct_of_peak": 100.0 * flops / (pred_bucket_ms * 1e-3) / 1e12 / rate,
                    "rank_tail_pct": tail, "n_ranks": 1,
                    "metric_sources": {
                        "slowdown_vs_floor": f"each bucket's GEMM alone (x its count) vs its floor at {ceil_src}",
                        "e2e_slowdown": "measured mixed step over the sum of per-bucket measurements",
                        "rank_tail_pct": k_src}}}}
