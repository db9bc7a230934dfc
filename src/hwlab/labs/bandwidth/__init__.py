"""Lab 1, bandwidth-bound: an unfused elementwise chain and a strided layout.

The chain is what a transformer block runs after a linear layer, op by op in eager mode::

    t1 = x + bias          # read x (N), read bias (cols), write t1 (N)
    t2 = gelu_tanh(t1)     # read t1 (N), write t2 (N)
    t3 = t2 + residual     # read t2 (N), read residual (N), write t3 (N)
    y  = t3 * scale        # read t3 (N), write y (N)

Bytes moved: 5 reads + 4 writes of N elements = ``9 N`` items. Bytes *required*: read x
and residual, write y = ``3 N`` items. The chain does ``CHAIN_FLOPS_PER_ELEMENT`` FLOPs per
element on the 3 items it must move: in fp16 that is 11 FLOPs on 6 bytes, under 2 FLOP/byte
(and under 1 on the 18 bytes the unfused chain moves), about two orders of magnitude under
the ridge point of any modern GPU. So the unfused chain is bandwidth-bound, and its floor is
set by the 9N it moves; one fused kernel moves 3N, **a 3x predicted speed-up** from bytes
alone before anything is measured (each extra pass also costs a launch and a ramp, so the
measured gain can exceed it).

The layout case does the same work (``y = x * scale`` on a row-major matrix) two ways:
consecutive lanes walking along a row (coalesced: a warp's 32 x 4-byte loads hit 4
sectors of 32 bytes) or down a column (strided: 32 lanes hit 32 different sectors, so 8x
the sector traffic for fp32). Same bytes required, far more transactions: the memory
system saturates on waste. Predicted: several times slower; the H200 run says how many.

Every flowchart answer of every case is measured in the run: B from the case's own time
against the floor its required bytes set at this machine's copy ceiling; D
(``e2e_slowdown``) from the case run as one process serves it, ``scenarios.SERVICE_CALLS``
back-to-back calls timed as one step, over its own median x calls
(:func:`hwlab.labs.scenarios.one_gpu_service`); K (``rank_tail_pct``, ``n_ranks`` = 1) from
that one process's measured steps. ``metric_sources`` in each evidence dict says which.

The lab measures and returns evidence only; the walk is the consumers' floor
(:func:`hwlab.diagnosis.flowchart.walk_cases` fills :attr:`LabResult.diagnoses`).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hwlab.core import ncu, tritonenv  # noqa: F401  (tritonenv must precede kernel definitions)
from hwlab.core.measure import (
    TOL_BY_DTYPE, InputError, Measurement, bench, device_of, poison_, require_memory)
from hwlab.core.probes import hbm_copy
from hwlab.core.roofline import evidence_from_measurement
from hwlab.labs import scenarios
from hwlab.core.roofline import slowdown_spread

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

#: FLOPs per element of the chain: bias add 1, tanh-GELU 8 (x^3: 2, fma: 2, scale: 1,
#: exp+reciprocal counted as 2, final mul 1), residual add 1, scale 1.
CHAIN_FLOPS_PER_ELEMENT = 11
#: sector size of the memory system (bytes); a 4-byte strided access drags a whole sector
SECTOR_BYTES = 32
_SQRT_2_OVER_PI_X2 = 2.0 * math.sqrt(2.0 / math.pi)


# ---------------------------------------------------------------- the chain
def make_chain_inputs(n_rows: int, n_cols: int, dtype=torch.float16, device=None):
    """Fresh random ``x (rows, cols)``, ``bias (cols,)``, ``residual (rows, cols)``."""
    dev = device_of(device)
    tritonenv.check_dtype(dtype)
    x = torch.randn(n_rows, n_cols, device=dev, dtype=dtype)
    bias = torch.randn(n_cols, device=dev, dtype=dtype)
    residual = torch.randn(n_rows, n_cols, device=dev, dtype=dtype)
    return x, bias, residual


def unfused_chain(x, bias, residual, scale: float = 0.5):
    """The chain as eager PyTorch runs it: four kernels, three intermediates in DRAM."""
    t1 = x + bias
    t2 = torch.nn.functional.gelu(t1, approximate="tanh")
    t3 = t2 + residual
    return t3 * scale


def reference_chain(x, bias, residual, scale: float = 0.5):
    """float64 reference of the chain, on the inputs' device."""
    xd, bd, rd = (t.detach().double() for t in (x, bias, residual))
    return (torch.nn.functional.gelu(xd + bd, approximate="tanh") + rd) * scale


