"""Basic probes: HBM copy, host<->device link, GEMM per dtype, kernel-launch overhead.

Each returns a :class:`~hwlab.core.measure.Measurement` that knows its bytes and FLOPs. On a
CPU they measure the CPU (host memory copy, CPU GEMM, op dispatch) and say so in
``device``; they never pretend to be GPU figures.

Byte counts: a copy of N bytes reads N and writes N, so ``n_bytes = 2N`` (nvbandwidth
counts N once; we count what the DRAM really carries). A host->device copy of N bytes
moves N over the link, ``n_bytes = N``. A GEMM ``(M,K)@(K,N)`` does ``2MNK`` FLOPs and
needs at least ``(MK + KN + MN) * itemsize`` bytes.

What a user may pass to each probe from the command line is listed in :data:`PARAMS`
(name, type, default, allowed range or choices, meaning); :func:`parse_params` checks
``KEY=VALUE`` strings against it and refuses anything else in one line, before any tensor
is allocated. Ranges are what the probe can mean, not what fits: a size that is allowed but
does not fit in this device's free memory is refused by ``require_memory``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# torch is imported inside each probe: `hwlab --help` lists PARAMS without paying for it
from hwlab.errors import UserInputError
from hwlab.core.measure import (
    TOL_BY_DTYPE, InputError, Measurement, bench, device_name, device_of, poison_, require_memory,
    synchronize, time_fn)

PROBES: dict[str, Callable[..., Measurement]] = {}


def _probe(fn: Callable[..., Measurement]) -> Callable[..., Measurement]:
    PROBES[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------- parameter schema
@dataclass(frozen=True)
class Param:
    """One command-line parameter of a probe: its type, range or choices, and meaning."""
    name: str
    type: type
    default: Any
    help: str
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] | None = None

    def describe(self) -> str:
        if self.choices:
            allowed = "one of " + ", ".join(self.choices)
        elif self.type is bool:
            allowed = "true or false"
        else:
            allowed = f"integer {self.lo}..{self.hi}"
        default = "auto" if self.default is None else str(self.default).lower() if self.type is bool \
            else self.default
        return f"{self.name}={allowed} (default {default}): {self.help}"

    def parse(self, probe: str, raw: str) -> Any:
        bad = f"probe {probe}: {self.name}={raw!r} is not allowed; {self.name} takes "
        if self.choices:
            if raw not in self.choices:
                raise UserInputError(bad + "one of " + ", ".join(self.choices))
            return raw
        if self.type is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise UserInputError(bad + "true or false")
            return raw.lower() in ("true", "1", "yes")
        try:
            v = int(raw)
        except ValueError:
            raise UserInputError(bad + f"an integer {self.lo}..{self.hi}") from None
        if not (self.lo <= v <= self.hi):
            raise UserInputError(bad + f"an integer {self.lo}..{self.hi}")
        return v


#: sizes up to 1 TiB / 2^20 elements per side: beyond what any GPU holds, so the limit never
#: hides a real machine; the free-memory check refuses what this machine cannot hold
_MIB_MAX = 1 << 20
_DIM_MAX = 1 << 20
PARAMS: dict[str, tuple[Param, ...]] = {
    "hbm_copy": (
        Param("size_mib", int, 1024, "MiB of fp32 copied (read once, written once)", 1, _MIB_MAX),
        Param("impl", str, "auto", "the copy kernel: hwlab's Triton kernel or torch copy_",
              choices=("auto", "triton", "torch")),
        Param("n_rep", int, 50, "timed repetitions", 1, 10_000),
    ),
    "host_link": (
        Param("size_mib", int, 256, "MiB moved over the host link", 1, _MIB_MAX),
        Param("direction", str, "h2d", "host to device or device to host", choices=("h2d", "d2h")),
        Param("pinned", bool, True, "page-locked host memory (false: pageable)"),
        Param("n_rep", int, 20, "timed repetitions", 1, 10_000),
    ),
    "gemm": (
        Param("size", int, None, "M = N = K (default 8192 on a GPU, 512 on a CPU)", 1, _DIM_MAX),
        Param("dtype", str, "bf16", "input type (fp32 turns TF32 off, tf32 on)", choices=(
            "fp32", "tf32", "bf16", "fp16", "fp8")),
        Param("m", int, None, "rows of A (overrides size)", 1, _DIM_MAX),
        Param("n", int, None, "columns of B (overrides size)", 1, _DIM_MAX),
        Param("k", int, None, "the reduction dimension (overrides size)", 1, _DIM_MAX),
        Param("n_rep", int, 30, "timed repetitions", 1, 10_000),
    ),
    "launch_overhead": (
        Param("n_launches", int, 2000, "back-to-back launches per timed repetition", 1, 1_000_000),
        Param("n_rep", int, 10, "timed repetitions", 1, 10_000),
    ),
}


def parse_params(probe: str, pairs: list[str]) -> dict[str, Any]:
    """``["size=64", "dtype=fp32"]`` -> keyword arguments for ``PROBES[probe]``, checked
    against :data:`PARAMS`; anything else raises :class:`UserInputError` (one line)."""
    if probe not in PARAMS:
        raise UserInputError(f"unknown probe {probe!r}; choose one of: {', '.join(PARAMS)}")
    schema = {p.name: p for p in PARAMS[probe]}
    kwargs: dict[str, Any] = {}
    for kv in pairs:
        key, sep, raw = kv.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserInputError(f"probe {probe}: parameters are KEY=VALUE, got {kv!r}")
        if key not in schema:
            raise UserInputError(f"probe {probe} has no parameter {key!r}; it takes: "
                                 f"{', '.join(schema)} (see hwlab probe {probe} --help)")
        if key in kwargs:
            raise UserInputError(f"probe {probe}: {key} given twice")
        kwargs[key] = schema[key].parse(probe, raw.strip())
    return kwargs


# ---------------------------------------------------------------- device copy
_COPY_KERNEL = None


def _triton_copy():
    """hwlab's streaming copy kernel, autotuned over block size / warps on first use."""
    global _COPY_KERNEL
    import torch
    if _COPY_KERNEL is not None:
        return _COPY_KERNEL
    from hwlab.core import tritonenv  # noqa: F401
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    if tritonenv.INTERPRETED:  # no autotuner without a GPU driver: one small block
        def run(src: torch.Tensor, dst: torch.Tensor):
            n = src.numel()
            copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
            return dst
    else:
        tuned = triton.autotune(
            configs=[triton.Config({"BLOCK": b}, num_warps=w)
                     for b, w in ((4096, 8), (8192, 8), (8192, 16), (16384, 16))],
            key=["n"])(copy_kernel)

        def run(src: torch.Tensor, dst: torch.Tensor):
            n = src.numel()
            tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](src, dst, n)
            return dst

    _COPY_KERNEL = run
    return run


