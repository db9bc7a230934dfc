"""The measurement protocol every hwlab probe and lab uses.

(Over ~400 lines on purpose: docs/CONTRIBUTING.md asks for the protocol in one module whose docstring explains
every rule, and the checks, the timer, the one percentile and the result type are that protocol;
the CUDA-graph helper lives beside it in :mod:`hwlab.core.measure_graph`.)

Why each rule exists (read this before you trust a number):

* **Correct first.** A kernel is run once on fresh random inputs and compared with a
  reference by ``||out - ref|| / ||ref||`` computed in float64, *before* it is timed.
  A fast wrong kernel is not a result. Tolerances (``TOL_BY_DTYPE``) follow the usual
  rounding of each dtype: fp32 far under 1e-4, tf32 ~3e-4, fp16/bf16 between 1e-3 and
  1e-2, fp8 a few 1e-2. NaN never passes.
* **Never time zeros.** Zeros hide unwritten outputs and wrong indexing, and some units
  run faster on them (tensor cores draw less power on zeros, so a GEMM on zeros outruns the
  same GEMM on real data; the size of the gap is in the recorded evidence). Inputs with no
  spread are refused (:func:`refuse_constant_inputs`).
* **Warm up, then measure the sustained state.** The first calls pay for module load, JIT
  compilation, autotuning and handle creation; ``n_warmup`` calls run untimed, and on a GPU
  warm-up continues for ``GPU_WARMUP_S`` and timing for at least ``GPU_MIN_RUN_S``: a cold
  card's first 50 ms run at boost clocks that a power-limited workload never sees. The warm-up
  clock starts after the first call, so a compile cannot use up the warm-up and leave an idle
  card to be timed cold.
* **Time on the device.** GPU work is asynchronous: a host clock around a launch
  measures the launch, not the kernel. On CUDA each repetition is bracketed by
  ``torch.cuda.Event`` pairs and read after one final synchronise; on CPU the matching
  timer is ``time.perf_counter`` around a call that has finished when it returns.
* **Rotate buffers past the L2.** Re-running on one small buffer measures the cache,
  not DRAM. :func:`n_rotating_sets` picks enough independent input sets that the
  working set of one pass over them is at least ``ROTATE_PAST_L2`` times the L2 size
  (default 2x), so every repetition reads from DRAM.
* **Median and spread.** Timings have a long right tail (clock ramp, other tenants,
  interrupts); the median is robust to it, and p10..p90 shows the spread (:func:`quantile`, the
  kit's one percentile definition: linear interpolation between order statistics). Two versions
  whose medians differ by less than their spread are not different.
* **Hardware units.** A time alone says nothing. Every :class:`Measurement` carries
  the bytes it had to move and the FLOPs it had to do, and reports GB/s, TFLOP/s and
  percent of a ceiling that *this machine measured* (see :mod:`hwlab.core.ceilings`).

* **Know when the GPU is shared.** Another process's kernels on the same GPU take SMs and
  bandwidth: two learners measuring at once each see about half the copy ceiling. A live GPU
  measurement reads NVML's compute processes, utilisation and MIG mode before and during timing
  (:mod:`hwlab.core.gpu_share`); another process marks it SHARED (``Measurement.gpu_share``), and
  every figure shown from it says so.

Bytes are counted as the minimum traffic: each input read once, each output written
once (the "required" bytes); a lab that knows the traffic of an unfused chain reports
that separately as bytes moved.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

# torch is imported inside the functions that touch tensors, so the result type, the percentile and
# the errors load without it (commands that only read records start fast and run without torch)

#: relative-error tolerances by compute dtype, for ||out-ref||/||ref|| against float64
TOL_BY_DTYPE = {
    "float64": 1e-10,
    "float32": 1e-5,
    "tf32": 3e-3,
    "float16": 5e-3,
    "bfloat16": 2e-2,
    "float8_e4m3fn": 8e-2,
}

#: how many times the L2 size one pass over the rotating input sets must cover
ROTATE_PAST_L2 = 2.0
#: never keep more than this many rotating sets (memory grows with each)
MAX_ROTATING_SETS = 16
#: GPU warm-up (s) before timing: long enough for clocks and power draw to settle
GPU_WARMUP_S = 0.5
#: minimum length (s) of the timed phase on a GPU, so the median is the sustained rate
GPU_MIN_RUN_S = 0.5


class CorrectnessError(AssertionError):
    """A kernel's output disagrees with its reference: it is not timed."""


