"""Node health baselines: record what a machine looks like when it is healthy, then compare.

A baseline holds the seed's five parts: **topology** (nvidia-smi topo -m, GPU ordinals, NUMA),
**bandwidth** (HBM copy, host link, P2P and NCCL where there are several GPUs), **kernel
probes** (GEMM, attention via SDPA, RMSNorm, KV-cache read), **system state** (NVML) and the
**runtime path** (dtypes, FP8 kernel hit rate and fallback rate of a decode-shaped step).
A part that cannot run here is recorded as missing with the reason, never fatal.

:func:`compare` (in :mod:`hwlab.diagnosis.baseline_compare`, re-exported here) classifies every deviation
of a new record from a baseline, after checking the two records are comparable at all.
"""
from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity

from hwlab.core import comms, probes, system, topology
from hwlab.diagnosis.baseline_compare import (  # noqa: F401  (re-exported: `baseline.compare` is the public name)
    BASELINE_KIND, LATENCY_PROBES, MEASURED_PARAMS, NEXT, TOL_HIT_PP, TOL_LATENCY_PCT, TOL_RATE_PCT,
    TOL_TEMP_C, Comparison, Deviation, _probe_value, comparability, compare, fleet_table)
from hwlab.core.evidence import Evidence, machine_info
from hwlab.labs import crosslink
from hwlab.core.measure import TOL_BY_DTYPE, Measurement, bench, device_of
from hwlab.core.profiling import hit_rate_from_events, profiler_events, quiet_profile



# ---------------------------------------------------------------- kernel probes
def _sdpa_probe(dev, quick: bool) -> Measurement:
    gpu = dev.type == "cuda"
    B, H, T, D = (4, 32, 4096, 128) if gpu and not quick else (2, 4, 256, 64)
    dt = torch.bfloat16 if gpu else torch.float32
    mk = lambda: tuple(torch.randn(B, H, T, D, device=dev, dtype=dt) for _ in range(3))  # noqa: E731
    fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    # reference: the math path on upcast inputs, on the same device (a float64 CPU copy of
    # the 4x32x4096^2 score matrix would need 17 GB)
    up = torch.float32 if gpu else torch.float64
    ref = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q.to(up), k.to(up), v.to(up), is_causal=True)
    return bench("attention[sdpa causal]", fn, mk, n_bytes=4 * B * H * T * D * dt.itemsize,
                 n_flops=2 * 2 * B * H * T * T * D // 2, reference=ref,
                 tol=TOL_BY_DTYPE["bfloat16"] if gpu else 1e-4, device=dev, n_rep=20,
                 params={"B": B, "H": H, "T": T, "D": D})


def rmsnorm(x, w, eps: float = 1e-6):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def _rmsnorm_probe(dev, quick: bool) -> Measurement:
    gpu = dev.type == "cuda"
    rows, cols = (65536, 8192) if gpu and not quick else (512, 1024)
    dt = torch.bfloat16 if gpu else torch.float32
    mk = lambda: (torch.randn(rows, cols, device=dev, dtype=dt), torch.randn(cols, device=dev, dtype=dt))  # noqa: E731
    return bench("rmsnorm[eager]", rmsnorm, mk, n_bytes=2 * rows * cols * dt.itemsize,
                 n_flops=4 * rows * cols, reference=lambda x, w: rmsnorm(x.double(), w.double()),
                 tol=TOL_BY_DTYPE["bfloat16"] if gpu else 1e-5, device=dev, n_rep=20,
                 params={"rows": rows, "cols": cols})


def _kv_read_probe(dev, quick: bool) -> Measurement:
    """Decode attention over a long KV cache: one query per sequence reads the whole cache."""
    gpu = dev.type == "cuda"
    B, H, T, D = (16, 8, 32768, 128) if gpu and not quick else (2, 4, 512, 64)
    dt = torch.bfloat16 if gpu else torch.float32

    def mk():
        return (torch.randn(B, H, 1, D, device=dev, dtype=dt), torch.randn(B, H, T, D, device=dev, dtype=dt),
                torch.randn(B, H, T, D, device=dev, dtype=dt))
    fn = torch.nn.functional.scaled_dot_product_attention
    up = torch.float32 if gpu else torch.float64
    ref = lambda q, k, v: fn(q.to(up), k.to(up), v.to(up))  # noqa: E731
    return bench("kv_cache_read[decode sdpa]", fn, mk, n_bytes=2 * B * H * T * D * dt.itemsize,
                 n_flops=4 * B * H * T * D, reference=ref, tol=TOL_BY_DTYPE["bfloat16"] if gpu else 1e-5,
                 device=dev, n_rep=20, params={"B": B, "H": H, "T": T, "D": D})


