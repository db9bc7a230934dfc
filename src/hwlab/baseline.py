"""Node health baselines: record what a machine looks like when it is healthy, then compare.

A baseline holds the seed's five parts: **topology** (nvidia-smi topo -m, GPU ordinals, NUMA),
**bandwidth** (HBM copy, host link, P2P and NCCL where there are several GPUs), **kernel
probes** (GEMM, attention via SDPA, RMSNorm, KV-cache read), **system state** (NVML) and the
**runtime path** (dtypes, FP8 kernel hit rate and fallback rate of a decode-shaped step).
A part that cannot run here is recorded as missing with the reason, never fatal.

:func:`compare` classifies every deviation of a new record from a baseline into
``hardware`` / ``topology`` / ``runtime`` / ``workload`` with the tolerance that flagged it and
what to check next. Tolerances (why):

* bandwidth and TFLOP/s probes: a drop of more than ``TOL_RATE_PCT`` (10%) — run-to-run
  spread of these probes on one card is 1-3%, machines of one kind differ by up to ~5%;
* latency-type probes (launch overhead): a rise of more than ``TOL_LATENCY_PCT`` (100%) — they
  measure the host's Python/driver launch path, which moved between 8.0 and 14.5 us per launch
  across this kit's runs on one H200 VM on 2026-12-02 (a shared host CPU); only a doubling is a
  signal there;
* temperature more than ``TOL_TEMP_C`` (10 C) hotter, any new throttle reason, any increase
  of uncorrected ECC errors or pending row remaps: hardware;
* any change of GPU count, link class, PCIe width/generation or NUMA affinity: topology;
* any change of driver, CUDA, torch, triton or NCCL version, or of FP8 hit / fallback rate by
  more than ``TOL_HIT_PP`` (5 percentage points): runtime.

The workload class has no probe of its own: when every part matches and the service is still
slow, the difference is in the workload (shape buckets, caches, fallbacks); compare says so.

Before any of that, :func:`comparability` decides whether the two records can be compared at
all: a different GPU model, GPU count, driver or CUDA major version, or different probe sizes
and parameters (a ``--quick`` record against a full one) make every figure differ for reasons
that say nothing about the node's health. Such a pair is its own class, *not comparable*: the
differences are listed, and no deviation or node advice ("drain and swap") is given. Minor
driver/CUDA versions stay comparable and are reported as runtime deviations.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from .errors import UserInputError
from .evidence import Evidence, load, machine_info
from .measure import Measurement, device_of

TOL_RATE_PCT = 10.0
TOL_LATENCY_PCT = 100.0
TOL_TEMP_C = 10.0
TOL_HIT_PP = 5.0
BASELINE_KIND = "baseline"


# ---------------------------------------------------------------- kernel probes
def _sdpa_probe(dev, quick: bool) -> Measurement:
    from .measure import TOL_BY_DTYPE, bench

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
    from .measure import TOL_BY_DTYPE, bench

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
    from .measure import TOL_BY_DTYPE, bench

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
def fp8_decode_path(dev, quick: bool = True) -> dict[str, Any]:
    """Kernel hit rate of a decode-shaped step whose main GEMMs run in FP8 and whose output
    head is dequantized to bf16 (the seed's mixed path), from torch.profiler.

    A GEMM call is an FP8 *hit* when its kernel (GPU: name containing 'qqtst' / 'fp8' /
    'e4m3'; CPU: the op ``aten::_scaled_mm``) ran; a *fallback* when a plain bf16/fp32 GEMM ran
    on weights stored in FP8 (after a dequant copy).
    """
    from torch.profiler import ProfilerActivity, profile

    gpu = dev.type == "cuda"
    M, d, vocab = (16, 4096, 32768) if gpu else (16, 256, 1024)
    f8 = torch.float8_e4m3fn
    one = torch.ones((), device=dev)
    w_main = [(torch.randn(d, d, device=dev) * 0.05).to(f8) for _ in range(4)]
    w_head = (torch.randn(vocab, d, device=dev) * 0.05).to(f8)
    act_dt = torch.bfloat16

    def step(x):
        for w in w_main:
            x = torch._scaled_mm(x.to(f8), w.t(), scale_a=one, scale_b=one, out_dtype=act_dt)
        return x @ w_head.to(act_dt).t()  # dequantized head: the fallback

    x = torch.randn(M, d, device=dev).to(act_dt)
    step(x)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        step(x)
        if gpu:
            torch.cuda.synchronize()
    return hit_rate_from_events(profiler_events(prof), gpu)


CPU_GEMM_OPS = ("aten::_scaled_mm", "aten::mm", "aten::addmm", "aten::bmm")


def inside_op(e, names) -> bool:
    """Whether a profiler event runs inside (below) an op or range named in ``names``."""
    p = getattr(e, "cpu_parent", None)
    while p is not None:
        if p.name in names:
            return True
        p = getattr(p, "cpu_parent", None)
    return False


def profiler_events(prof) -> list[tuple[str, str]]:
    """(name, device type) of every event a ``torch.profiler`` run recorded, leaving out ops
    nested inside a GEMM op (on a CPU ``aten::_scaled_mm`` calls ``aten::mm`` itself: one call)."""
    return [(e.name, e.device_type.name if hasattr(e.device_type, "name") else str(e.device_type))
            for e in prof.events() if not inside_op(e, CPU_GEMM_OPS)]


FP8_KERNEL_MARKERS = ("qqtst", "fp8", "e4m3", "f8f8")
GEMM_KERNEL_MARKERS = ("gemm", "nvjet", "cutlass", "sm90_xmma", "ampere_bf16", "cublas")
#: kernels that match a GEMM marker but are not a GEMM call (cuBLAS split-K reductions)
NOT_GEMM_MARKERS = ("splitkreduce", "reduce_kernel")


def hit_rate_from_events(events: list[tuple[str, str]], gpu: bool) -> dict[str, Any]:
    """FP8 hit rate and dequant count from (name, device) profiler events."""
    if gpu:
        # the kit's record_function ranges are mirrored onto the GPU timeline: not kernels
        kernels = [n for n, dt in events if "CUDA" in dt and not n.startswith("hwlab::")]
        gemms = [n for n in kernels if any(m in n.lower() for m in GEMM_KERNEL_MARKERS + FP8_KERNEL_MARKERS)
                 and not any(x in n.lower() for x in NOT_GEMM_MARKERS)]
        hits = [n for n in gemms if any(m in n.lower() for m in FP8_KERNEL_MARKERS)]
        dequant = [n for n in kernels if "copy_kernel" in n or "_dequant_rows_kernel" in n]
    else:
        ops = [n for n, _ in events]
        gemms = [n for n in ops if n in CPU_GEMM_OPS]
        hits = [n for n in gemms if n == "aten::_scaled_mm"]
        dequant = [n for n in ops if n == "aten::_to_copy"]
    n = len(gemms)
    names: dict[str, int] = {}
    for g in gemms:  # what was classified, kept in the evidence so the classification can be checked
        names[g[:160]] = names.get(g[:160], 0) + 1
    return {"gemm_calls": n, "fp8_hits": len(hits), "hit_rate_pct": 100.0 * len(hits) / n if n else None,
            "fallback_rate_pct": 100.0 * (n - len(hits)) / n if n else None,
            "dequant_copies": len(dequant), "gemm_names": names,
            "source": "torch.profiler kernel names" if gpu else "torch.profiler aten ops"}


# ---------------------------------------------------------------- record
def record(quick: bool = False, progress: Callable[[str], None] | None = None) -> Evidence:
    """Measure every baseline part on this machine; parts that cannot run say why."""
    from . import probes, system, topology
    from .labs import crosslink

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
    text = topology.capture_topo_text()
    topo = None
    if text:
        try:
            topo = topology.parse_topo_matrix(text, "nvidia-smi topo -m").to_dict()
        except topology.TopologyParseError as e:
            missing["topology"] = str(e)
    if topo is None:
        t = topology.from_nvml()
        topo = t.to_dict() if t else None
        if topo is None:
            missing.setdefault("topology", "no nvidia-smi and no NVML on this machine")
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
    p2p = crosslink.p2p_matrix_gbps() if gpu else {"skipped": "no GPU"}
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


def default_path(folder: str | os.PathLike = ".") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(folder) / f"baseline-{socket.gethostname()}-{stamp}.json"


def should_record_on_this_rank() -> bool:
    """Under torchrun/SLURM one process per node records (LOCAL_RANK / SLURM_LOCALID 0)."""
    for k in ("LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(k) not in (None, "", "0"):
            return False
    return True


# ---------------------------------------------------------------- compare
@dataclass
class Deviation:
    category: str  # hardware | topology | runtime | workload | missing
    what: str
    baseline: Any
    now: Any
    rule: str
    next_step: str

    def __str__(self) -> str:
        return f"[{self.category}] {self.what}: {self.baseline} -> {self.now} ({self.rule}); next: {self.next_step}"


@dataclass
class Comparison:
    deviations: list[Deviation] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    #: why the two records cannot be compared (empty: comparable); see :func:`comparability`
    not_comparable: list[str] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not self.not_comparable

    @property
    def ok(self) -> bool:
        return self.comparable and not [d for d in self.deviations if d.category != "missing"]

    def categories(self) -> set[str]:
        return {d.category for d in self.deviations}

    @property
    def verdict(self) -> str:
        if not self.comparable:
            return "not comparable"
        return "ok" if self.ok else ",".join(sorted(self.categories() - {"missing"}))

    def summary(self) -> str:
        if not self.comparable:
            return ("NOT COMPARABLE: " + "; ".join(self.not_comparable) + ". No node advice: compare "
                    "a record with a baseline of the same GPU model and count, driver/CUDA major "
                    "and probe sizes (record both with or both without --quick).")
        if self.ok:
            return ("matches the baseline within tolerance (" + ", ".join(self.checked) + "). If the service "
                    "is still slow, the difference is in the workload: shape buckets, caches, fallbacks.")
        return "\n".join(str(d) for d in self.deviations)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "comparable": self.comparable, "ok": self.ok,
                "not_comparable": self.not_comparable, "checked": self.checked,
                "deviations": [d.__dict__ for d in self.deviations]}


#: params a probe reports that are results, not settings (left out of the comparability check)
MEASURED_PARAMS = {"us_per_launch"}


def _major(version: Any) -> str | None:
    if version in (None, ""):
        return None
    return str(version).split(".")[0]


def _gpu_count(ev: Evidence) -> int | None:
    if ev.snapshot is not None and isinstance(ev.snapshot.get("gpus"), list):
        return len(ev.snapshot["gpus"])
    return None


def comparability(base: Evidence, now: Evidence) -> list[str]:
    """What makes ``now`` not comparable with ``base``, one phrase each (empty: comparable).

    Checked: GPU model (the record's device name), GPU count (NVML), driver major version, CUDA
    runtime and driver-API major version, and for every probe both ran, its sizes and
    parameters (``params`` minus :data:`MEASURED_PARAMS`)."""
    why: list[str] = []
    if base.device != now.device:
        why.append(f"GPU model differs: {base.device} vs {now.device}")
    n0, n1 = _gpu_count(base), _gpu_count(now)
    if n0 != n1:
        why.append(f"GPU count differs: {n0} vs {n1} (if a GPU vanished from this node, that is "
                   "the finding: check `nvidia-smi -L` and the kernel log for Xid errors)")
    for key, what in (("driver", "driver major version"), ("cuda_runtime", "CUDA runtime major version")):
        a, b = _major(base.versions.get(key)), _major(now.versions.get(key))
        if a != b:
            why.append(f"{what} differs: {base.versions.get(key)} vs {now.versions.get(key)}")
    a, b = base.versions.get("cuda_driver"), now.versions.get("cuda_driver")
    if isinstance(a, int) and isinstance(b, int) and a // 1000 != b // 1000:
        why.append(f"CUDA driver API major version differs: {a // 1000} vs {b // 1000}")
    bm = {m.name: m for m in base.results}
    for m in now.results:
        if m.name not in bm:
            continue
        p0 = {k: v for k, v in bm[m.name].params.items() if k not in MEASURED_PARAMS}
        p1 = {k: v for k, v in m.params.items() if k not in MEASURED_PARAMS}
        if p0 != p1:
            diff = ", ".join(f"{k} {p0.get(k)} vs {p1.get(k)}" for k in sorted(set(p0) | set(p1), key=str)
                             if p0.get(k) != p1.get(k))
            why.append(f"probe {m.name} ran with other parameters: {diff}")
    return why


LATENCY_PROBES = {"launch_overhead"}
NEXT = {
    "hardware": "check clocks/throttle reasons, ECC and temperature in `hwlab doctor`; drain and swap the node if it persists",
    "topology": "diff `nvidia-smi topo -m` and the rank-to-device map; rebuild TP groups with hwlab.mapping",
    "runtime": "diff versions and the dispatch path (profiler kernel names); pin the known-good stack",
}


def _probe_value(m: Measurement) -> tuple[float, str]:
    if m.name in LATENCY_PROBES:
        return m.params.get("us_per_launch", m.t_ms), "us"
    if m.n_flops and m.n_flops / max(m.n_bytes, 1) > 50:
        return m.tflops, "TFLOP/s"
    return m.gbps, "GB/s"


def compare(base: Evidence, now: Evidence) -> Comparison:
    """Classify what changed between a baseline and a new record (see the module doc)."""
    c = Comparison()
    for ev in (base, now):
        if ev.kind != BASELINE_KIND:
            raise UserInputError(f"{ev.path or 'a record'} is a {ev.kind!r} record: compare takes two "
                                 "baseline records (hwlab baseline record)")
    c.not_comparable = comparability(base, now)
    if c.not_comparable:  # no deviations, no advice: the figures differ for other reasons
        return c
    # hardware: probes
    bm = {m.name: m for m in base.results}
    for m in now.results:
        if m.name not in bm:
            continue
        b, unit = _probe_value(bm[m.name])
        v, _ = _probe_value(m)
        c.checked.append(m.name)
        if m.name in LATENCY_PROBES:
            if v > b * (1 + TOL_LATENCY_PCT / 100):
                c.deviations.append(Deviation("hardware", f"{m.name} ({unit})", round(b, 3), round(v, 3),
                                              f"rise > {TOL_LATENCY_PCT:.0f}%", NEXT["hardware"] + "; check host CPU load and governor"))
        elif v < b * (1 - TOL_RATE_PCT / 100):
            c.deviations.append(Deviation("hardware", f"{m.name} ({unit})", round(b, 1), round(v, 1),
                                          f"drop > {TOL_RATE_PCT:.0f}%", NEXT["hardware"]))
    for name in set(bm) - {m.name for m in now.results}:
        c.deviations.append(Deviation("missing", name, "recorded", "absent", "part not measured now",
                                      now.extra.get("missing", {}).get(name, "re-run hwlab baseline record")))
    # hardware: system state
    bg = (base.snapshot or {}).get("gpus", [])
    ng = (now.snapshot or {}).get("gpus", [])
    for g0, g1 in zip(bg, ng):
        tag = f"GPU{g1.get('index')}"
        t0, t1 = g0.get("temperature_c"), g1.get("temperature_c")
        if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) and t1 > t0 + TOL_TEMP_C:
            c.deviations.append(Deviation("hardware", f"{tag} temperature C", t0, t1, f"> +{TOL_TEMP_C:.0f} C", NEXT["hardware"]))
        from .system import THROTTLE_REASONS
        r0 = set(g0.get("clock_event_reasons") or []) if isinstance(g0.get("clock_event_reasons"), list) else set()
        r1 = set(g1.get("clock_event_reasons") or []) if isinstance(g1.get("clock_event_reasons"), list) else set()
        if (r1 - r0) & THROTTLE_REASONS:
            c.deviations.append(Deviation("hardware", f"{tag} clock event reasons", sorted(r0), sorted(r1),
                                          "new throttle reason", NEXT["hardware"]))
        e0, e1 = g0.get("ecc_errors_volatile"), g1.get("ecc_errors_volatile")
        if isinstance(e0, dict) and isinstance(e1, dict) and e1.get("uncorrected", 0) > e0.get("uncorrected", 0):
            c.deviations.append(Deviation("hardware", f"{tag} uncorrected ECC", e0["uncorrected"], e1["uncorrected"],
                                          "any increase", NEXT["hardware"]))
        for key in ("pcie_gen_max", "pcie_width_max", "numa_node"):
            if g0.get(key) != g1.get(key):
                c.deviations.append(Deviation("topology", f"{tag} {key}", g0.get(key), g1.get(key), "any change", NEXT["topology"]))
        c.checked.append(f"{tag} state")
    if len(bg) != len(ng):
        c.deviations.append(Deviation("topology", "GPU count", len(bg), len(ng), "any change", NEXT["topology"]))
    # topology: links and NUMA
    t0, t1 = base.extra.get("topology") or {}, now.extra.get("topology") or {}
    if t0 and t1:
        c.checked.append("topology")
        for k, v in t0.get("links", {}).items():
            if t1.get("links", {}).get(k) != v:
                c.deviations.append(Deviation("topology", f"link {k}", v, t1.get("links", {}).get(k),
                                              "any change", NEXT["topology"]))
        if t0.get("numa_affinity") != t1.get("numa_affinity"):
            c.deviations.append(Deviation("topology", "NUMA affinity", t0.get("numa_affinity"),
                                          t1.get("numa_affinity"), "any change", NEXT["topology"]))
    # runtime: versions and the FP8 path
    for k in ("driver", "cuda_runtime", "torch", "triton", "nccl"):
        a, b = base.versions.get(k), now.versions.get(k)
        if a != b:
            c.deviations.append(Deviation("runtime", f"{k} version", a, b, "any change", NEXT["runtime"]))
    c.checked.append("versions")
    r0, r1 = base.extra.get("runtime_path") or {}, now.extra.get("runtime_path") or {}
    for k in ("hit_rate_pct", "fallback_rate_pct"):
        a, b = r0.get(k), r1.get(k)
        if a is not None and b is not None and abs(a - b) > TOL_HIT_PP:
            c.deviations.append(Deviation("runtime", f"FP8 {k}", round(a, 1), round(b, 1),
                                          f"change > {TOL_HIT_PP:.0f} pp", NEXT["runtime"]))
    for k in ("default_dtype", "float32_matmul_precision"):
        if r0.get(k) != r1.get(k):
            c.deviations.append(Deviation("runtime", k, r0.get(k), r1.get(k), "any change", NEXT["runtime"]))
    c.checked.append("runtime path")
    return c


def fleet_table(paths: list[str | os.PathLike], base: Evidence | None = None) -> list[dict[str, Any]]:
    """One row per node record: its probes and, against ``base``, its deviation categories."""
    rows = []
    for p in paths:
        ev = load(p)
        row: dict[str, Any] = {"host": ev.machine.get("host"), "device": ev.device, "recorded_at": ev.recorded_at}
        for m in ev.results:
            v, unit = _probe_value(m)
            row[f"{m.name} ({unit})"] = round(v, 2)
        if base is not None:
            cmp_ = compare(base, ev)
            row["verdict"] = cmp_.verdict
            if not cmp_.comparable:
                row["not_comparable"] = cmp_.not_comparable
        rows.append(row)
    return rows