class InputError(ValueError):
    """Inputs unfit for timing (constant, zeros, wrong device)."""


class InsufficientMemoryError(MemoryError):
    """A requested size does not fit in the memory free on the device."""


def device_of(device: str | torch.device | None = None) -> torch.device:
    """The device to measure on: the given one, else CUDA when present, else CPU."""
    import torch
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def device_name(device: torch.device) -> str:
    import torch
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def free_bytes(device: torch.device) -> int:
    """Free memory on ``device`` in bytes (CUDA: driver's view; CPU: available RAM)."""
    import torch
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def require_memory(n_bytes: int, device: torch.device, what: str = "this probe",
                   headroom: float = 0.9) -> None:
    """Raise :class:`InsufficientMemoryError` before allocating if ``n_bytes`` would not fit.

    ``headroom`` (0.9) leaves 10% for the allocator, the CUDA context and the reference.
    """
    avail = free_bytes(device)
    if n_bytes > headroom * avail:
        raise InsufficientMemoryError(
            f"{what} needs {n_bytes / 2**30:.2f} GiB but only {avail / 2**30:.2f} GiB is free on "
            f"{device}; choose a smaller size (nothing was allocated)."
        )


def synchronize(device: torch.device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def refuse_constant_inputs(tensors: Sequence[Any]) -> None:
    """Raise :class:`InputError` if any floating input is constant (e.g. all zeros)."""
    import torch
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1:
            sample = t.flatten()[: 1 << 16].float()
            if torch.all(sample == sample[0]):
                raise InputError(
                    f"input {i} is constant ({sample[0].item()!r}); timing constant data hides "
                    "unwritten outputs and can run faster than real data. Use random inputs."
                )


#: elements per chunk when :func:`rel_error` works on a GPU: three float64 temporaries of this many
#: elements (384 MiB) at a time, whatever the tensors' size
REL_ERROR_CHUNK = 1 << 24


def rel_error_chunked(out: torch.Tensor, ref: torch.Tensor, chunk: int = REL_ERROR_CHUNK) -> float:
    """:func:`rel_error` where the tensors are (same shape, same device), ``chunk`` elements at a
    time in float64; one host sync at the end."""
    import torch
    o, r = out.detach().reshape(-1), ref.detach().reshape(-1)
    diff2 = torch.zeros((), dtype=torch.float64, device=o.device)
    ref2 = torch.zeros((), dtype=torch.float64, device=o.device)
    finite = torch.ones((), dtype=torch.bool, device=o.device)
    for i in range(0, o.numel(), chunk):
        oc, rc = o[i:i + chunk].to(torch.float64), r[i:i + chunk].to(torch.float64)
        finite &= torch.isfinite(oc).all()
        diff2 += (oc - rc).square().sum()
        ref2 += rc.square().sum()
    if not bool(finite):
        return math.inf
    return math.sqrt(diff2.item()) / (math.sqrt(ref2.item()) or 1.0)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN/inf anywhere in ``out`` gives ``inf``.

    Summed where both tensors are (:func:`rel_error_chunked`: a multi-GiB output on a GPU is
    reduced there in milliseconds, where a copy to the host and its CPU take seconds); on the
    CPU when they are on different devices."""
    if out.shape != ref.shape:
        raise CorrectnessError(f"shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    if out.device != ref.device:
        out, ref = out.detach().cpu(), ref.detach().cpu()
    return rel_error_chunked(out, ref)


def check_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "output") -> float:
    """Return the relative error, or raise :class:`CorrectnessError` if it exceeds ``tol``."""
    err = rel_error(out, ref)
    if not err <= tol:
        raise CorrectnessError(f"{what}: relative error {err:.3g} exceeds tolerance {tol:.1g}")
    return err


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (or the int max) so unwritten elements are caught."""
    import torch
    if t.is_floating_point():
        return t.fill_(float("nan"))
    return t.fill_(torch.iinfo(t.dtype).max)


def n_rotating_sets(bytes_per_set: int, l2_bytes: int | None,
                    factor: float = ROTATE_PAST_L2, max_sets: int = MAX_ROTATING_SETS) -> int:
    """How many independent input sets to cycle through so each repetition misses in L2.

    One set when the data already exceeds ``factor`` x L2 (or L2 is unknown, as on CPUs
    whose caches we do not model); otherwise ``ceil(factor * L2 / bytes_per_set)`` capped at
    ``max_sets``.
    """
    if not l2_bytes or bytes_per_set <= 0 or bytes_per_set >= factor * l2_bytes:
        return 1
    return max(1, min(max_sets, math.ceil(factor * l2_bytes / bytes_per_set)))


def l2_bytes_of(device: torch.device) -> int | None:
    import torch
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    return None


def last_level_cache_bytes(device: torch.device) -> int | None:
    """The cache a working set is judged against: a GPU's L2 (device properties); on a CPU the
    largest data or unified cache Linux reports for CPU 0 (``/sys/devices/system/cpu/cpu0/cache``,
    the LLC, shared by the cores that run the ops). None where it cannot be read."""
    if device.type == "cuda":
        return l2_bytes_of(device)
    sizes = []
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return max(sizes) if sizes else None


def quantile(values: Sequence[float], q: float, weights: Sequence[int] | None = None,
             method: str = "linear") -> float | None:
    """The kit's one percentile definition: the ``q`` quantile (0..1) of ``values``, each counted
    ``weights[i]`` times (whole counts, e.g. tokens a step served; default 1). None for no samples.

    ``method="linear"`` (the default, numpy's default): sort the samples (repeats expanded) and
    interpolate linearly at position ``q * (n - 1)``, so p10..p90 of a few samples moves smoothly.
    ``method="nearest"``: the nearest-rank sample (the ``ceil(q * n)``-th, at least the first),
    always one of the samples; kept for records made with it (Lab 4's serving stream).
    """
    if method not in ("linear", "nearest"):
        raise ValueError(f"quantile method {method!r}: use 'linear' or 'nearest'")
    w = [1] * len(values) if weights is None else list(weights)
    if len(w) != len(values):
        raise ValueError(f"{len(values)} values but {len(w)} weights")
    pairs = sorted((v, int(n)) for v, n in zip(values, w) if n > 0)
    total = sum(n for _, n in pairs)
    if not total:
        return None
    if method == "nearest":
        idx = max(1, math.ceil(q * total)) - 1
        frac = 0.0
    else:
        pos = q * (total - 1)
        idx = int(math.floor(pos))
        frac = pos - idx

    def at(i: int) -> float:  # the i-th sample (0-based) of the expanded, sorted samples
        seen = 0
        for v, n in pairs:
            seen += n
            if seen > i:
                return v
        return pairs[-1][0]

    lo = at(idx)
    if frac == 0.0:
        return lo
    return lo + (at(min(idx + 1, total - 1)) - lo) * frac


@dataclass
class Timing:
    """Per-repetition times of one measured callable."""

    samples_ms: list[float]
    timer: str  # "cuda-event", "cpu-perf-counter" or "cpu-perf-counter net of run-queue wait"
    n_warmup: int
    #: CPU timed net of the run-queue wait (:mod:`hwlab.core.hostwait`): each sample's wall time
    #: and the wait taken out of it; None where the samples are the wall clock's or the device's
    wall_ms: list[float] | None = None
    wait_ms: list[float] | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the samples, by the kit's one definition (:func:`quantile`)."""
        return quantile(self.samples_ms, q)

    @property
    def p10_ms(self) -> float:
        return self.quantile_ms(0.10)

    @property
    def p90_ms(self) -> float:
        return self.quantile_ms(0.90)

    @property
    def spread_pct(self) -> float:
        """(p90 - p10) / median, in percent."""
        m = self.median_ms
        return 100.0 * (self.p90_ms - self.p10_ms) / m if m > 0 else math.inf


def time_fn(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]],
            device: torch.device, n_warmup: int = 5, n_rep: int = 50,
            max_total_s: float = 30.0, warmup_s: float | None = None,
            min_run_s: float | None = None, net_of_wait: bool = False) -> Timing:
    """Time ``fn(*arg_sets[i % len(arg_sets)])`` at least ``n_rep`` times after warm-up.

    Warm-up is ``n_warmup`` calls and, on a GPU, at least ``warmup_s`` seconds
    (default :data:`GPU_WARMUP_S`): clocks and power settle only after sustained load, and a
    burst measured from a cold, idle card reads faster than the same kernel in a real
    workload (boost clocks hold for tens of ms, then the power limit pulls them down; the
    recorded ``probe_vs_torch_burst`` and ``probe_vs_torch`` runs show the two rates).
    The timed phase then lasts at least ``min_run_s`` (default :data:`GPU_MIN_RUN_S` on
    GPU, 0 on CPU), so the median describes the sustained state.

    CUDA: one event pair per repetition, read after a single synchronise at the end.
    CPU: ``perf_counter`` around each call; with ``net_of_wait`` each sample is net of the
    calling thread's run-queue wait across the call (:mod:`hwlab.core.hostwait`: a busy host's
    time, not the work's), the wall times kept beside. ``max_total_s`` stops early (keeping at
    least 3 samples) so a slow configuration in a sweep cannot hang a lab.
    """
    import torch
    if not arg_sets:
        raise InputError("time_fn needs at least one argument set")
    gpu = device.type == "cuda"
    warmup_s = (GPU_WARMUP_S if gpu else 0.0) if warmup_s is None else warmup_s
    min_run_s = (GPU_MIN_RUN_S if gpu else 0.0) if min_run_s is None else min_run_s
    n_sets = len(arg_sets)
    # the first call pays for compilation and autotuning: keep it off the warm-up clock, or a
    # compile longer than the warm-up leaves the card idle and the kernel is timed cold after
    # only n_warmup calls (and the per-call estimate, inflated by the compile, cuts the timed phase)
    t_first = time.perf_counter()
    fn(*arg_sets[0])
    synchronize(device)
    first_s = time.perf_counter() - t_first
    t0 = time.perf_counter()
    i = 1
    while i < n_warmup or time.perf_counter() - t0 < warmup_s:
        fn(*arg_sets[i % n_sets])
        i += 1
        if gpu and i % 8 == 0:
            synchronize(device)  # keep the host honest about elapsed GPU time
        if time.perf_counter() - t0 > max_total_s:
            break
    synchronize(device)
    # per call from the warm-up; with none (n_warmup=1, warmup_s=0: a function already warm) from the
    # first call, which was synchronised: the time to enqueue nothing is not a call's time, and a
    # minimum run sized by it would fill the whole time budget
    per_call_s = max((time.perf_counter() - t0) / (i - 1) if i > 1 else first_s, 1e-7)
    n = max(n_rep, min(20000, math.ceil(min_run_s / per_call_s)))
    samples: list[float] = []
    t_start = time.perf_counter()
    if gpu:
        events = []
        for i in range(n):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*arg_sets[i % n_sets])
            end.record()
            events.append((start, end))
            if i >= 2 and time.perf_counter() - t_start > max_total_s:
                break
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) for s, e in events]
        timer = "cuda-event"
    else:
        from hwlab.core import hostwait
        net = net_of_wait and hostwait.wait_ns() is not None
        waits: list[float] = []
        for i in range(n):
            args = arg_sets[i % n_sets]
            w0 = hostwait.wait_ns() if net else None
            t1 = time.perf_counter()
            fn(*args)
            samples.append((time.perf_counter() - t1) * 1e3)
            if w0 is not None:
                waits.append(((hostwait.wait_ns() or w0) - w0) / 1e6)
            if i >= 2 and time.perf_counter() - t_start > max_total_s:
                break
        if net:
            wall = samples
            samples = [hostwait.net_ms(s, w) for s, w in zip(wall, waits)]
            return Timing(samples_ms=samples, timer="cpu-perf-counter net of run-queue wait", n_warmup=n_warmup,
                          wall_ms=wall, wait_ms=waits)
        timer = "cpu-perf-counter"
    return Timing(samples_ms=samples, timer=timer, n_warmup=n_warmup)


