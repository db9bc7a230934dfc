"""Lab 2, registers / occupancy / spills / launch overhead.

Three reproductions of the flowchart's "launch / occupancy / registers" leaf:

1. **Oversized tile.** A Triton GEMM whose tile (BM x BN x BK), warps and stages are knobs.
   The fp32 accumulator alone takes ``BM*BN / (32*warps)`` registers per thread: 128x128 on
   4 warps is 128 registers, fine; 256x256 on 8 warps is 256, over the 255 a thread may
   hold, so the compiler spills to local memory (DRAM-backed) inside the hot loop.
2. **Over-fusion.** ``softmax(A @ B)`` fused into one kernel needs a whole row of the
   product per program (BN = N): for N = 512 on 4 warps that is 64 x 512 fp32 live values,
   256 per thread, and it spills; split into a GEMM with a sane tile + a softmax kernel, it
   does not.
3. **Launch-bound step.** A decode-like step of many tiny kernels: each launch costs a few
   microseconds of CPU/driver time while the GPU work is shorter, so the GPU idles between
   kernels. Captured once in a CUDA graph, the same kernels replay without the gaps.

Registers and spills are read from the compiled kernel on a GPU (``n_regs``, ``n_spills``,
``metadata.shared``), and on a CPU by compiling for sm_90 without a GPU and reading
``ptxas -v`` (the ptxas bundled with triton 3.8.0 can). Every compile goes through a
subprocess with a time limit (:func:`compile_guarded`): a config that takes too long is
reported and skipped, never hung on.

Flowchart evidence (:func:`config_evidence`, :func:`launch_evidence`) answers every question
from this run: B from the kernel (or step) alone against its floor (cuBLAS bf16 measured in
the same run; the CUDA-graph replay for the launch-bound step); D (``e2e_slowdown``) from the
kernel or step run as one process serves it, back-to-back calls timed as one step, over its
own median x calls (:func:`hwlab.labs.scenarios.one_gpu_service`); K (``rank_tail_pct``,
``n_ranks`` = 1) from that one process's measured steps.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import tritonenv  # noqa: F401  (must precede kernel definitions)
from ..measure import TOL_BY_DTYPE, InputError, Measurement, bench, device_of, time_fn, device_name
from . import scenarios
from .occupancy import HOPPER, Occupancy, occupancy

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

#: default per-config compile limit (s); the H200 took 25 s for one spilling 256x256x128 tile
COMPILE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TileConfig:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int

    @property
    def label(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk} w{self.warps} s{self.stages}"

    @property
    def acc_regs_per_thread(self) -> float:
        """fp32 accumulator registers each thread holds: BM*BN / threads."""
        return self.bm * self.bn / (32 * self.warps)

    @classmethod
    def parse(cls, text: str) -> "TileConfig":
        parts = [int(x) for x in re.split(r"[,x ]+", text.strip())]
        if len(parts) != 5:
            raise ValueError(f"a tile config is BM,BN,BK,WARPS,STAGES, got {text!r}")
        return cls(*parts)


SANE = TileConfig(128, 128, 64, 4, 3)
WIDE = TileConfig(128, 256, 64, 8, 3)
SMALL = TileConfig(64, 64, 32, 4, 3)
SPILL = TileConfig(256, 256, 64, 8, 3)
SPILL_HEAVY = TileConfig(256, 256, 64, 4, 2)
SWEEP = (SANE, WIDE, SMALL, SPILL, SPILL_HEAVY)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C = A @ B with an fp32 accumulator; K must be a multiple of BK (no masks in the loop,
    which would stop the loads from being pipelined)."""
    pid = tl.program_id(0)
    n_pid_n = tl.cdiv(N, BN)
    pid_m = pid // n_pid_n
    pid_n = pid % n_pid_n
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