@triton.jit
def _fused_chain_kernel(x_ptr, b_ptr, r_ptr, y_ptr, n, n_cols, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    t = x + b
    # tanh-GELU: 0.5 t (1 + tanh(u)) == t * sigmoid(2u), u = sqrt(2/pi) (t + 0.044715 t^3)
    g = t * tl.sigmoid(2.0 * 0.7978845608028654 * (t + 0.044715 * t * t * t))
    tl.store(y_ptr + offs, ((g + r) * scale).to(y_ptr.dtype.element_ty), mask=mask)


def fused_chain(x, bias, residual, scale: float = 0.5, out=None, block: int = 2048,
                num_warps: int = 8):
    """The whole chain in one Triton kernel: read x and residual once, write y once."""
    if not (x.is_contiguous() and residual.is_contiguous()):
        raise InputError("fused_chain needs contiguous x and residual")
    y = torch.empty_like(x) if out is None else out
    n = x.numel()
    _fused_chain_kernel[(triton.cdiv(n, block),)](x, bias, residual, y, n, x.shape[-1], scale,
                                                  BLOCK=block, num_warps=num_warps)
    return y


def chain_traffic(n_rows: int, n_cols: int, itemsize: int) -> dict[str, int]:
    """Bytes required (fused), bytes moved by the unfused chain, and FLOPs."""
    n = n_rows * n_cols
    return {"bytes_required": (3 * n + n_cols) * itemsize,
            "bytes_moved_unfused": (9 * n + n_cols) * itemsize,
            "n_flops": CHAIN_FLOPS_PER_ELEMENT * n}


# ---------------------------------------------------------------- the layout case
@triton.jit
def _scale_kernel(x_ptr, y_ptr, n_rows, n_cols, scale, BLOCK: tl.constexpr,
                  COLUMN_MAJOR_WALK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n_rows * n_cols
    if COLUMN_MAJOR_WALK:
        row = idx % n_rows  # consecutive lanes go down a column: stride n_cols elements
        col = idx // n_rows
    else:
        row = idx // n_cols  # consecutive lanes go along a row: stride 1
        col = idx % n_cols
    off = row * n_cols + col
    v = tl.load(x_ptr + off, mask=mask)
    tl.store(y_ptr + off, v * scale, mask=mask)


def scale_layout(x, scale: float = 0.5, layout: str = "coalesced", out=None, block: int = 1024,
                 num_warps: int = 4):
    """``y = x * scale`` on a row-major matrix, walking it along rows or down columns."""
    if layout not in ("coalesced", "strided"):
        raise ValueError(f"layout must be 'coalesced' or 'strided', not {layout!r}")
    if x.dim() != 2 or not x.is_contiguous():
        raise InputError("scale_layout needs a contiguous 2-D tensor")
    y = torch.empty_like(x) if out is None else out
    n_rows, n_cols = x.shape
    _scale_kernel[(triton.cdiv(x.numel(), block),)](
        x, y, n_rows, n_cols, scale, BLOCK=block, COLUMN_MAJOR_WALK=(layout == "strided"),
        num_warps=num_warps)
    return y


def sector_amplification(layout: str, itemsize: int, n_cols: int) -> float:
    """Estimated sectors touched per warp request over the ideal (1.0 = perfectly coalesced).

    Strided with a stride of at least one sector: every lane's item drags its own sector,
    ``SECTOR_BYTES / itemsize`` times the ideal. An estimate from the access pattern; on a
    GPU, Nsight Compute's sectors/requests counters replace it.
    """
    if layout == "coalesced" or n_cols * itemsize < SECTOR_BYTES:
        return 1.0
    return SECTOR_BYTES / itemsize


# ---------------------------------------------------------------- the lab run
@dataclass
class LabResult:
    """One run of the lab: measurements and the evidence each case gives; ``diagnoses`` (case ->
    :class:`hwlab.diagnosis.flowchart.Diagnosis`) stays empty until a consumer walks the cases
    (:func:`hwlab.diagnosis.flowchart.walk_cases`)."""

    measurements: dict[str, Measurement]
    evidence: dict[str, dict[str, Any]]
    diagnoses: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    #: per case, the one-process service step behind D and K (:func:`scenarios.one_gpu_service`)
    service: dict[str, dict[str, Any]] = field(default_factory=dict)

    def speedup(self, slow: str, fast: str) -> float:
        return self.measurements[slow].t_ms / self.measurements[fast].t_ms

    def table(self) -> list[dict[str, Any]]:
        rows = []
        for k, m in self.measurements.items():
            ev = self.evidence.get(k, {})
            rows.append({"case": k, "t_ms": m.t_ms, "spread_pct": m.spread_pct,
                         "gbps_required": m.gbps, "pct_of_copy": m.pct_of_bw_ceiling,
                         "bytes_moved_gbps": ev.get("dram_pct_estimated", 0) * (m.ceiling_gbps or 0) / 100,
                         "ai_flop_per_byte": m.arithmetic_intensity,
                         "leaf": self.diagnoses[k].leaf_id if k in self.diagnoses else None})
        return rows


def default_size(device) -> tuple[int, int]:
    """8192 x 8192 on a GPU (64 Mi elements, ~20x an H200's L2 per tensor in fp16); tiny on CPU."""
    return (8192, 8192) if device_of(device).type == "cuda" else (64, 256)


def run(n_rows: int | None = None, n_cols: int | None = None, dtype=torch.float16,
        device=None, ceiling_gbps: float | None = None, n_rep: int = 50,
        cases=("unfused", "fused", "strided", "coalesced"), counters: dict | None = None) -> LabResult:
    """Measure every case, attach this machine's copy ceiling, build each case's flowchart
    evidence (walked by :func:`hwlab.diagnosis.flowchart.walk_cases`, not here).

    ``ceiling_gbps``: this machine's measured copy bandwidth (hwlab.core.ceilings); without it,
    the copy probe runs first. ``counters``: Nsight Compute readings per case (dram %,
    sector amplification), which replace the estimates in the flowchart evidence.
    Each case is also run as a one-process service step (``scenarios.SERVICE_CALLS`` calls,
    at most 10 steps) so D and K are measured, not assumed.
    """
    dev = device_of(device)
    if n_rows is None or n_cols is None:
        n_rows, n_cols = default_size(dev)
    if n_rows <= 0 or n_cols <= 0:
        raise InputError(f"sizes must be positive, got {n_rows} x {n_cols}")
    tritonenv.check_dtype(dtype)
    item = torch.tensor([], dtype=dtype).element_size()
    n = n_rows * n_cols
    require_memory(8 * n * item, dev, f"lab01 at {n_rows}x{n_cols} {dtype}")
    if ceiling_gbps is None:
        ceiling_gbps = hbm_copy(size_mib=max(1, min(1024, 4 * n * 4 // 2**20)), device=dev,
                                impl="torch").gbps
    tr = chain_traffic(n_rows, n_cols, item)
    tol = TOL_BY_DTYPE.get(str(dtype).replace("torch.", ""), 1e-2)
    out: dict[str, Measurement] = {}
    evid: dict[str, dict[str, Any]] = {}
    counters = counters or {}
    src = "measured copy in this run"

    def mk_chain():
        return make_chain_inputs(n_rows, n_cols, dtype, dev)

    if "unfused" in cases:
        out["unfused"] = bench("unfused", unfused_chain, mk_chain, n_bytes=tr["bytes_required"],
                               n_flops=tr["n_flops"], reference=reference_chain, tol=tol,
                               device=dev, n_rep=n_rep, params={"bytes_moved": tr["bytes_moved_unfused"]})
    if "fused" in cases:
        out["fused"] = bench("fused", fused_chain, mk_chain, n_bytes=tr["bytes_required"],
                             n_flops=tr["n_flops"], reference=reference_chain, tol=tol,
                             device=dev, n_rep=n_rep, params={"bytes_moved": tr["bytes_required"]})

    def mk_mat():
        return (torch.randn(n_rows, n_cols, device=dev, dtype=dtype),)

    ref_scale = lambda x: x.double().cpu() * 0.5  # noqa: E731
    fns = {"unfused": (unfused_chain, mk_chain), "fused": (fused_chain, mk_chain)}
    for layout in ("strided", "coalesced"):
        fns[layout] = (lambda x, L=layout: scale_layout(x, 0.5, L), mk_mat)
        if layout in cases:
            out[layout] = bench(layout, fns[layout][0], mk_mat,
                                n_bytes=2 * n * item, n_flops=n, reference=ref_scale, tol=tol,
                                device=dev, n_rep=n_rep,
                                params={"bytes_moved": 2 * n * item,
                                        "sector_amplification_est": sector_amplification(layout, item, n_cols)})
    services = {}
    for k, m in out.items():
        out[k] = m.with_ceilings(gbps=ceiling_gbps, source=src)
        out[k].params.update(n_rows=n_rows, n_cols=n_cols, dtype=str(dtype))
        c = counters.get(k, {})
        fn, make = fns[k]
        svc = services[k] = scenarios.one_gpu_service(fn, make, m.t_ms, dev, n_rep=min(n_rep, 10))
        ev = evidence_from_measurement(
            out[k], ceiling_gbps=ceiling_gbps, bytes_moved=m.params.get("bytes_moved"),
            sector_amplification=c.get("sector_amplification",
                                       m.params.get("sector_amplification_est")),
            dram_pct_of_peak=c.get("dram_pct_of_peak"),
            e2e_slowdown=svc["e2e_slowdown"], rank_tail_pct=svc["rank_tail_pct"],
            n_ranks=svc["n_ranks"])
        ev["metric_sources"] = {k_: v for k_, v in _metric_sources(m.name, c).items() if k_ in ev}
        evid[k] = ev
    # params["interpreted"]: interpreted Triton timings are NumPy speed; the walk refuses them
    return LabResult(out, evid, params={"n_rows": n_rows, "n_cols": n_cols,
                                               "dtype": str(dtype), "ceiling_gbps": ceiling_gbps,
                                               "device": out[next(iter(out))].device,
                                               "interpreted": tritonenv.INTERPRETED},
                     service=services)


def _metric_sources(case: str, counters: dict) -> dict[str, str]:
    """What measured each metric of a case's evidence (shown beside the walk's steps)."""
    src = {"slowdown_vs_floor": f"{case} alone vs its required bytes at the copy ceiling measured in this run",
           "dram_pct_estimated": f"{case}: bytes moved (traffic model) over time, vs the measured copy ceiling",
           "sector_amplification": ("Nsight Compute sectors loaded over the bytes the case must load"
                                    if "sector_amplification" in counters else
                                    "the layout's access model (estimate; Nsight Compute replaces it)"),
           **scenarios.SERVICE_SOURCE}
    if counters.get("dram_pct_of_peak") is not None:
        src["dram_pct_of_peak"] = "Nsight Compute dram__throughput, duration-weighted over the case's kernels"
    return src


def result_from_evidence(ev) -> LabResult:
    """Rebuild a :class:`LabResult` from a recorded evidence file (for CPU replay); walk it with
    :func:`hwlab.diagnosis.flowchart.walk_cases`."""
    ms = {m.name: m for m in ev.results}
    evid = {k: dict(v) for k, v in ev.extra.get("flowchart_evidence", {}).items()}
    for k, e in evid.items():  # B's spread re-derived from the recorded timing's p10-p90
        sp = slowdown_spread(ms[k], e.get("slowdown_vs_floor")) if k in ms else None
        if sp and "metric_spreads" not in e:
            e["metric_spreads"] = {"slowdown_vs_floor": sp}
    return LabResult(ms, evid, params=ev.extra.get("params", {}), service=ev.extra.get("service", {}))


# ---------------------------------------------------------------- Nsight Compute target
#: bytes each case loads by the traffic model, per element of the matrix (x itemsize)
LOADS_PER_ELEMENT = {"unfused": 5, "fused": 2, "strided": 1, "coalesced": 1}
NCU_RANGE = "hwlab_case"


def launch_case_once(case: str, n_rows: int, n_cols: int, dtype=torch.float16, device=None):
    """Warm up ``case`` then launch it once inside an NVTX range ncu can filter on."""
    dev = device_of(device)
    x, bias, residual = make_chain_inputs(n_rows, n_cols, dtype, dev)
    fn = {"unfused": lambda: unfused_chain(x, bias, residual),
          "fused": lambda: fused_chain(x, bias, residual),
          "strided": lambda: scale_layout(x, 0.5, "strided"),
          "coalesced": lambda: scale_layout(x, 0.5, "coalesced")}[case]
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NCU_RANGE)
    fn()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def counters_with_ncu(n_rows: int, n_cols: int, dtype=torch.float16,
                      cases=("unfused", "fused", "strided", "coalesced")) -> dict[str, dict]:
    """Nsight Compute readings per case: DRAM % of peak (duration-weighted over the case's
    kernels), sector amplification (sectors loaded x 32 B over the bytes the model says the
    case must load) and tensor-pipe %. Empty where ncu is absent."""
    if not ncu.available():
        return {}
    item = torch.tensor([], dtype=dtype).element_size()
    out = {}
    for case in cases:
        rows = ncu.profile(["-m", "hwlab.labs.bandwidth", "--ncu-case", case, "--rows",
                            str(n_rows), "--cols", str(n_cols), "--dtype", str(dtype).split(".")[-1]],
                           metrics=ncu.MEMORY_METRICS, nvtx_range=NCU_RANGE)
        if not rows:
            continue
        dur = [r.get("gpu__time_duration.sum", 0.0) for r in rows]
        total = sum(dur) or 1.0
        dram = sum(d * r.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
                   for d, r in zip(dur, rows)) / total
        sectors = sum(r.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", 0.0) for r in rows)
        need = LOADS_PER_ELEMENT[case] * n_rows * n_cols * item
        out[case] = {"dram_pct_of_peak": dram,
                     "sector_amplification": sectors * 32 / need if need else None,
                     "tensor_pipe_pct": max(r.get(ncu.TENSOR_METRIC, 0.0) for r in rows),
                     "kernels": [r.get("kernel", "") for r in rows], "source": "ncu"}
    return out


def _main(argv=None) -> None:
    p = argparse.ArgumentParser(description="launch one lab-1 case once (an ncu target)")
    p.add_argument("--ncu-case", required=True, choices=list(LOADS_PER_ELEMENT))
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=8192)
    p.add_argument("--dtype", default="float16")
    a = p.parse_args(argv)
    launch_case_once(a.ncu_case, a.rows, a.cols, getattr(torch, a.dtype))


if __name__ == "__main__":
    _main()