@dataclass
class Measurement:
    """One measured kernel: its time and the work it had to do, in hardware units.

    ``n_bytes`` is the minimum DRAM traffic (inputs read once, outputs written once);
    ``n_flops`` counts multiply and add separately (a GEMM is ``2*M*N*K``).
    ``ceiling_gbps`` / ``ceiling_tflops`` are what this machine measured (copy bandwidth,
    the matching GEMM rate); ``ceiling_source`` says where they came from.
    """

    name: str
    t_ms: float
    t_p10_ms: float
    t_p90_ms: float
    n_bytes: int
    n_flops: int
    device: str
    timer: str
    n_rep: int
    rel_err: float | None = None
    tol: float | None = None
    ceiling_gbps: float | None = None
    ceiling_tflops: float | None = None
    ceiling_source: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    #: what NVML saw on this GPU before and during timing (:func:`hwlab.core.gpu_share.judge`);
    #: None where NVML was not read (a CPU, no driver)
    gpu_share: dict[str, Any] | None = None

    @property
    def gbps(self) -> float:
        return self.n_bytes / (self.t_ms * 1e-3) / 1e9 if self.t_ms > 0 else math.nan

    @property
    def tflops(self) -> float:
        return self.n_flops / (self.t_ms * 1e-3) / 1e12 if self.t_ms > 0 else math.nan

    @property
    def arithmetic_intensity(self) -> float:
        """FLOP per byte of required traffic."""
        return self.n_flops / self.n_bytes if self.n_bytes else math.inf

    @property
    def pct_of_bw_ceiling(self) -> float | None:
        return 100.0 * self.gbps / self.ceiling_gbps if self.ceiling_gbps else None

    @property
    def pct_of_flops_ceiling(self) -> float | None:
        return 100.0 * self.tflops / self.ceiling_tflops if self.ceiling_tflops else None

    @property
    def spread_pct(self) -> float:
        return 100.0 * (self.t_p90_ms - self.t_p10_ms) / self.t_ms if self.t_ms > 0 else math.inf

    def with_ceilings(self, gbps: float | None = None, tflops: float | None = None,
                      source: str = "") -> "Measurement":
        return dataclasses.replace(self, ceiling_gbps=gbps, ceiling_tflops=tflops,
                                   ceiling_source=source)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["derived"] = {
            "gbps": self.gbps, "tflops": self.tflops,
            "pct_of_bw_ceiling": self.pct_of_bw_ceiling,
            "pct_of_flops_ceiling": self.pct_of_flops_ceiling,
            "arithmetic_intensity": self.arithmetic_intensity,
            "spread_pct": self.spread_pct,
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"name", "t_ms", "n_bytes", "n_flops"} - d.keys()
        if missing:
            raise ValueError(f"measurement record lacks {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def summary(self) -> str:
        n = self.params.get("n_launches")
        if isinstance(self.params.get("us_per_launch"), (int, float)) and isinstance(n, int) and n > 0:
            # launches timed as one batch: the headline is one launch, the batch's time named as such
            us = self.params["us_per_launch"]
            parts = [f"{self.name}: {us:.3g} us per launch (p10-p90 {self.t_p10_ms * 1e3 / n:.3g}-"
                     f"{self.t_p90_ms * 1e3 / n:.3g} us; {n:,} launches timed together, {self.t_ms:.4g} ms "
                     "per batch)"]
        else:
            parts = [f"{self.name}: {self.t_ms:.4g} ms (p10-p90 {self.t_p10_ms:.4g}-{self.t_p90_ms:.4g})"]
        if self.n_bytes:
            s = f"{self.gbps:,.1f} GB/s"
            if self.pct_of_bw_ceiling is not None:
                s += f" = {self.pct_of_bw_ceiling:.0f}% of {self.ceiling_gbps:,.0f} GB/s measured"
            parts.append(s)
        if self.n_flops:
            s = f"{_rate(self.tflops)} TFLOP/s"
            if self.pct_of_flops_ceiling is not None:
                s += f" = {self.pct_of_flops_ceiling:.0f}% of {_rate(self.ceiling_tflops)} measured"
            parts.append(s)
        parts.append(f"[{self.device}, {self.timer}]")
        if self.gpu_share and self.gpu_share.get("shared"):
            from hwlab.core.gpu_share import note
            parts.append(note(self.gpu_share))
        return ", ".join(parts)

    __str__ = summary


def _rate(v: float) -> str:
    """A rate with its significant digits: a CPU's fraction of a TFLOP/s must not print as 0.0."""
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3g}"