@_probe
def hbm_copy(size_mib: int = 1024, device=None, impl: str = "auto", n_rep: int = 50,
             net_of_wait: bool = False) -> Measurement:
    """Device-memory bandwidth: copy ``size_mib`` MiB of fp32, counting read + write.

    ``impl``: 'triton' (hwlab's own streaming kernel; default on GPU) or 'torch'
    (``Tensor.copy_``; default on CPU, where the Triton interpreter is no speed reference).
    ``net_of_wait``: on a CPU, timed net of the run-queue wait (:mod:`hwlab.core.hostwait`).
    """
    import torch
    dev = device_of(device)
    n = size_mib * 2**20 // 4
    if n <= 0:
        raise InputError(f"size_mib must be positive, got {size_mib}")
    require_memory(3 * n * 4, dev, f"hbm_copy of {size_mib} MiB")
    if impl == "auto":
        impl = "triton" if dev.type == "cuda" else "torch"
    if impl == "triton":
        kern = _triton_copy()
        fn = lambda s, d: kern(s, d)  # noqa: E731
    elif impl == "torch":
        fn = lambda s, d: d.copy_(s)  # noqa: E731
    else:
        raise ValueError(f"impl must be 'triton', 'torch' or 'auto', not {impl!r}")

    def make():
        return torch.randn(n, device=dev), poison_(torch.empty(n, device=dev))

    return bench(f"hbm_copy[{impl}]", fn, make, n_bytes=2 * n * 4,
                 reference=lambda s, d: s, tol=0.0, device=dev, n_rep=n_rep,
                 params={"size_mib": size_mib, "impl": impl, "dtype": "float32"}, net_of_wait=net_of_wait)