# ---------------------------------------------------------------- runtime path
def fp8_decode_path(dev, quick: bool = True, fallback_main: int = 0) -> dict[str, Any]:
    """Kernel hit rate of a decode-shaped step whose main GEMMs run in FP8 and whose output
    head is dequantized to bf16 (the seed's mixed path), from torch.profiler.

    ``fallback_main``: how many of the main GEMMs take the dequantized bf16 path instead (a
    changed runtime path: what a build without the FP8 kernel for a shape does), for showing a
    runtime-class deviation on the same machine.

    A GEMM call is an FP8 *hit* when an FP8 GEMM kernel ran, a *fallback* when a plain
    bf16/fp32 GEMM ran on weights stored in FP8 (after a dequant copy); the kernel classes are
    :mod:`hwlab.core.profiling`'s one table.
    """
    gpu = dev.type == "cuda"
    M, d, vocab = (16, 4096, 32768) if gpu else (16, 256, 1024)
    f8 = torch.float8_e4m3fn
    one = torch.ones((), device=dev)
    w_main = [(torch.randn(d, d, device=dev) * 0.05).to(f8) for _ in range(4)]
    w_head = (torch.randn(vocab, d, device=dev) * 0.05).to(f8)
    act_dt = torch.bfloat16

    def step(x):
        for i, w in enumerate(w_main):
            if i < fallback_main:
                x = x @ w.to(act_dt).t()
            else:
                x = torch._scaled_mm(x.to(f8), w.t(), scale_a=one, scale_b=one, out_dtype=act_dt)
        return x @ w_head.to(act_dt).t()  # dequantized head: the fallback

    x = torch.randn(M, d, device=dev).to(act_dt)
    step(x)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with quiet_profile(activities=acts) as prof:
        step(x)
        if gpu:
            torch.cuda.synchronize()
    return hit_rate_from_events(profiler_events(prof), gpu)


# ---------------------------------------------------------------- record
def record(quick: bool = False, progress: Callable[[str], None] | None = None) -> Evidence:
    """Measure every baseline part on this machine; parts that cannot run say why."""
    dev = device_of(None)
    gpu = dev.type == "cuda"

    def step(msg):
        if progress:
            progress(msg)

    results: list[Measurement] = []
    missing: dict[str, str] = {}

    def attempt(name: str, fn):
        step(name)
        try:
            return fn()
        except Exception as e:  # recorded as missing: a baseline never dies on one part
            missing[name] = f"{type(e).__name__}: {str(e)[:300]}"
            return None

    snap = system.snapshot()
    cap = topology.capture()
    text = cap.text
    topo = cap.topo.to_dict() if cap.topo else None
    if cap.error:
        missing["topology"] = cap.error
    elif topo is None:
        missing["topology"] = "no nvidia-smi and no NVML on this machine"
    size = 256 if quick else 2048
    for name, fn in [
        ("hbm_copy", lambda: probes.hbm_copy(size_mib=size if gpu else 64, impl="torch")),
        ("host_link", lambda: probes.host_link(size_mib=64 if quick else 256)),
        ("gemm_bf16", lambda: probes.gemm(size=(4096 if quick else 8192) if gpu else 256, dtype="bf16")),
        ("attention", lambda: _sdpa_probe(dev, quick)),
        ("rmsnorm", lambda: _rmsnorm_probe(dev, quick)),
        ("kv_cache_read", lambda: _kv_read_probe(dev, quick)),
        ("launch_overhead", lambda: probes.launch_overhead(n_launches=500 if quick else 2000)),
    ]:
        m = attempt(name, fn)
        if m is not None:
            results.append(m)
    p2p = comms.p2p_matrix_gbps() if gpu else {"skipped": "no GPU"}
    nccl = crosslink.collectives(max(2, torch.cuda.device_count()), nccl=True) if gpu else {"skipped": "no GPU"}
    for k, v in (("p2p", p2p), ("nccl", nccl)):
        if "skipped" in v:
            missing[k] = v["skipped"]
    runtime = attempt("runtime_path", lambda: fp8_decode_path(dev, quick)) or {}
    runtime.update({"default_dtype": str(torch.get_default_dtype()),
                    "float32_matmul_precision": torch.get_float32_matmul_precision()})
    return Evidence(kind=BASELINE_KIND, machine=machine_info(), results=results,
                    versions=snap["versions"], snapshot=snap,
                    extra={"topology": topo, "topology_text": text, "p2p": p2p, "nccl": nccl,
                           "runtime_path": runtime, "missing": missing, "quick": quick,
                           "rank_env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID",
                                                                     "SLURM_NODEID") if os.environ.get(k)}})


def default_path(folder: str | os.PathLike = ".", n: int = 0) -> Path:
    """``baseline-<host>-<UTC time>[-n].json`` in ``folder``: ``n`` > 0 tells apart records written
    in the same second (the writer tries the next ``n`` when a name is taken)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(folder) / f"baseline-{socket.gethostname()}-{stamp}{f'-{n}' if n else ''}.json"


def should_record_on_this_rank() -> bool:
    """Under torchrun/SLURM one process per node records (LOCAL_RANK / SLURM_LOCALID 0)."""
    for k in ("LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(k) not in (None, "", "0"):
            return False
    return True