def bench(name: str, fn: Callable[..., Any], make_inputs: Callable[[], Sequence[Any]], *,
          n_bytes: int, n_flops: int = 0, reference: Callable[..., Any] | None = None,
          tol: float | None = None, device: torch.device | None = None,
          n_warmup: int = 5, n_rep: int = 50, rotate: bool = True,
          params: dict[str, Any] | None = None, max_total_s: float = 30.0,
          net_of_wait: bool = False) -> Measurement:
    """Check ``fn`` against ``reference`` on fresh random inputs, then time it.

    ``make_inputs()`` must return a *new random* argument tuple on every call: it is called
    once for the correctness check and once per rotating set. ``reference`` (optional only
    for pure data movement whose correctness the caller checks) returns what ``fn`` should.
    """
    import torch
    dev = device_of(device)
    check_args = tuple(make_inputs())
    refuse_constant_inputs(check_args)
    rel = None
    if reference is not None:
        if tol is None:
            raise ValueError("a reference needs a tolerance (see measure.TOL_BY_DTYPE)")
        out = fn(*check_args)
        synchronize(dev)
        rel = check_close(out, reference(*check_args), tol, what=name)
        del out
    bytes_per_set = sum(t.numel() * t.element_size() for t in check_args
                        if isinstance(t, torch.Tensor))
    n_sets = n_rotating_sets(bytes_per_set, l2_bytes_of(dev)) if rotate else 1
    arg_sets = [check_args] + [tuple(make_inputs()) for _ in range(n_sets - 1)]
    share = None
    if dev.type == "cuda":  # NVML before, during and after the timing: shared or not (module doc)
        from hwlab.core import gpu_share
        with gpu_share.Watch(dev.index if dev.index is not None else torch.cuda.current_device()) as w:
            timing = time_fn(fn, arg_sets, dev, n_warmup=n_warmup, n_rep=n_rep, max_total_s=max_total_s)
        share = w.result
    else:  # net_of_wait: a CPU's timing net of the run-queue wait (time_fn)
        timing = time_fn(fn, arg_sets, dev, n_warmup=n_warmup, n_rep=n_rep, max_total_s=max_total_s,
                         net_of_wait=net_of_wait)
    p = dict(params or {})
    p["n_rotating_sets"] = n_sets
    return Measurement(name=name, t_ms=timing.median_ms, t_p10_ms=timing.p10_ms,
                       t_p90_ms=timing.p90_ms, n_bytes=int(n_bytes), n_flops=int(n_flops),
                       device=device_name(dev), timer=timing.timer, n_rep=len(timing.samples_ms),
                       rel_err=rel, tol=tol, params=p, gpu_share=share)


def spread_of(values: Sequence[float], what: str) -> dict[str, Any] | None:
    """A measured spread for the flowchart's borderline check (``metric_spreads``):
    ``{"lo", "hi", "what"}``, the p10-p90 of ``values`` by :func:`quantile`, or their range for
    fewer than five (a p10 of three values is their minimum anyway); None for fewer than two
    values: one value has no spread, and none is invented."""
    vals = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if len(vals) < 2:
        return None
    if len(vals) < 5:
        return {"lo": vals[0], "hi": vals[-1], "what": f"range of {len(vals)} {what}", "n": len(vals)}
    return {"lo": quantile(vals, 0.1), "hi": quantile(vals, 0.9), "what": f"p10-p90 over {len(vals)} {what}",
            "n": len(vals)}