@triton.jit
def matmul_softmax_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                          stride_bn, stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr):
    """softmax(A @ B, dim=1) in one kernel: the over-fused version. BN must cover all of N."""
    pid_m = tl.program_id(0)
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    acc = acc - tl.max(acc, axis=1)[:, None]
    e = tl.exp(acc)
    p = e / tl.sum(e, axis=1)[:, None]
    cm = pid_m * BM + tl.arange(0, BM)
    tl.store(c_ptr + cm[:, None] * stride_cm + rn[None, :] * stride_cn,
             p.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def wide_block_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """An elementwise kernel; at BLOCK=32768 on one warp its compile runs for minutes."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, tl.exp(x) / tl.sum(tl.exp(x), axis=0), mask=m)


KERNELS = {"matmul": matmul_kernel, "matmul_softmax": matmul_softmax_kernel,
           "wide_block": wide_block_kernel}


def _check_shapes(a, b, cfg: TileConfig):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise InputError(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} do not multiply")
    if a.shape[1] % cfg.bk:
        raise InputError(f"K={a.shape[1]} must be a multiple of BK={cfg.bk} for this kernel")


def matmul(a, b, cfg: TileConfig = SANE, out=None):
    """``a @ b`` with the Triton kernel at tile ``cfg``; returns (c, compiled kernel)."""
    _check_shapes(a, b, cfg)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype) if out is None else out
    grid = (triton.cdiv(M, cfg.bm) * triton.cdiv(N, cfg.bn),)
    k = matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
                            num_warps=cfg.warps, num_stages=cfg.stages)
    return c, k


def matmul_softmax_fused(a, b, bm: int = 64, bk: int = 64, warps: int = 4, stages: int = 2):
    """Over-fused: softmax(a @ b) in one kernel, the whole row of the product in registers."""
    M, K = a.shape
    N = b.shape[1]
    if N & (N - 1):
        raise InputError(f"N={N} must be a power of two (one tile spans the row)")
    cfg = TileConfig(bm, N, bk, warps, stages)
    _check_shapes(a, b, cfg)
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    k = matmul_softmax_kernel[(triton.cdiv(M, bm),)](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), BM=bm, BN=N, BK=bk, num_warps=warps, num_stages=stages)
    return c, k


def matmul_softmax_split(a, b, cfg: TileConfig = SANE):
    """Split: the GEMM at a sane tile, then softmax as its own kernel."""
    c, k = matmul(a, b, cfg)
    return torch.softmax(c.float(), dim=1).to(a.dtype), k


def reference_matmul(a, b):
    return a.double().cpu() @ b.double().cpu()


def reference_matmul_softmax(a, b):
    return torch.softmax(reference_matmul(a, b), dim=1)


# ---------------------------------------------------------------- compile reports
@dataclass
class CompileReport:
    """Resources of one compiled kernel. ``n_spills`` counts 4-byte local-memory slots, as
    Triton's ``kernel.n_spills`` does (static: ptxas stack frame / 4)."""

    kernel: str
    config: str
    n_regs: int | None = None
    n_spills: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    shared_bytes: int | None = None
    compile_s: float | None = None
    source: str = ""  # "runtime (GPU)" | "static ptxas sm_90a" | "skipped: ..."
    skipped: str | None = None

    def occupancy(self, warps: int) -> Occupancy | None:
        if self.n_regs is None or self.shared_bytes is None:
            return None
        return occupancy(self.n_regs, self.shared_bytes, warps, HOPPER)

    def to_dict(self) -> dict:
        return asdict(self)


def runtime_report(kernel_name: str, cfg_label: str, compiled) -> CompileReport:
    """Read registers/spills/shared memory off the object a Triton launch returns (GPU)."""
    return CompileReport(kernel_name, cfg_label, n_regs=int(compiled.n_regs),
                         n_spills=int(compiled.n_spills),
                         shared_bytes=int(compiled.metadata.shared), source="runtime (GPU)")


_PTXAS_RE = {
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "st": re.compile(r"(\d+) bytes spill stores"),
    "ld": re.compile(r"(\d+) bytes spill loads"),
    "regs": re.compile(r"Used (\d+) registers"),
}


def _bundled_tool(name: str) -> str:
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not p.exists():
        raise FileNotFoundError(f"triton {triton.__version__} ships no {name} at {p}")
    return str(p)


def _signature(kernel_name: str, dtype: str):
    ptr = f"*{dtype}"
    if kernel_name == "wide_block":
        return ({"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
    sig = {"a_ptr": ptr, "b_ptr": ptr, "c_ptr": ptr, "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "i32",
           "stride_bn": "constexpr", "stride_cm": "i32", "stride_cn": "constexpr",
           "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    # what Triton's launcher specialises at run time: 16-aligned pointers/sizes, unit strides
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 8, 10)}
    return sig, attrs


def static_report(kernel_name: str, cfg: TileConfig | None = None, dtype: str = "bf16",
                  block: int | None = None, warps: int | None = None) -> CompileReport:
    """Compile for sm_90a without a GPU and read ``ptxas -v`` (in this process; see
    :func:`compile_guarded` for the time-limited version)."""
    fn = KERNELS[kernel_name]
    sig, attrs = _signature(kernel_name, dtype)
    if kernel_name == "wide_block":
        consts = {"BLOCK": block}
        opts = {"num_warps": warps or 1, "num_stages": 1}
        label = f"BLOCK={block} w{warps or 1}"
    else:
        consts = {"BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "stride_ak": 1, "stride_bn": 1,
                  "stride_cn": 1}
        opts = {"num_warps": cfg.warps, "num_stages": cfg.stages}
        label = cfg.label
    g = ptxas_sm90(fn, sig, consts, attrs, opts, label)
    return CompileReport(kernel_name, label, n_regs=g["regs"], n_spills=g["stack"] // 4,
                         spill_store_bytes=g["st"], spill_load_bytes=g["ld"],
                         shared_bytes=g["shared"], compile_s=g["compile_s"],
                         source="static compile for sm_90a, ptxas -v")


def ptxas_sm90(fn, sig: dict, consts: dict, attrs: dict, opts: dict, label: str = "") -> dict:
    """Compile a Triton kernel for sm_90a without a GPU and read ``ptxas -v``: registers,
    stack frame and spill bytes, shared memory, compile seconds. Needs ``TRITON_INTERPRET`` off
    (real, not interpreted, kernels)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t0 = time.time()
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    compile_s = time.time() - t0
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        r = subprocess.run([_bundled_tool("ptxas"), "-v", "--gpu-name", "sm_90a", "-o",
                            str(Path(d) / "k.cubin"), str(ptx)], capture_output=True, text=True)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise RuntimeError(f"ptxas failed on {label}: {log[-500:]}")
    g = {k_: int(m.group(1)) if (m := rx.search(log)) else 0 for k_, rx in _PTXAS_RE.items()}
    return {**g, "shared": int(k.metadata.shared), "compile_s": compile_s}


def compile_guarded(kernel_name: str, cfg: TileConfig | None = None, *, dtype: str = "bf16",
                    block: int | None = None, warps: int | None = None,
                    timeout_s: float = COMPILE_TIMEOUT_S, static: bool = True) -> CompileReport:
    """Compile in a child process with a time limit; a config past it is reported, not hung on.

    ``static=True``: the child compiles for sm_90a and returns the ptxas report (CPU or GPU
    machine). ``static=False`` (GPU): the child compiles for this GPU, filling Triton's on-disk
    cache so that the parent's launch of the same config then loads instantly.
    """
    label = cfg.label if cfg else f"BLOCK={block} w{warps or 1}"
    args = [sys.executable, "-m", "hwlab.labs.registers", "--compile", kernel_name,
            "--dtype", dtype, "--mode", "static" if static else "gpu"]
    args += ["--config", ",".join(map(str, (cfg.bm, cfg.bn, cfg.bk, cfg.warps, cfg.stages)))] if cfg \
        else ["--block", str(block), "--warps", str(warps or 1)]
    t0 = time.time()
    try:
        # the child must build real (not interpreted) kernels to compile them for sm_90a
        env = dict(os.environ, **({"TRITON_INTERPRET": "0"} if static else {}))
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return CompileReport(kernel_name, label, compile_s=time.time() - t0,
                             source="skipped", skipped=f"compile exceeded {timeout_s:.0f} s")
    if r.returncode != 0:
        return CompileReport(kernel_name, label, source="skipped",
                             skipped=f"compile failed: {r.stderr.strip().splitlines()[-1:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return CompileReport(**d)


# ---------------------------------------------------------------- GEMM sweep
@dataclass
class ConfigResult:
    config: TileConfig
    report: CompileReport
    occupancy: dict | None = None
    measurement: Measurement | None = None
    ncu: dict | None = None
    #: the config's GEMM run as a one-process service step (D and K), see :func:`tile_service`
    service: dict | None = None

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "report": self.report.to_dict(),
                "occupancy": self.occupancy,
                "measurement": self.measurement.to_dict() if self.measurement else None,
                "ncu": self.ncu, "service": self.service}


def gemm_dtype(device) -> torch.dtype:
    """bf16 on a GPU; fp16 in the interpreter (bf16 is wrong there)."""
    return torch.bfloat16 if device_of(device).type == "cuda" else torch.float16


def tile_service(cfg: TileConfig, size: int, kernel_ms: float, device=None,
                 n_rep: int = 10) -> dict[str, Any]:
    """The Triton GEMM at ``cfg`` (``size``-cubed) as one process serves it: back-to-back calls
    timed as one step, over ``kernel_ms`` (its own median) x calls; D and K of its walk."""
    dev = device_of(device)
    dt = gemm_dtype(dev)

    def make():
        return (torch.randn(size, size, device=dev, dtype=dt), torch.randn(size, size, device=dev, dtype=dt))
    return scenarios.one_gpu_service(lambda a, b: matmul(a, b, cfg)[0], make, kernel_ms, dev, n_rep=n_rep)


def sweep(configs=SWEEP, size: int | None = None, device=None, n_rep: int = 20,
          timeout_s: float = COMPILE_TIMEOUT_S, ceiling_tflops: float | None = None,
          progress=None, service: bool = True) -> list[ConfigResult]:
    """For each config: compile (guarded), registers/spills/shared, occupancy, and on a GPU the
    time and TFLOP/s against ``ceiling_tflops`` (cuBLAS bf16 measured in the same run) and,
    with ``service``, the one-process service step of :func:`tile_service` (D and K).
    On a CPU, the static report only; correctness runs in the interpreter at a tiny size."""
    dev = device_of(device)
    gpu = dev.type == "cuda"
    size = size or (8192 if gpu else 128)
    dt = gemm_dtype(dev)
    out = []
    for cfg in configs:
        if progress:
            progress(cfg.label)
        rep = compile_guarded("matmul", cfg, timeout_s=timeout_s, static=not gpu)
        res = ConfigResult(cfg, rep)
        if rep.skipped:
            out.append(res)
            continue
        m = None
        if gpu:
            a = torch.randn(size, size, device=dev, dtype=dt)
            b = torch.randn(size, size, device=dev, dtype=dt)
            _, k = matmul(a, b, cfg)
            res.report = runtime_report("matmul", cfg.label, k)
            res.report.compile_s = rep.compile_s
            m = bench(f"triton {cfg.label}", lambda x, y, c=cfg: matmul(x, y, c)[0],
                      lambda: (torch.randn(size, size, device=dev, dtype=dt),
                               torch.randn(size, size, device=dev, dtype=dt)),
                      n_bytes=3 * size * size * 2, n_flops=2 * size**3,
                      reference=lambda x, y: (x.double() @ y.double()),
                      tol=TOL_BY_DTYPE["bfloat16"], device=dev, n_rep=n_rep,
                      params={"config": cfg.label})
            if ceiling_tflops:
                m = m.with_ceilings(tflops=ceiling_tflops, source="cuBLAS bf16 in this run")
            if service:
                res.service = tile_service(cfg, size, m.t_ms, dev)
        occ = res.report.occupancy(cfg.warps)
        res.occupancy = occ.to_dict() if occ else None
        res.measurement = m
        out.append(res)
    return out


def cublas_bf16(size: int = 8192, device=None, n_rep: int = 20) -> Measurement:
    from ..probes import gemm

    return gemm(size=size, dtype="bf16", device=device, n_rep=n_rep)


# ---------------------------------------------------------------- launch-bound step
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
    from ..measure import check_close
    err = check_close(out, ref, TOL_BY_DTYPE["float32"] * 10, "decode step")
    t = time_fn(lambda: decode_like_step(x, weights), [()], dev, n_warmup=5, n_rep=n_rep)
    eager = Measurement("eager step", t.median_ms, t.p10_ms, t.p90_ms, n_bytes=n_k * 2 * hidden * 4,
                        n_flops=n_k * hidden, device=device_name(dev), timer=t.timer,
                        n_rep=len(t.samples_ms), rel_err=err, tol=TOL_BY_DTYPE["float32"] * 10,
                        params={"n_layers": n_layers, "hidden": hidden, "n_kernels": n_k})
    svc = scenarios.one_gpu_service(decode_like_step, lambda: (x, weights), t.median_ms, dev,
                                    n_rep=min(n_rep, 10))
    if dev.type != "cuda":
        return LaunchResult(n_k, eager, None, t.median_ms * 1e3 / n_k, None, None,
                            note="CUDA graphs need a GPU: eager dispatch cost only (CPU)", service=svc)
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            decode_like_step(static_x, weights)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = decode_like_step(static_x, weights)
    g.replay()
    torch.cuda.synchronize()
    check_close(static_out, ref, TOL_BY_DTYPE["float32"] * 10, "graph replay")
    tg = time_fn(g.replay, [()], dev, n_warmup=5, n_rep=n_rep)
    graph = Measurement("graph replay", tg.median_ms, tg.p10_ms, tg.p90_ms, n_bytes=eager.n_bytes,
                        n_flops=eager.n_flops, device=device_name(dev), timer=tg.timer,
                        n_rep=len(tg.samples_ms), params=dict(eager.params))
    idle = max(0.0, 100.0 * (1 - tg.median_ms / t.median_ms))
    return LaunchResult(n_k, eager, graph, t.median_ms * 1e3 / n_k, tg.median_ms * 1e3 / n_k, idle,
                        note="GPU idle share estimated as 1 - t_graph / t_eager", service=svc)


# ---------------------------------------------------------------- child-process entry
def _main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="compile one kernel config (the compile guard's child)")
    p.add_argument("--compile", required=True, choices=list(KERNELS))
    p.add_argument("--config")
    p.add_argument("--block", type=int)
    p.add_argument("--warps", type=int)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--mode", choices=["static", "gpu"], default="static")
    p.add_argument("--ncu-launch", action="store_true", help="launch once in an NVTX range (ncu target)")
    a = p.parse_args(argv)
    cfg = TileConfig.parse(a.config) if a.config else None
    if a.mode == "static":
        rep = static_report(a.compile, cfg, a.dtype, a.block, a.warps)
    else:
        dev = torch.device("cuda")
        t0 = time.time()
        x = torch.randn(256, 256, device=dev, dtype=torch.bfloat16)
        if a.compile == "matmul":
            _, k = matmul(x, x, cfg)
            rep = runtime_report("matmul", cfg.label, k)
        elif a.compile == "matmul_softmax":
            _, k = matmul_softmax_fused(x, torch.randn(256, cfg.bn, device=dev, dtype=torch.bfloat16),
                                        cfg.bm, cfg.bk, cfg.warps, cfg.stages)
            rep = runtime_report("matmul_softmax", cfg.label, k)
        else:
            raise SystemExit("wide_block is compiled statically only")
        rep.compile_s = time.time() - t0
        if a.ncu_launch:
            size = 8192
            A = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
            B = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
            matmul(A, B, cfg)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("hwlab_case")
            matmul(A, B, cfg)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
    print(json.dumps(rep.to_dict()))


if __name__ == "__main__":
    _main()


# ---------------------------------------------------------------- flowchart evidence
def _service_evidence(svc: dict | None) -> dict[str, Any]:
    """D and K of a walk from a one-process service step (nothing when none was measured:
    the walk then stops at D as undecided, never answered by hand)."""
    if not svc:
        return {}
    return {"e2e_slowdown": svc["e2e_slowdown"], "rank_tail_pct": svc["rank_tail_pct"],
            "n_ranks": svc["n_ranks"]}


def config_evidence(r: ConfigResult, copy_gbps: float | None = None) -> dict[str, Any]:
    """Flowchart evidence of one measured GEMM config: slowdown over the floor set by this
    machine's cuBLAS rate, estimated DRAM %, Tensor-Core use as % of cuBLAS, spills, and
    D/K from its service step (:func:`tile_service`)."""
    m = r.measurement
    ev: dict[str, Any] = {"n_spills": r.report.n_spills}
    src = {"n_spills": f"the compiled kernel's spill count ({r.report.source or 'compile report'})"}
    if m is not None and m.ceiling_tflops:
        ev["slowdown_vs_floor"] = m.ceiling_tflops / m.tflops
        ev["tensor_pct_of_peak"] = 100.0 * m.tflops / m.ceiling_tflops
        src["slowdown_vs_floor"] = f"{m.name} alone vs cuBLAS bf16 measured in this run"
        src["tensor_pct_of_peak"] = f"{m.name} TFLOP/s over cuBLAS bf16's in this run"
        if copy_gbps:
            ev["dram_pct_estimated"] = 100.0 * m.gbps / copy_gbps
            src["dram_pct_estimated"] = f"{m.name} required bytes over time, vs the measured copy ceiling"
    if r.service:
        ev.update(_service_evidence(r.service))
        src.update(scenarios.SERVICE_SOURCE)
    ev["metric_sources"] = src
    return ev


def launch_evidence(lr: LaunchResult, copy_gbps: float | None = None) -> dict[str, Any]:
    """Flowchart evidence of the launch-bound step: the graph replay is its floor (B and the
    launch gap need a GPU); D and K from the eager step's service run, on any device."""
    ev: dict[str, Any] = _service_evidence(lr.service)
    src = dict(scenarios.SERVICE_SOURCE) if lr.service else {}
    if lr.graph is not None:
        ev["slowdown_vs_floor"] = lr.eager.t_ms / lr.graph.t_ms
        ev["launch_gap_pct"] = lr.gpu_idle_pct_eager
        src["slowdown_vs_floor"] = "eager step over the same kernels replayed from a CUDA graph, this run"
        src["launch_gap_pct"] = "1 - t_graph / t_eager, both measured in this run"
        if copy_gbps:
            ev["dram_pct_estimated"] = 100.0 * lr.eager.gbps / copy_gbps
            src["dram_pct_estimated"] = "eager step's bytes over time, vs the measured copy ceiling"
    if ev:
        ev["metric_sources"] = src
    return ev


def grade_config(cfg: TileConfig | None, reason: str | None, min_pct_of_cublas: float = 70.0,
                 timeout_s: float = COMPILE_TIMEOUT_S, device=None):
    """Exercise 02's checker: the learner's config must compile without spills (static report on
    a CPU, the launched kernel on a GPU), come with a reason, and on a GPU reach
    ``min_pct_of_cublas`` % of cuBLAS bf16 measured in the same run."""
    from ..exercise import ExerciseResult, not_done

    name = "spill-free tile"
    if cfg is None or not reason:
        return not_done(name, "Set MY_CONFIG to a TileConfig and MY_REASON to one sentence.")
    gpu = device_of(device).type == "cuda"
    cublas = cublas_bf16(device=device).tflops if gpu else None
    r = sweep([cfg], ceiling_tflops=cublas, timeout_s=timeout_s, device=device, service=False)[0]
    if r.report.skipped:
        return ExerciseResult(name, "wrong", f"{cfg.label} did not compile: {r.report.skipped}")
    if r.report.n_spills:
        return ExerciseResult(name, "wrong", f"{cfg.label} still spills {r.report.n_spills} slots "
                              f"({r.report.n_regs} registers): accumulator alone is "
                              f"{cfg.acc_regs_per_thread:.0f} registers/thread.")
    if not gpu:
        return ExerciseResult(name, "passed (correctness only)",
                              f"{cfg.label}: {r.report.n_regs} registers, no spills, occupancy "
                              f"{r.occupancy['blocks_per_sm']} block(s)/SM bound by "
                              f"{r.occupancy['binding']} (static sm_90a report); speed is graded on a GPU.")
    pct = r.measurement.pct_of_flops_ceiling or 0.0
    if pct < min_pct_of_cublas:
        return ExerciseResult(name, "too slow", f"{cfg.label}: no spills but {pct:.0f}% of cuBLAS "
                              f"({r.measurement.tflops:,.0f} of {cublas:,.0f} TFLOP/s); band starts at "
                              f"{min_pct_of_cublas:.0f}%. Bigger tiles reuse more, up to the register limit.",
                              r.measurement)
    return ExerciseResult(name, "passed", f"{cfg.label}: no spills, {pct:.0f}% of cuBLAS measured "
                          f"in this run (band >= {min_pct_of_cublas:.0f}%).", r.measurement)