# ---------------------------------------------------------------- host link
@_probe
def host_link(size_mib: int = 256, direction: str = "h2d", pinned: bool = True,
              device=None, n_rep: int = 20) -> Measurement:
    """Host<->device copy bandwidth over PCIe/C2C (``direction`` 'h2d' or 'd2h').

    Pageable memory goes through a driver staging buffer and is typically 2-4x slower
    than pinned. On a CPU machine there is no device link: the probe copies between two
    host buffers and names itself ``host_memcpy`` so nobody reads it as PCIe.
    """
    import torch
    dev = device_of(device)
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be 'h2d' or 'd2h', not {direction!r}")
    n = size_mib * 2**20 // 4
    if n <= 0:
        raise InputError(f"size_mib must be positive, got {size_mib}")
    require_memory(2 * n * 4, torch.device("cpu"), f"host_link of {size_mib} MiB (host side)")
    if dev.type != "cuda":
        def make():
            return torch.randn(n), poison_(torch.empty(n))
        return bench("host_memcpy[cpu]", lambda s, d: d.copy_(s), make, n_bytes=n * 4,
                     reference=lambda s, d: s, tol=0.0, device=dev, n_rep=n_rep, rotate=False,
                     params={"size_mib": size_mib, "note": "no GPU: host-to-host copy"})
    require_memory(n * 4, dev, f"host_link of {size_mib} MiB (device side)")

    def host(t):
        return t.pin_memory() if pinned else t

    if direction == "h2d":
        def make():
            return host(torch.randn(n)), poison_(torch.empty(n, device=dev))
    else:
        def make():
            return torch.randn(n, device=dev), host(poison_(torch.empty(n)))
    kind = "pinned" if pinned else "pageable"
    return bench(f"host_link[{direction},{kind}]", lambda s, d: d.copy_(s, non_blocking=pinned),
                 make, n_bytes=n * 4, reference=lambda s, d: s, tol=0.0, device=dev,
                 n_rep=n_rep, rotate=False,
                 params={"size_mib": size_mib, "direction": direction, "memory": kind})


# ---------------------------------------------------------------- GEMM
GEMM_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp64")


def fp8_supported(device: torch.device) -> bool:
    """FP8 tensor cores: compute capability >= 8.9 (Ada, Hopper, Blackwell); CPU emulates."""
    import torch
    if device.type != "cuda":
        return hasattr(torch, "float8_e4m3fn")
    return torch.cuda.get_device_capability(device) >= (8, 9)


def matmul_at(dtype: str, M: int, N: int, K: int, dev) -> tuple[Callable, Callable]:
    """``(fn, make)`` for an MxK @ KxN matmul at ``dtype`` (fp32, tf32, bf16, fp16): ``make``
    draws fresh random operands, ``fn`` multiplies them with torch's float32 matmul precision
    set for the call only ("high" = TF32 for tf32, "highest" otherwise), so one probe's setting
    never leaks into the next measurement."""
    import torch
    tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16, "fp64": torch.float64}[dtype]
    precision = "high" if dtype == "tf32" else "highest"

    def make():
        return (torch.randn(M, K, device=dev).to(tdt), torch.randn(K, N, device=dev).to(tdt))

    def fn(a, b):
        prev = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            return a @ b
        finally:
            torch.set_float32_matmul_precision(prev)
    return fn, make


@_probe
def gemm(size: int | None = None, dtype: str = "bf16", device=None, n_rep: int = 30,
         m: int | None = None, n: int | None = None, k: int | None = None,
         net_of_wait: bool = False) -> Measurement:
    """Dense ``(M,K) @ (K,N)`` through torch (cuBLAS on GPU), checked against float64.

    ``fp32`` disables TF32 for the call; ``tf32`` enables it; ``fp8`` is e4m3 inputs with
    unit scales through ``torch._scaled_mm`` (bf16 output). Default size: 8192 on a GPU
    (fills an H100/H200), 512 on a CPU. ``net_of_wait``: on a CPU, timed net of the run-queue
    wait (:mod:`hwlab.core.hostwait`).
    """
    import torch
    dev = device_of(device)
    if dtype not in GEMM_DTYPES:
        raise ValueError(f"dtype must be one of {GEMM_DTYPES}, not {dtype!r}")
    if dtype == "fp8" and not fp8_supported(dev):
        raise InputError(f"{device_name(dev)} has no FP8 tensor cores (needs sm_89+)")
    size = size or (8192 if dev.type == "cuda" else 512)
    M, N, K = m or size, n or size, k or size
    tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16, "fp8": torch.float8_e4m3fn, "fp64": torch.float64}[dtype]
    item = torch.tensor([], dtype=tdt).element_size()
    require_memory((M * K + K * N) * item + M * N * 2 * max(item, 2) + M * N * 8, dev,
                   f"gemm {M}x{N}x{K} {dtype}")

    if dtype == "fp8":
        one = torch.ones((), device=dev, dtype=torch.float32)

        def make():
            a = (torch.randn(M, K, device=dev) * 0.5).to(tdt)
            b = (torch.randn(N, K, device=dev) * 0.5).to(tdt).t()  # column-major B
            return a, b

        def fn(a, b):
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        tol = TOL_BY_DTYPE["bfloat16"]
    else:
        fn, make = matmul_at(dtype, M, N, K, dev)
        tol = {"fp32": TOL_BY_DTYPE["float32"] * 10, "tf32": TOL_BY_DTYPE["tf32"],
               "bf16": TOL_BY_DTYPE["bfloat16"], "fp16": TOL_BY_DTYPE["float16"],
               "fp64": TOL_BY_DTYPE["float64"] * 10}[dtype]

    def reference(a, b):
        return (a.double() @ b.double())

    out_item = 2 if dtype in ("bf16", "fp16", "fp8") else 8 if dtype == "fp64" else 4
    n_bytes = (M * K + K * N) * item + M * N * out_item
    return bench(f"gemm[{dtype}]", fn, make, n_bytes=n_bytes, n_flops=2 * M * N * K,
                 reference=reference, tol=tol, device=dev, n_rep=n_rep,
                 params={"m": M, "n": N, "k": K, "dtype": dtype}, net_of_wait=net_of_wait)


# ---------------------------------------------------------------- launch overhead
@_probe
def launch_overhead(n_launches: int = 2000, device=None, n_rep: int = 10) -> Measurement:
    """Cost of one tiny kernel launch, in microseconds (``params['us_per_launch']``).

    Times ``n_launches`` back-to-back in-place adds on a 1-element tensor: the GPU work is
    negligible, so the time per launch is the launch path (Python -> ATen dispatch ->
    driver). On CPU it is the dispatch overhead of one ATen op. The measured median
    ``t_ms`` covers the whole batch.
    """
    import torch
    dev = device_of(device)
    if n_launches < 1:
        raise InputError("n_launches must be >= 1")
    x = torch.randn(1, device=dev)

    def step(t):
        for _ in range(n_launches):
            t.add_(1.0)
        return t

    timing = time_fn(step, [(x,)], dev, n_warmup=2, n_rep=n_rep)
    synchronize(dev)
    us = timing.median_ms * 1e3 / n_launches
    return Measurement(name="launch_overhead", t_ms=timing.median_ms, t_p10_ms=timing.p10_ms,
                       t_p90_ms=timing.p90_ms, n_bytes=0, n_flops=0, device=device_name(dev),
                       timer=timing.timer, n_rep=len(timing.samples_ms),
                       params={"n_launches": n_launches, "us_per_launch": us})
